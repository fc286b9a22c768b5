#include "launcher/discovery/ip_network.h"

#include <arpa/inet.h>

namespace railshard::launcher::discovery {

bool isIpv6LinkLocal(const std::string& address) {
  in6_addr raw{};
  if (::inet_pton(AF_INET6, address.c_str(), &raw) != 1) return false;
  return raw.s6_addr[0] == 0xfe && (raw.s6_addr[1] & 0xc0) == 0x80;
}

}  // namespace railshard::launcher::discovery
