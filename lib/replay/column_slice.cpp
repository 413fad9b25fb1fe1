#include "replay/column_slice.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "common/error.hpp"

namespace dynemb {
namespace {

// Table t of a slice plan reads columns [col0[t], col0[t] + dim) of table table_of[t] of the
// whole source. A device backend may make its rows from the whole table's (table_rows).
class SliceSource final : public EmbeddingSource {
 public:
  SliceSource(std::shared_ptr<const EmbeddingSource> whole, std::vector<int> table_of,
              std::vector<int64_t> col0)
      : whole_(std::move(whole)), table_of_(std::move(table_of)), col0_(std::move(col0)) {}
  void row(int table, uint64_t g, float* out, int64_t dim) const override {
    whole_->row_columns(table_of_[size_t(table)], g, col0_[size_t(table)], dim, out);
  }
  void row_columns(int table, uint64_t g, int64_t c0, int64_t n, float* out) const override {
    whole_->row_columns(table_of_[size_t(table)], g, col0_[size_t(table)] + c0, n, out);
  }
  // The whole table's rows, from the slice's first column on.
  TableRows table_rows(int table) const override {
    TableRows t = whole_->table_rows(table_of_[size_t(table)]);
    t.col0 += col0_[size_t(table)];
    return t;
  }

 private:
  std::shared_ptr<const EmbeddingSource> whole_;
  std::vector<int> table_of_;
  std::vector<int64_t> col0_;
};

}  // namespace

int64_t embedding_columns(const Plan& plan) {
  return plan.module == ModuleKind::sequence ? plan.seq_dim() : plan.sum_dim;
}

ColumnSlice make_column_slice(const Plan& whole, std::shared_ptr<const EmbeddingSource> source,
                              int64_t c0, int64_t c1) {
  ColumnSlice s;
  s.c0 = c0;
  s.c1 = c1;
  s.plan = whole;
  Plan& p = s.plan;
  std::vector<int> table_of;
  std::vector<int64_t> table_col0;
  if (whole.module == ModuleKind::sequence) {
    // Every feature has the common D: each table keeps its place, c0..c1 of its rows.
    for (size_t t = 0; t < p.tables.size(); ++t) {
      p.tables[t].embedding_dim = c1 - c0;
      table_of.push_back(int(t));
      table_col0.push_back(c0);
    }
    for (FeatureInfo& f : p.features) {
      f.dim = c1 - c0;
      f.column_offset = 0;
    }
    s.col0.assign(p.features.size(), c0);
    p.sum_dim = c1 - c0;
  } else {
    // Feature f owns whole columns [off_f, off_f + D_f); its part of the slice is the
    // intersection with [c0, c1), at column a_f - off_f of its rows.
    p.tables.clear();
    int64_t at = 0;
    for (size_t f = 0; f < p.features.size(); ++f) {
      FeatureInfo& fi = p.features[f];
      const int64_t off = fi.column_offset;
      const int64_t a = std::clamp(off, c0, c1), b = std::clamp(off + fi.dim, c0, c1);
      TableConfig tc = whole.tables[size_t(fi.table)];
      tc.embedding_dim = b - a;
      tc.features = {fi.name};
      p.tables.push_back(std::move(tc));
      table_of.push_back(fi.table);
      table_col0.push_back(a - off);
      s.col0.push_back(a - off);
      fi.table = int(f);
      fi.dim = b - a;
      fi.column_offset = at;
      at += b - a;
    }
    p.sum_dim = c1 - c0;
  }
  s.source =
      std::make_shared<SliceSource>(std::move(source), std::move(table_of), std::move(table_col0));
  return s;
}

int64_t SliceLayout::to_whole(int64_t e) const {
  for (const Run& r : runs) {
    if (r.width == 0 || e >= r.slice_begin + r.rows * r.width) continue;
    const int64_t off = e - r.slice_begin;
    return r.whole_begin + (off / r.width) * r.stride + r.col0 + off % r.width;
  }
  return -1;
}

void SliceLayout::gather(const float* whole, float* slice) const {
  for (const Run& r : runs)
    for (int64_t i = 0; i < r.rows; ++i)
      std::copy_n(whole + r.whole_begin + i * r.stride + r.col0, r.width,
                  slice + r.slice_begin + i * r.width);
}

SliceLayout output_slice_layout(const Plan& whole, const ColumnSlice& s, const EmbTensor& t,
                                const Kjt& kjt) {
  SliceLayout l;
  const int64_t C = embedding_columns(whole), w = s.c1 - s.c0;
  if (t.shape.size() != 1) {  // [rows, w] of [rows, C]
    const int64_t rows = t.rows();
    l.runs.push_back({0, rows, w, 0, C, s.c0});
    l.whole_shape = {rows, C};
    l.slice_numel = rows * w;
  } else {  // pooled VBE [f][b][d]: B_{r,f} bags of D_f per feature
    int64_t whole_at = 0;
    for (int64_t f = 0; f < whole.num_features(); ++f) {
      const int64_t B = kjt.batch_size(f), D = whole.features[size_t(f)].dim;
      const int64_t wf = s.plan.features[size_t(f)].dim;
      l.runs.push_back({l.slice_numel, B, wf, whole_at, D, s.col0[size_t(f)]});
      l.slice_numel += B * wf;
      whole_at += B * D;
    }
    l.whole_shape = {whole_at};
  }
  if (l.slice_numel != t.numel())
    throw Error("columns [" + std::to_string(s.c0) + ", " + std::to_string(s.c1) +
                ") of an output: " + std::to_string(t.numel()) + " elements, the layout has " +
                std::to_string(l.slice_numel));
  return l;
}

}  // namespace dynemb
