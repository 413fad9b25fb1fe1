#include "model/types.hpp"

#include <algorithm>

namespace dynemb {

int64_t Kjt::stride() const {
  if (is_vbe()) {
    int64_t m = 0;
    for (int64_t b : stride_per_feature) m = std::max(m, b);
    return m;
  }
  return num_features == 0 ? 0 : static_cast<int64_t>(lengths.size()) / num_features;
}

int64_t Kjt::batch_size(int64_t f) const {
  return is_vbe() ? stride_per_feature[f] : stride();
}

int64_t Kjt::bag_begin(int64_t f) const {
  if (!is_vbe()) return f * stride();
  int64_t j = 0;
  for (int64_t g = 0; g < f; ++g) j += stride_per_feature[g];
  return j;
}

std::vector<int64_t> Kjt::length_per_key() const {
  std::vector<int64_t> out(static_cast<size_t>(num_features), 0);
  for (int64_t f = 0; f < num_features; ++f) {
    const int64_t j0 = bag_begin(f), n = batch_size(f);
    for (int64_t j = j0; j < j0 + n; ++j) out[f] += lengths[j];
  }
  return out;
}

std::vector<int64_t> Kjt::offsets() const {
  std::vector<int64_t> o(lengths.size() + 1, 0);
  for (size_t i = 0; i < lengths.size(); ++i) o[i + 1] = o[i] + lengths[i];
  return o;
}

}  // namespace dynemb
