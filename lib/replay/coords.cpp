#include "replay/coords.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <memory>

namespace dynemb {

std::string to_string(const Coords& c) {
  std::string s;
  for (const Coord& x : c) {
    if (!s.empty()) s += ", ";
    if (!x.label.empty())
      s += fmt::format("{} {}", x.key, x.label);
    else
      s += fmt::format("{} {}", x.key, x.value);
  }
  return s;
}

KjtIndex::KjtIndex(const Kjt& kjt) {
  const int64_t F = kjt.num_features;
  const int64_t L = static_cast<int64_t>(kjt.lengths.size());
  offsets.assign(static_cast<size_t>(L + 1), 0);
  for (int64_t j = 0; j < L; ++j) offsets[j + 1] = offsets[j] + kjt.lengths[j];
  bag_feature.assign(static_cast<size_t>(L), 0);
  bag_sample.assign(static_cast<size_t>(L), 0);
  if (F <= 0) return;
  if (!kjt.stride_per_feature.empty()) {  // VBE: feature f owns a run of B_f bags
    int64_t j = 0;
    for (int64_t f = 0; f < F && f < int64_t(kjt.stride_per_feature.size()); ++f) {
      for (int64_t b = 0; b < kjt.stride_per_feature[f] && j < L; ++b, ++j) {
        bag_feature[j] = f;
        bag_sample[j] = b;
      }
    }
  } else {
    const int64_t B = L / F;
    for (int64_t j = 0; j < L && B > 0; ++j) {
      bag_feature[j] = j / B;
      bag_sample[j] = j % B;
    }
  }
}

IdPosition KjtIndex::locate(int64_t i) const {
  // The bag j with offsets[j] <= i < offsets[j+1] (skipping empty bags).
  const auto it = std::upper_bound(offsets.begin(), offsets.end(), i);
  const int64_t j = std::max<int64_t>(0, int64_t(it - offsets.begin()) - 1);
  if (j >= int64_t(bag_feature.size())) return {0, 0, i};
  return {bag_feature[j], bag_sample[j], i - offsets[j]};
}

namespace {

std::vector<std::string> feature_names(const Plan& plan) {
  std::vector<std::string> n;
  for (const FeatureInfo& f : plan.features) n.push_back(f.name);
  return n;
}

Coord feature_coord(const std::vector<std::string>& names, int64_t f) {
  return {"feature", f, f >= 0 && f < int64_t(names.size()) ? names[f] : std::string()};
}

// Column c of [.., sum_D] -> (feature, column within it).
std::pair<int64_t, int64_t> column_feature(const Plan& plan, int64_t c) {
  int64_t f = 0;
  for (int64_t k = 0; k < plan.num_features(); ++k) {
    if (plan.features[k].column_offset <= c) f = k;
  }
  return {f, plan.features.empty() ? c : c - plan.features[f].column_offset};
}

}  // namespace

TensorLayout TensorLayout::flat(std::string description) {
  TensorLayout t;
  t.description = std::move(description);
  return t;
}

TensorLayout TensorLayout::matrix(std::string description, int64_t cols) {
  TensorLayout t;
  t.description = std::move(description);
  const int64_t c = std::max<int64_t>(1, cols);
  t.locate = [c](int64_t i) {
    return Coords{{"index", i, ""}, {"row", i / c, ""}, {"col", i % c, ""}};
  };
  return t;
}

TensorLayout TensorLayout::sequence_output(const Plan& plan, const Kjt& kjt) {
  TensorLayout t;
  t.description = "sequence output [N_r, D]";
  const int64_t D = std::max<int64_t>(1, plan.seq_dim());
  auto index = std::make_shared<KjtIndex>(kjt);
  auto names = feature_names(plan);
  t.locate = [D, index, names](int64_t e) {
    const IdPosition p = index->locate(e / D);
    return Coords{feature_coord(names, p.feature),
                  {"sample", p.sample, ""},
                  {"position", p.position, ""},
                  {"column", e % D, ""}};
  };
  return t;
}

TensorLayout TensorLayout::pooled_output(const Plan& plan) {
  TensorLayout t;
  t.description = "pooled output [B_r, sum_D]";
  const int64_t SD = std::max<int64_t>(1, plan.sum_dim);
  auto names = feature_names(plan);
  Plan p = plan;
  t.locate = [SD, names, p](int64_t e) {
    const auto [f, c] = column_feature(p, e % SD);
    return Coords{{"sample", e / SD, ""}, feature_coord(names, f), {"column", c, ""}};
  };
  return t;
}

TensorLayout TensorLayout::pooled_vbe_output(const Plan& plan,
                                             const std::vector<int64_t>& batch_per_feature) {
  TensorLayout t;
  t.description = "pooled VBE output 1-D [f][b][d]";
  auto names = feature_names(plan);
  // Element offset of each feature's [b][d] block.
  std::vector<int64_t> begin{0}, dims;
  for (int64_t f = 0; f < plan.num_features(); ++f) {
    const int64_t B = f < int64_t(batch_per_feature.size()) ? batch_per_feature[f] : 0;
    dims.push_back(std::max<int64_t>(1, plan.features[f].dim));
    begin.push_back(begin.back() + B * plan.features[f].dim);
  }
  t.locate = [names, begin, dims](int64_t e) {
    int64_t f = int64_t(std::upper_bound(begin.begin(), begin.end(), e) - begin.begin()) - 1;
    f = std::clamp<int64_t>(f, 0, std::max<int64_t>(0, int64_t(dims.size()) - 1));
    if (dims.empty()) return Coords{{"index", e, ""}};
    const int64_t off = e - begin[f];
    return Coords{
        feature_coord(names, f), {"sample", off / dims[f], ""}, {"column", off % dims[f], ""}};
  };
  return t;
}

TensorLayout TensorLayout::sequence_local_embs(const Plan& plan,
                                               const std::vector<int64_t>& lengths,
                                               const std::vector<int64_t>& batch_size_per_rank) {
  TensorLayout t;
  t.description = "sequence local_embs [N_local, D]";
  const int64_t D = std::max<int64_t>(1, plan.seq_dim());
  const int64_t F = plan.num_features();
  int64_t sumB = 0;
  std::vector<int64_t> rank_begin{0};
  for (int64_t b : batch_size_per_rank) rank_begin.push_back(sumB += b);
  // Bags in (f, s, b) order: column j of feature f is (source rank s, sample b).
  auto offsets = std::make_shared<std::vector<int64_t>>(1, 0);
  for (int64_t l : lengths) offsets->push_back(offsets->back() + l);
  auto names = feature_names(plan);
  t.locate = [D, F, sumB, rank_begin, offsets, names](int64_t e) {
    const int64_t i = e / D;
    const auto it = std::upper_bound(offsets->begin(), offsets->end(), i);
    const int64_t j = std::max<int64_t>(0, int64_t(it - offsets->begin()) - 1);
    if (sumB <= 0 || F <= 0) return Coords{{"row", i, ""}, {"column", e % D, ""}};
    const int64_t f = j / sumB, col = j % sumB;
    const int64_t s =
        int64_t(std::upper_bound(rank_begin.begin(), rank_begin.end(), col) - rank_begin.begin()) -
        1;
    return Coords{feature_coord(names, f),
                  {"source_rank", s, ""},
                  {"sample", col - rank_begin[s], ""},
                  {"position", i - (*offsets)[j], ""},
                  {"column", e % D, ""}};
  };
  return t;
}

TensorLayout TensorLayout::pooled_local_embs(const Plan& plan,
                                             const std::vector<int64_t>& batch_size_per_rank) {
  TensorLayout t;
  t.description = "pooled local_embs [sum_s B_s, sum_D]";
  const int64_t SD = std::max<int64_t>(1, plan.sum_dim);
  std::vector<int64_t> rank_begin{0};
  for (int64_t b : batch_size_per_rank) rank_begin.push_back(rank_begin.back() + b);
  auto names = feature_names(plan);
  Plan p = plan;
  t.locate = [SD, rank_begin, names, p](int64_t e) {
    const int64_t row = e / SD;
    const int64_t s = std::max<int64_t>(
        0,
        int64_t(std::upper_bound(rank_begin.begin(), rank_begin.end(), row) - rank_begin.begin()) -
            1);
    const auto [f, c] = column_feature(p, e % SD);
    return Coords{{"source_rank", s, ""},
                  {"sample", row - rank_begin[std::min<size_t>(s, rank_begin.size() - 1)], ""},
                  feature_coord(names, f),
                  {"column", c, ""}};
  };
  return t;
}

TensorLayout TensorLayout::pooled_vbe_local_embs(const Plan& plan,
                                                 const std::vector<std::vector<int64_t>>& bsrpf) {
  TensorLayout t;
  t.description = "pooled VBE local_embs 1-D [s][f][b][d]";
  auto names = feature_names(plan);
  struct Block {
    int64_t begin, s, f, dim;
  };
  std::vector<Block> blocks;
  int64_t at = 0;
  for (size_t s = 0; s < bsrpf.size(); ++s) {
    for (int64_t f = 0; f < plan.num_features() && f < int64_t(bsrpf[s].size()); ++f) {
      const int64_t dim = std::max<int64_t>(1, plan.features[f].dim);
      blocks.push_back({at, int64_t(s), f, dim});
      at += bsrpf[s][f] * plan.features[f].dim;
    }
  }
  t.locate = [blocks, names](int64_t e) {
    if (blocks.empty()) return Coords{{"index", e, ""}};
    size_t k = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i].begin <= e) k = i;  // last block starting at or before e (skips empty)
    }
    const Block& b = blocks[k];
    const int64_t off = e - b.begin;
    return Coords{{"source_rank", b.s, ""},
                  feature_coord(names, b.f),
                  {"sample", off / b.dim, ""},
                  {"column", off % b.dim, ""}};
  };
  return t;
}

}  // namespace dynemb
