// Placeholder until the subcommand lands: a clear exit-2 message, never a fake result.
#include "commands.hpp"
#include "common/error.hpp"

namespace dynemb::cli {

void setup_inspect(CLI::App& app, RunFn& run) {
  auto* sub = app.add_subcommand("inspect", "(not available in this build yet)");
  sub->allow_extras();
  sub->callback([&run] {
    run = [] () -> int { throw UsageError("'inspect' is not implemented in this build yet"); };
  });
}

}  // namespace dynemb::cli
