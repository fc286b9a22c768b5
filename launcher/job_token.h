#pragma once

#include <string>

namespace railshard::launcher {

// A fresh job token: 32 lowercase hex digits (128 bits) from the kernel's random source.
// Every store and data connection of a job presents it, so a rank of one job can never join
// another job that happens to reuse a port. Throws Error when no random source is readable.
std::string makeJobToken();

}  // namespace railshard::launcher
