// SHA-256 (FIPS 180-4), small and dependency-free: the JSON report records the sha256 of the
// plan and capture it was produced from, so a CI log can prove which files were checked.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dynemb {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  std::array<uint8_t, 32> digest();  // finalizes; the object must not be updated after
  std::string hex_digest();          // 64 lowercase hex characters

 private:
  void block(const uint8_t* p);  // one 64-byte block
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_;
  size_t buf_len_ = 0;
  uint64_t total_ = 0;  // bytes hashed so far
};

std::string sha256_hex(const std::string& bytes);
// Streams the file in 1 MiB pieces; throws Error naming the file when it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace dynemb
