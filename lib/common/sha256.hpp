// SHA-256 through OpenSSL's libcrypto (EVP, which uses the CPU's SHA instructions): the JSON
// report records the sha256 of the plan and capture it was produced from, so a CI log can
// prove which files were checked.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace dynemb {

class Sha256 {
 public:
  Sha256();  // throws Error when libcrypto cannot start a digest
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t n);
  std::array<uint8_t, 32> digest();  // finalizes; the object must not be updated after
  std::string hex_digest();          // 64 lowercase hex characters

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

std::string sha256_hex(const std::string& bytes);
// Streams the file in 1 MiB pieces; throws Error naming the file when it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace dynemb
