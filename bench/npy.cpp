#include "npy.hpp"

#include <fmt/core.h>

#include <filesystem>
#include <fstream>

#include "common/error.hpp"

namespace dynemb::bench {

void write_npy_i64(const std::string& path, const std::vector<int64_t>& v) {
  std::string hdr =
      fmt::format("{{'descr': '<i8', 'fortran_order': False, 'shape': ({},), }}", v.size());
  while ((10 + hdr.size() + 1) % 64 != 0) hdr += ' ';  // header padded to 64 bytes
  hdr += '\n';
  std::ofstream f(path + ".tmp", std::ios::binary);
  const char magic[] = "\x93NUMPY\x01\x00";
  f.write(magic, 8);
  const uint16_t len = static_cast<uint16_t>(hdr.size());
  f.write(reinterpret_cast<const char*>(&len), 2);
  f.write(hdr.data(), static_cast<std::streamsize>(hdr.size()));
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(8 * v.size()));
  if (!f) throw Error("bench --export: cannot write " + path);
  f.close();
  std::filesystem::rename(path + ".tmp", path);
}

}  // namespace dynemb::bench
