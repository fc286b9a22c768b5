#pragma once

// One finished line into railshard's log, for code that cannot include base/logging.h: the
// torch extension, where torch 2.x's bundled fmt headers clash with the system spdlog's.
#include <string>

#include "base/config.h"

namespace railshard::log {

void line(LogLevel level, const std::string& text);

}  // namespace railshard::log
