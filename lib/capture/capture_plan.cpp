// The plan a capture is read with, and the whole-file check behind `validate --capture`.
#include <fmt/format.h>

#include "capture/capture.hpp"

namespace dynemb {

namespace {

// An override plan must describe the same features, in the same order, with the same dims
// and module as the plan the capture was made with: otherwise every shape would disagree.
void check_override(const CaptureReader& reader, const Plan& over) {
  const PlanLoadResult embedded = parse_plan(reader.plan_text(), reader.path() + ":/plan");
  if (!embedded.ok() || !embedded.plan) return;  // nothing to compare with: the override wins
  const Plan& cap = *embedded.plan;
  auto fail = [&](const std::string& msg) {
    throw CaptureError(reader.path(), "/plan", msg + " (plan " + over.path + ")");
  };
  if (cap.module != over.module)
    fail(fmt::format("capture was made with a {} plan, the plan given is {}", to_string(cap.module),
                     to_string(over.module)));
  if (cap.num_features() != over.num_features())
    fail(fmt::format("capture has {} features, the plan given has {}", cap.num_features(),
                     over.num_features()));
  for (int64_t f = 0; f < cap.num_features(); ++f) {
    const FeatureInfo& a = cap.features[f];
    const FeatureInfo& b = over.features[f];
    if (a.name != b.name)
      fail(fmt::format("feature {} is '{}' in the capture, '{}' in the plan given", f, a.name,
                       b.name));
    if (a.dim != b.dim)
      fail(fmt::format("feature '{}' has dim {} in the capture, {} in the plan given", a.name,
                       a.dim, b.dim));
  }
}

}  // namespace

Plan capture_plan(const CaptureReader& reader, const Plan* override_plan) {
  if (override_plan) {
    if (override_plan->world_size != reader.world_size())
      throw CaptureError(
          reader.path(), "/",
          fmt::format("world_size {} != plan world_size {} ({})", reader.world_size(),
                      override_plan->world_size, override_plan->path));
    check_override(reader, *override_plan);
    return *override_plan;
  }
  Plan plan = load_plan_or_throw(reader.plan_text(), reader.path() + ":/plan");
  if (plan.world_size != reader.world_size())
    throw CaptureError(reader.path(), "/",
                       fmt::format("world_size {} != world_size {} of the embedded /plan",
                                   reader.world_size(), plan.world_size));
  return plan;
}

void check_capture(const std::string& path, const Plan* override_plan) {
  CaptureReader reader(path);
  check_capture(reader, override_plan);
}

void check_capture(const CaptureReader& reader, const Plan* override_plan) {
  const std::string& path = reader.path();
  const Plan plan = capture_plan(reader, override_plan);
  for (const std::string& name : reader.weight_tables()) {
    const TableConfig* table = nullptr;
    for (const TableConfig& t : plan.tables)
      if (t.name == name) table = &t;
    if (!table) throw CaptureError(path, "/tables/" + name, "no table '" + name + "' in the plan");
    reader.check_table_weight(*table);
  }
  ReadParts shapes_only;
  shapes_only.float_data = false;
  for (int64_t k = 0; k < reader.num_batches(); ++k) reader.read_batch(plan, k, shapes_only);
}

}  // namespace dynemb
