#include "cli/commands.h"

namespace strata::cli {
void register_inspect(CLI::App& app) { (void)app.add_subcommand("inspect", "Describe a model directory"); }
}  // namespace strata::cli
