#include "cli/commands.h"

namespace strata::cli {
void register_tokenize(CLI::App& app) { (void)app.add_subcommand("tokenize", "Encode text or render a chat"); }
}  // namespace strata::cli
