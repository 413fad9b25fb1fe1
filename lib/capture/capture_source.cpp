// Embedding rows of a capture: /tables/<name>/weight where present, else the hash64 oracle.
#include "capture/capture.hpp"

namespace dynemb {

std::shared_ptr<const EmbeddingSource> open_embedding_source(const CaptureReader& reader,
                                                             const Plan& plan) {
  std::shared_ptr<const EmbeddingSource> oracle;
  if (reader.oracle_seed()) oracle = std::make_shared<OracleSource>(*reader.oracle_seed(), plan);
  const std::vector<std::string> names = reader.weight_tables();
  if (names.empty()) return oracle;

  // weights[t]: table t's [num_embeddings * D] rows, when the capture has them.
  std::vector<std::optional<std::vector<float>>> weights(plan.tables.size());
  for (const std::string& name : names) {
    size_t t = 0;
    while (t < plan.tables.size() && plan.tables[t].name != name) ++t;
    if (t == plan.tables.size())
      throw CaptureError(reader.path(), "/tables/" + name, "no table '" + name + "' in the plan");
    weights[t] = reader.read_table_weight(plan.tables[t]);
  }
  if (!oracle)
    for (size_t t = 0; t < plan.tables.size(); ++t)
      if (!weights[t])
        throw CaptureError(reader.path(), "/tables/" + plan.tables[t].name + "/weight",
                           "missing, and the capture has no /oracle to fall back on");
  return std::make_shared<DenseSource>(plan, std::move(weights), oracle);
}

}  // namespace dynemb
