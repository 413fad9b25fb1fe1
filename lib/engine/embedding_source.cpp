#include "engine/embedding_source.hpp"

#include <atomic>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/hash.hpp"

namespace dynemb {

void EmbeddingSource::row_columns(int table, uint64_t g, int64_t c0, int64_t n, float* out) const {
  std::vector<float> whole(static_cast<size_t>(c0 + n));
  row(table, g, whole.data(), c0 + n);
  for (int64_t c = 0; c < n; ++c) out[c] = whole[static_cast<size_t>(c0 + c)];
}

EmbeddingSource::TableRows EmbeddingSource::table_rows(int table) const {
  TableRows t;
  if (const std::optional<uint64_t> seed = oracle_seed())
    t.oracle_table_seed = oracle_table_seed(*seed, static_cast<uint64_t>(table));
  return t;
}

EmbeddingSource::EmbeddingSource() {
  static std::atomic<uint64_t> next{1};
  uid_ = next.fetch_add(1);
}

OracleSource::OracleSource(uint64_t seed, const Plan& plan) : seed_(seed) {
  for (size_t t = 0; t < plan.tables.size(); ++t) table_seed_.push_back(oracle_table_seed(seed, t));
}

namespace {

// Columns [c0, c0 + n) of the oracle row whose row hash is h: fmix64(h + c) per column
// (docs/capture-format.md). Replays and synth spend most of their arithmetic here (every id of
// a lookup and of the unsharded reference, D columns each). The loop is 64-bit multiplies and
// shifts per element, which the compiler vectorizes only when it may use AVX2 or AVX-512: it
// is compiled for those too and the CPU's best is picked when the program loads. Integer math,
// then a small integer over 64: every clone gives the same bits.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void oracle_columns(uint64_t h, int64_t c0, int64_t n, float* out) {
  for (int64_t c = 0; c < n; ++c) {
    const uint64_t k = fmix64(h + static_cast<uint64_t>(c0 + c));
    out[c] = static_cast<float>(static_cast<int>((k >> 56) & 0xff) - 128) / 64.0f;
  }
}

}  // namespace

void OracleSource::row(int table, uint64_t g, float* out, int64_t dim) const {
  // h = fmix64(h_t ^ g) once per row, then fmix64(h + c) per column.
  oracle_columns(fmix64(table_seed_[static_cast<size_t>(table)] ^ g), 0, dim, out);
}

void OracleSource::row_columns(int table, uint64_t g, int64_t c0, int64_t n, float* out) const {
  oracle_columns(fmix64(table_seed_[static_cast<size_t>(table)] ^ g), c0, n, out);
}

DenseSource::DenseSource(const Plan& plan, std::vector<std::optional<std::vector<float>>> weights,
                         std::shared_ptr<const EmbeddingSource> fallback)
    : weights_(std::move(weights)), fallback_(std::move(fallback)) {
  weights_.resize(plan.tables.size());
  for (size_t t = 0; t < plan.tables.size(); ++t) {
    const TableConfig& tc = plan.tables[t];
    rows_.push_back(tc.num_embeddings);
    dims_.push_back(tc.embedding_dim);
    if (weights_[t] &&
        static_cast<int64_t>(weights_[t]->size()) != tc.num_embeddings * tc.embedding_dim)
      throw Error("dense weights of table " + tc.name + ": " + std::to_string(weights_[t]->size()) +
                  " values, want num_embeddings*embedding_dim = " +
                  std::to_string(tc.num_embeddings * tc.embedding_dim));
    if (!weights_[t] && !fallback_)
      throw Error("table " + tc.name + " has neither dense weights nor an oracle");
  }
}

EmbeddingSource::TableRows DenseSource::table_rows(int table) const {
  const auto& w = weights_[static_cast<size_t>(table)];
  if (!w) return fallback_->table_rows(table);
  TableRows t;
  t.weights = &*w;
  t.weights_owner = uid();
  t.stride = dims_[static_cast<size_t>(table)];
  return t;
}

void DenseSource::row(int table, uint64_t g, float* out, int64_t dim) const {
  row_columns(table, g, 0, dim, out);
}

void DenseSource::row_columns(int table, uint64_t g, int64_t c0, int64_t n, float* out) const {
  const auto& w = weights_[static_cast<size_t>(table)];
  if (!w) {
    fallback_->row_columns(table, g, c0, n, out);
    return;
  }
  // Rows past the table only come from raw (hash_)roundrobin keys: a lookup with no row.
  if (g >= static_cast<uint64_t>(rows_[table]))
    throw Error("dense weights of table " + std::to_string(table) + " have no row " +
                std::to_string(g) + " (num_embeddings " + std::to_string(rows_[table]) + ")");
  const float* src = w->data() + static_cast<int64_t>(g) * dims_[table] + c0;
  for (int64_t c = 0; c < n; ++c) out[c] = src[c];
}

}  // namespace dynemb
