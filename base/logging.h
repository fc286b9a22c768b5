#pragma once

// Internal logging: a thin layer over spdlog so that the level is set once from Config and
// every line names the rank. Not part of the installed public API.
#include <spdlog/spdlog.h>

#include "base/config.h"

namespace railshard::log {

// Sets the level and the "[railshard rank N]" prefix; idempotent.
void configure(LogLevel level, int rank);
spdlog::logger& logger();

}  // namespace railshard::log

#define RS_LOG_TRACE(...) ::railshard::log::logger().trace(__VA_ARGS__)
#define RS_LOG_DEBUG(...) ::railshard::log::logger().debug(__VA_ARGS__)
#define RS_LOG_INFO(...) ::railshard::log::logger().info(__VA_ARGS__)
#define RS_LOG_WARN(...) ::railshard::log::logger().warn(__VA_ARGS__)
#define RS_LOG_ERROR(...) ::railshard::log::logger().error(__VA_ARGS__)
