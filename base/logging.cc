#include "base/logging.h"
#include "base/log_line.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>
#include <mutex>

namespace railshard::log {
namespace {

std::shared_ptr<spdlog::logger> makeLogger() {
  // stderr, so that benchmark tables on stdout stay machine-readable.
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("railshard", sink);
  logger->set_pattern("[railshard %l] %v");
  const char* level = std::getenv("RAILSHARD_LOG_LEVEL");
  logger->set_level(level ? spdlog::level::from_str(level) : spdlog::level::warn);
  return logger;
}

std::mutex& mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = makeLogger();
  return *instance;
}

void configure(LogLevel level, int rank) {
  std::lock_guard<std::mutex> lock(mutex());
  // LogLevel's names are spdlog's.
  logger().set_level(spdlog::level::from_str(std::string(name(level))));
  logger().set_pattern("[railshard " + std::to_string(rank) + " %l] %v");
}

void line(LogLevel level, const std::string& text) {
  logger().log(spdlog::level::from_str(std::string(name(level))), text);
}

}  // namespace railshard::log
