// Each `strata` subcommand registers itself on the CLI11 app; its options and callback live
// in its own file (generate_cmd.cpp, inspect_cmd.cpp, tokenize_cmd.cpp, serve_cmd.cpp, ...).
#pragma once

#include <CLI/CLI.hpp>

namespace strata::cli {

// A command's callback sets the process exit status here (0 by default).
int& exit_code();

void register_generate(CLI::App& app);
void register_embed(CLI::App& app);
void register_inspect(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_serve(CLI::App& app);
void register_bench(CLI::App& app);
void register_router(CLI::App& app);

}  // namespace strata::cli
