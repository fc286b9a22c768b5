#pragma once

#include <string>

namespace railshard::launcher::discovery {

// True for fe80::/10: such addresses name a link, not a network two hosts can route over.
bool isIpv6LinkLocal(const std::string& address);

}  // namespace railshard::launcher::discovery
