// A minimal .npy (format 1.0) writer: little-endian int64 vectors, C order, written to a
// temporary name and renamed. What `bench --export` hands to bench/peer_torch.py.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dynemb::bench {

void write_npy_i64(const std::string& path, const std::vector<int64_t>& v);

}  // namespace dynemb::bench
