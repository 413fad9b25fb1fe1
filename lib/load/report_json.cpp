// The load report as JSON (docs/load-report.md, "schema": "dynemb-dist/load", version 1).
#include <nlohmann/json.hpp>

#include "common/safe_text.hpp"
#include "load/compute.hpp"

namespace dynemb::load {

namespace {

using nlohmann::json;

std::vector<std::vector<int64_t>> square(const TrafficMatrix& m) {
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(m.world_size));
  for (int64_t s = 0; s < m.world_size; ++s)
    rows[static_cast<size_t>(s)].assign(m.bytes.begin() + s * m.world_size,
                                        m.bytes.begin() + (s + 1) * m.world_size);
  return rows;
}

json dist_json(const TrafficMatrix& m) {
  return {
      {"bytes", square(m)}, {"sent", m.sent()}, {"received", m.received()}, {"total", m.total()}};
}

std::vector<int64_t> rank_field(const std::vector<RankLoad>& v, bool unique) {
  std::vector<int64_t> out;
  for (const RankLoad& r : v) out.push_back(unique ? r.unique_rows : r.ids);
  return out;
}

std::vector<int64_t> table_row(const PlanLoad& p, size_t t) {
  const auto W = static_cast<size_t>(p.plan.world_size);
  return std::vector<int64_t>(p.table_ids.begin() + static_cast<std::ptrdiff_t>(t * W),
                              p.table_ids.begin() + static_cast<std::ptrdiff_t>((t + 1) * W));
}

json plan_json(const PlanLoad& p, int64_t num_batches) {
  const Plan& plan = p.plan;
  json j;
  j["name"] = p.name;
  j["origin"] = p.origin;
  j["world_size"] = plan.world_size;
  j["module"] = to_string(plan.module);
  j["comm_precision"] = to_string(plan.comm_precision);
  j["comm_element_bytes"] = comm_element_bytes(plan);
  j["plan_path"] = plan.path;
  json tables = json::array();
  for (size_t t = 0; t < plan.tables.size(); ++t) {
    const TableConfig& tc = plan.tables[t];
    const std::vector<int64_t> ids = table_row(p, t);
    tables.push_back({{"name", tc.name},
                      {"dist_type", to_string(tc.dist_type)},
                      {"num_embeddings", tc.num_embeddings},
                      {"ids", ids},
                      {"imbalance", imbalance(ids)}});
  }
  j["tables"] = tables;
  j["total"] = {{"ids", rank_field(p.total, false)}, {"unique_rows", rank_field(p.total, true)}};
  j["batch_group"] = p.batch_group;
  json batches = json::array();
  for (const BatchLoad& b : p.batches)
    batches.push_back({{"batch", b.batch},
                       {"batches", std::min(p.batch_group, num_batches - b.batch)},
                       {"ids", rank_field(b.ranks, false)},
                       {"unique_rows", rank_field(b.ranks, true)},
                       {"input_received", b.input_received},
                       {"output_received", b.output_received},
                       {"input_dist_seconds", b.input_dist_seconds},
                       {"output_dist_seconds", b.output_dist_seconds}});
  j["batches"] = batches;
  j["input_dist"] = dist_json(p.input_dist);
  j["output_dist"] = dist_json(p.output_dist);
  j["imbalance"] = {{"ids", imbalance(rank_field(p.total, false))},
                    {"unique_rows", imbalance(rank_field(p.total, true))},
                    {"input_sent", imbalance(p.input_dist.sent())},
                    {"input_received", imbalance(p.input_dist.received())},
                    {"output_sent", imbalance(p.output_dist.sent())},
                    {"output_received", imbalance(p.output_dist.received())}};
  j["hottest_rank"] = p.hottest_rank;
  json rows = json::array();
  for (const HotRow& h : p.hottest_rows)
    rows.push_back({{"table", h.table},
                    {"table_name", plan.tables[static_cast<size_t>(h.table)].name},
                    {"row", h.row},
                    {"count", h.count},
                    {"overcount", h.overcount}});
  j["hottest_rows"] = rows;
  j["estimate"] = {{"input_dist_seconds", p.input_dist_seconds},
                   {"output_dist_seconds", p.output_dist_seconds}};
  return j;
}

// The plan as YAML: the text it was read from, else written from the plan (a generated one).
std::string plan_yaml(const PlanLoad& p) {
  if (!p.plan.source_text.empty()) return p.plan.source_text;
  return plan_to_yaml(p.plan, p.name + ": " + p.origin);
}

}  // namespace

std::string load_report_json(const LoadReport& r, const std::string& tool_version) {
  json j;
  j["schema"] = "dynemb-dist/load";
  j["schema_version"] = kLoadSchemaVersion;
  j["tool"] = {{"name", "dynemb-dist"}, {"version", tool_version}};
  j["capture"] = r.capture;
  j["capture_world_size"] = r.capture_world_size;
  j["num_batches"] = r.num_batches;
  j["link_gbps"] = r.link_gbps;
  j["hot_row_capacity"] = r.hot_row_capacity;
  json plans = json::array();
  for (const PlanLoad& p : r.plans) plans.push_back(plan_json(p, r.num_batches));
  j["plans"] = plans;
  // Every string escaped (common/safe_text.hpp); the plans' YAML keeps its line breaks (each
  // line escaped), so that it can be written back to a file as it is.
  escape_json_strings(j);
  for (size_t i = 0; i < r.plans.size(); ++i)
    j["plans"][i]["plan_yaml"] = escape_lines(plan_yaml(r.plans[i]));
  return j.dump(2) + "\n";
}

}  // namespace dynemb::load
