// Logging goes to stderr through spdlog; stdout belongs to command output (token ids,
// rendered prompts) so scripts can read it.
#pragma once

#include <spdlog/spdlog.h>

namespace strata::log {

// Sets the process-wide level from a name ("trace".."off"); unknown names keep "info".
void set_level(const std::string& level);

using spdlog::debug;
using spdlog::error;
using spdlog::info;
using spdlog::warn;

}  // namespace strata::log
