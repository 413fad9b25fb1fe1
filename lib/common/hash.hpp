// fmix64 (MurmurHash3 finalizer) and the hash64 embedding oracle of capture-format.md.
#pragma once

#include <cstdint>

namespace dynemb {

// MurmurHash3 64-bit finalizer; DynamicEmb's hash_roundrobin routes by fmix64(x) % W.
constexpr uint64_t fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

// Per-table oracle state: h_t = fmix64(S + golden * (t + 1)).
constexpr uint64_t oracle_table_seed(uint64_t seed, uint64_t table_index) {
  return fmix64(seed + 0x9e3779b97f4a7c15ULL * (table_index + 1));
}

// Value of row g (global row, or raw key for (hash_)roundrobin), column c: a multiple of
// 1/64 in [-2, 1.984375], exact in fp32/fp16/bf16.
constexpr float oracle_value(uint64_t table_seed, uint64_t g, uint64_t c) {
  uint64_t h = fmix64(table_seed ^ g);
  h = fmix64(h + c);
  return static_cast<float>(static_cast<int>((h >> 56) & 0xff) - 128) / 64.0f;
}

}  // namespace dynemb
