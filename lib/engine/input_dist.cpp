#include "engine/input_dist.hpp"

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>

#include "common/console.hpp"
#include "common/error.hpp"
#include "common/parallel.hpp"
#include "common/safe_text.hpp"
#include "common/trace.hpp"
#include "engine/lookup_runs.hpp"
#include "engine/ops.hpp"

namespace dynemb {

void check_kjt(const Plan& plan, const Kjt& kjt, const std::string& where) {
  const int64_t F = plan.num_features();
  if (kjt.num_features != F)
    throw Error(where + ": KJT has " + std::to_string(kjt.num_features) +
                " features, the plan has " + std::to_string(F));
  if (kjt.is_vbe()) {
    if (static_cast<int64_t>(kjt.stride_per_feature.size()) != F)
      throw Error(where + "/stride_per_feature: " + std::to_string(kjt.stride_per_feature.size()) +
                  " entries, want F = " + std::to_string(F));
    int64_t total = 0;
    for (int64_t f = 0; f < F; ++f) {
      if (kjt.stride_per_feature[f] < 0)
        throw Error(where + "/stride_per_feature[" + std::to_string(f) + "]: negative");
      total += kjt.stride_per_feature[f];
    }
    if (total != kjt.num_bags())
      throw Error(where + "/lengths: " + std::to_string(kjt.num_bags()) +
                  " entries, want sum of stride_per_feature = " + std::to_string(total));
  } else if (F > 0 && kjt.num_bags() % F != 0) {
    throw Error(where + "/lengths: " + std::to_string(kjt.num_bags()) +
                " entries is not a multiple of F = " + std::to_string(F));
  }
  int64_t sum = 0;
  for (int64_t j = 0; j < kjt.num_bags(); ++j) {
    if (kjt.lengths[j] < 0)
      throw Error(where + "/lengths[" + std::to_string(j) + "]: negative length " +
                  std::to_string(kjt.lengths[j]));
    sum += kjt.lengths[j];
  }
  if (sum != kjt.num_ids())
    throw Error(where + "/lengths: sum " + std::to_string(sum) + " != len(values) " +
                std::to_string(kjt.num_ids()));
  if (kjt.weighted && static_cast<int64_t>(kjt.weights.size()) != kjt.num_ids())
    throw Error(where + "/weights: " + std::to_string(kjt.weights.size()) +
                " entries, want len(values) " + std::to_string(kjt.num_ids()));
  if (!kjt.weighted && !kjt.weights.empty())
    throw Error(where + "/weights: present but the KJT is not marked weighted");
}

std::vector<BucketizedKjt> bucketize_ranks(const Plan& plan, const std::vector<const Kjt*>& kjts) {
  std::vector<BucketizedKjt> out(kjts.size());
  parallel_for(
      hardware_threads(), int64_t(kjts.size()),
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const TraceSpan span("bucketize", r);
          out[size_t(r)] = bucketize_on_host(plan, *kjts[size_t(r)]);
        }
      },
      /*grain=*/1);
  return out;
}

DerivedBatch derive_input_dist(const Plan& plan, const std::vector<const Kjt*>& kjts,
                               Backend* stage1) {
  const int64_t W = plan.world_size;
  if (static_cast<int64_t>(kjts.size()) != W)
    throw Error("derive_input_dist: " + std::to_string(kjts.size()) +
                " KJTs for W = " + std::to_string(W) + " ranks");
  bool weighted = false;
  for (int64_t r = 0; r < W; ++r) {
    check_kjt(plan, *kjts[r], "rank" + std::to_string(r));
    if (r == 0) weighted = kjts[r]->weighted;
    if (kjts[r]->weighted != weighted)
      throw Error("rank" + std::to_string(r) + "/weights: some ranks are weighted, others not");
  }
  // Sequence: EmbeddingCollection pads VBE KJTs to max_f B_f before the input dist (§6.2); the
  // others go in as they are (a copy would be a second batch of ids).
  std::vector<Kjt> padded;
  std::vector<const Kjt*> in = kjts;
  if (plan.module == ModuleKind::sequence) {
    padded.reserve(W);  // no reallocation: `in` points into it
    for (int64_t r = 0; r < W; ++r)
      if (kjts[r]->is_vbe()) {
        padded.push_back(pad_vbe_kjt_lengths(*kjts[r]));
        in[r] = &padded.back();
      }
  }
  DerivedBatch out;
  out.ranks.resize(W);
  std::vector<const BucketizedKjt*> bk(W);
  std::vector<BucketizedKjt> bucketized =
      stage1 ? stage1->bucketize(plan, in) : bucketize_ranks(plan, in);
  for (int64_t r = 0; r < W; ++r) {
    out.ranks[r].bucketized = std::move(bucketized[size_t(r)]);
    bk[r] = &out.ranks[r].bucketized;
  }
  TraceSpan a2a_span("kjt all-to-all");
  KjtAllToAllResult a2a = kjt_all_to_all(plan, in, bk);
  out.variable_batch = plan.module == ModuleKind::pooled && a2a.variable_batch;
  for (int64_t r = 0; r < W; ++r) {
    out.ranks[r].lookup_kjt = std::move(a2a.lookup_kjts[r]);
    out.ranks[r].ctx = std::move(a2a.ctx[r]);
  }
  return out;
}

