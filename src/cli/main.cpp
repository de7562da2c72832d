#include <cstdio>

#include "cli/commands.h"
#include "core/log.h"

namespace strata::cli {
int& exit_code() {
  static int code = 0;
  return code;
}
}  // namespace strata::cli

int main(int argc, char** argv) {
  CLI::App app{"strata: an LLM inference server"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off");
  app.parse_complete_callback([&] { strata::log::set_level(log_level); });
  strata::cli::register_generate(app);
  strata::cli::register_embed(app);
  strata::cli::register_inspect(app);
  strata::cli::register_tokenize(app);
  strata::cli::register_serve(app);
  strata::cli::register_bench(app);
  strata::cli::register_router(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return strata::cli::exit_code();
}
