// One batch, after its contexts were checked and chosen, run as units (run_context.hpp): the
// lookups checked, the output dist run on each unit and its outputs checked, every check decided
// once its tensor's last part went through. The three cuts differ only in the units they make
// and in where a unit's inputs come from; the checks are lookup_check.hpp's and
// output_check.hpp's for all of them.
#pragma once

#include <optional>
#include <vector>

#include "capture/batch_source.hpp"
#include "replay/unit_planner.hpp"

namespace dynemb::replay_detail {

// The whole batch at once. Returns the outputs when --write-output keeps them (rank order;
// nullopt where the output dist did not run).
std::vector<std::optional<EmbTensor>> run_whole(RunContext& rc, BatchState& st);

// Over column slices of `width` columns (the lookups derived, no whole output kept).
void run_columns(RunContext& rc, BatchState& st, const ColumnSlices& slices);

// One destination at a time, as `cut` says, its rows read from `src` as each unit needs them
// (the next unit's on another thread while this one is checked; after the last, the KJTs and
// contexts of batch `next`, when >= 0).
void run_destinations(RunContext& rc, BatchState& st, const DestinationCut& cut, BatchSource& src,
                      int64_t next);

}  // namespace dynemb::replay_detail