namespace {

// The W lookups of derived.ranks, each made by look(rank, lookup_kjt), with the batch's
// warnings and error words.
template <class T, class Look>
std::vector<T> derive_lookups(const Plan& plan, const DerivedBatch& derived, int64_t batch,
                              const std::function<void(int64_t, T&)>& done, Look&& look) {
  const int64_t W = static_cast<int64_t>(derived.ranks.size());
  if (plan.bounds_check == BoundsCheck::warn_zero_row) {
    // TorchRec's TBE warns; we warn once per batch and feature, with the count over all ranks.
    std::vector<int64_t> oob(static_cast<size_t>(plan.num_features()), 0);
    for (int64_t r = 0; r < W; ++r) {
      const LookupKjt& k = derived.ranks[r].lookup_kjt;
      int64_t p = 0, j = 0;
      for (int64_t f = 0; f < k.num_features; ++f)
        for (int64_t s = 0; s < k.world_size; ++s)
          for (int64_t b = 0; b < k.stride_per_key_per_rank[f][s]; ++b, ++j)
            for (int64_t q = 0; q < k.lengths[j]; ++q, ++p)
              oob[f] += lookup_row(plan, f, r, k.values[p]).oob;
    }
    for (int64_t f = 0; f < plan.num_features(); ++f)
      if (oob[f])
        console::err(fmt::format(
            "warning: batch {}, feature {}: {} ids outside table {}, using local row 0 of the "
            "rank they were routed to (bounds_check=warn_zero_row)\n",
            batch, escape_field(plan.features[f].name), oob[f],
            escape_field(plan.tables[plan.features[f].table].name)));
  }
  std::vector<T> out;
  out.reserve(W);
  for (int64_t r = 0; r < W; ++r) {
    try {
      out.push_back(look(static_cast<int>(r), derived.ranks[r].lookup_kjt));
    } catch (const OutputDistFailure&) {
      throw;
    } catch (const LookupBoundsError&) {
      throw;  // the caller, which holds the KJTs, describes it (describe_lookup_bounds_error)
    } catch (const Error& e) {
      throw Error("batch " + std::to_string(batch) + ": " + e.what());
    }
    if (done) done(r, out.back());
  }
  return out;
}

}  // namespace

std::vector<EmbTensor> derive_local_embs(const Plan& plan, const DerivedBatch& derived,
                                         const EmbeddingSource& source, Backend& backend,
                                         int64_t batch,
                                         const std::function<void(int64_t, EmbTensor&)>& done) {
  return derive_lookups<EmbTensor>(plan, derived, batch, done, [&](int r, const LookupKjt& k) {
    return backend.lookup(plan, r, k, source, Place::host).t;
  });
}

std::vector<Tensor> derive_dist_inputs(const Plan& plan, const DerivedBatch& derived,
                                       const EmbeddingSource& source, Backend& backend,
                                       int64_t batch) {
  return derive_lookups<Tensor>(plan, derived, batch, {}, [&](int r, const LookupKjt& k) {
    return backend.lookup(plan, r, k, source, Place::kept);
  });
}

}  // namespace dynemb

namespace dynemb {

std::string describe_lookup_bounds_error(const Plan& plan, const std::vector<const Kjt*>& kjts,
                                         const DerivedBatch& derived, const LookupBoundsError& e) {
  const int64_t s = e.source_rank, f = e.feature;
  if (s < 0 || s >= static_cast<int64_t>(kjts.size()) || s >= int64_t(derived.ranks.size()) ||
      f < 0 || f >= plan.num_features())
    return e.what();
  const Kjt& kjt = *kjts[size_t(s)];
  if (e.sample < 0 || e.sample >= kjt.batch_size(f) ||
      static_cast<int64_t>(kjt.values.size()) != kjt.num_ids())
    return e.what();
  // The ids of the original bag routed to e.rank keep their order (a stable bucketize): the
  // e.position-th of them is the one. The bag's ids are routed again here (a device's bucketize
  // hands back no dest_rank).
  const FeatureInfo& fi = plan.features[size_t(f)];
  const int64_t j = kjt.bag_begin(f) + e.sample;
  int64_t start = 0;
  for (int64_t q = 0; q < j; ++q) start += kjt.lengths[size_t(q)];
  if (start + kjt.lengths[size_t(j)] > kjt.num_ids()) return e.what();
  int64_t seen = 0, pos = -1;
  for (int64_t i = start; i < start + kjt.lengths[size_t(j)]; ++i)
    if (route_feature(fi, kjt.values[size_t(i)], kjt.values_type, plan.world_size).dest == e.rank &&
        seen++ == e.position) {
      pos = i;
      break;
    }
  if (pos < 0) return e.what();
  const TableConfig& t = plan.tables[size_t(fi.table)];
  std::string routed = "routed to rank " + std::to_string(e.rank);
  // A local row inside the block names the shortfall; ids past blk*W (or negative) are routed
  // by id % W and their local row (id / W) would only confuse. Under bucketize_pos every id
  // of the table lands inside its shard: only those past it (id % W) are out of bounds.
  if (fi.dist_type == DistType::continuous && fi.bucketize_pos.empty() && e.local_row >= 0 &&
      e.local_row < fi.block_size) {
    routed += " as local row " + std::to_string(e.local_row) + ", past its shard of " +
              std::to_string(rank_rows(fi, e.rank).rows) + " rows";
  }
  return "id " + std::to_string(kjt.values[size_t(pos)]) + " of feature " + fi.name + " (rank " +
         std::to_string(s) + ", sample " + std::to_string(e.sample) + ", position " +
         std::to_string(pos - start) + " in its bag) is outside table " + t.name +
         " (num_embeddings " + std::to_string(fi.hash_size) + "; " + routed +
         "). The plan says bounds_check: error; with bounds_check: warn_zero_row such ids are "
         "looked up as local row 0 of the rank they are routed to, as TorchRec's TBE does";
}

}  // namespace dynemb
