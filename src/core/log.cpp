#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace strata::log {

namespace {
// The default logger writes to stderr, installed once before any thread logs.
struct StderrDefault {
  StderrDefault() {
    auto logger = spdlog::stderr_color_mt("strata");
    logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
    spdlog::set_default_logger(logger);
  }
};
const StderrDefault kInstall;
}  // namespace

void set_level(const std::string& level) {
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") lvl = spdlog::level::info;
  spdlog::set_level(lvl);
}

}  // namespace strata::log
