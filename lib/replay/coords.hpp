// Coordinates of a flat element index in a tensor's own terms, for mismatch reports:
//   sequence output [N_r, D]          -> feature, sample, position, column   (rank's own KJT)
//   pooled output   [B_r, sum_D]      -> sample, feature, column (within the feature)
//   pooled VBE output 1-D [f][b][d]   -> feature, sample, column
//   sequence local_embs [N_local, D]  -> feature, source_rank, sample, position, column
//   pooled local_embs [sum_s B_s, sum_D] -> source_rank, sample, feature, column
//   pooled VBE local_embs 1-D [s][f][b][d] -> source_rank, feature, sample, column
//   context vectors                   -> index (and row, col for 2-D fields)
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/types.hpp"
#include "plan/plan.hpp"

namespace dynemb {

// One coordinate: key ("feature", "sample", ...), its integer value and, for features, the
// feature name.
struct Coord {
  std::string key;
  int64_t value = 0;
  std::string label;  // feature name, else empty
};
using Coords = std::vector<Coord>;

// "feature f1, sample 3, position 2, column 5"
std::string to_string(const Coords& c);

// Maps a flat element index (row-major) to coordinates. Cheap to copy; owns what it needs.
struct TensorLayout {
  std::string description;  // e.g. "sequence output [N_r, D]"
  std::function<Coords(int64_t)> locate;

  Coords operator()(int64_t flat) const {
    return locate ? locate(flat) : Coords{{"index", flat, ""}};
  }

  static TensorLayout flat(std::string description);
  // [rows, cols] as (row, col) plus the flat index (2-D context fields).
  static TensorLayout matrix(std::string description, int64_t cols);
  // Rank r's output dist result; `kjt` is the rank's own KJT before the input dist.
  static TensorLayout sequence_output(const Plan& plan, const Kjt& kjt);
  static TensorLayout pooled_output(const Plan& plan);
  static TensorLayout pooled_vbe_output(const Plan& plan,
                                        const std::vector<int64_t>& batch_per_feature);
  // Lookup outputs of rank r (docs/semantics.md §5). For sequence: `lengths` in (f, s, b)
  // order and `batch_size_per_rank` B_s; for pooled VBE: B_{s,f} as [W][F].
  static TensorLayout sequence_local_embs(const Plan& plan, const std::vector<int64_t>& lengths,
                                          const std::vector<int64_t>& batch_size_per_rank);
  static TensorLayout pooled_local_embs(const Plan& plan,
                                        const std::vector<int64_t>& batch_size_per_rank);
  static TensorLayout pooled_vbe_local_embs(
      const Plan& plan, const std::vector<std::vector<int64_t>>& batch_size_per_rank_per_feature);
};

// Position of id i of a KJT: which bag (feature, sample) and where inside it.
struct IdPosition {
  int64_t feature = 0;
  int64_t sample = 0;
  int64_t position = 0;
};
// Bag offsets of a KJT's lengths (complete cumsum, [num_bags + 1]) and the feature of each
// bag; computed here from lengths and strides so the layout needs only types.hpp.
struct KjtIndex {
  std::vector<int64_t> offsets;      // [L + 1]
  std::vector<int64_t> bag_feature;  // [L]
  std::vector<int64_t> bag_sample;   // [L]
  explicit KjtIndex(const Kjt& kjt);
  IdPosition locate(int64_t i) const;  // i in [0, offsets.back())
};

}  // namespace dynemb
