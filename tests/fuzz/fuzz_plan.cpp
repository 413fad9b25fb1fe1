// libFuzzer target: the plan loader must turn any bytes into findings, never crash, hang or
// throw (parse_plan's contract). Seed corpus: plans/*.yaml.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "plan/plan.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    dynemb::PlanLoadResult r = dynemb::parse_plan(text, "fuzz.yaml");
    if (r.ok() && !r.plan) std::abort();  // ok() promises a plan
    for (const auto& d : r.findings) (void)d.str();
  } catch (...) {
    std::abort();  // parse_plan must never throw for bad content
  }
  return 0;
}
