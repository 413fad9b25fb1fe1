// SHA-256 against the FIPS 180-4 / NIST example vectors, streaming and file variants.
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "common/error.hpp"
#include "common/sha256.hpp"

using namespace dynemb;

TEST_CASE("sha256 of the NIST example messages") {
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(
      sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopq"
                 "klmnopqrlmnopqrsmnopqrstnopqrstu") ==
      "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  CHECK(sha256_hex(std::string(1000000, 'a')) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("sha256 padding edge lengths: 55, 56, 63, 64 bytes") {
  // Reference digests from coreutils sha256sum.
  CHECK(sha256_hex(std::string(55, 'a')) ==
        "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  CHECK(sha256_hex(std::string(56, 'a')) ==
        "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  CHECK(sha256_hex(std::string(63, 'a')) ==
        "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34");
  CHECK(sha256_hex(std::string(64, 'a')) ==
        "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST_CASE("sha256 streaming in uneven pieces equals one shot") {
  std::string msg;
  for (int i = 0; i < 1000; ++i) msg += static_cast<char>((i * 131 + 7) & 0xff);
  const std::string want = sha256_hex(msg);
  for (size_t piece : {1u, 3u, 63u, 64u, 65u, 127u}) {
    Sha256 h;
    for (size_t at = 0; at < msg.size(); at += piece)
      h.update(msg.data() + at, std::min(piece, msg.size() - at));
    CHECK(h.hex_digest() == want);
  }
}

TEST_CASE("sha256_file hashes the bytes of a file and names a missing one") {
  const std::string path = "test_common_sha256.tmp";
  FILE* f = std::fopen(path.c_str(), "wb");
  REQUIRE(f);
  std::fputs("abc", f);
  std::fclose(f);
  CHECK(sha256_file(path) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::remove(path.c_str());
  CHECK_THROWS_WITH_AS(sha256_file("/nonexistent/x.h5"), doctest::Contains("/nonexistent/x.h5"),
                       Error);
}
