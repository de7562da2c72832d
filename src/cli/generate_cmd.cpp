#include "cli/commands.h"

namespace strata::cli {
void register_generate(CLI::App& app) { (void)app.add_subcommand("generate", "Generate tokens from a prompt"); }
}  // namespace strata::cli
