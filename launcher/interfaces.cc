#include "launcher/interfaces.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "base/error.h"

namespace railshard::launcher {
namespace {

// Counts the leading one bits of a netmask. Some interfaces (point-to-point, some tunnels)
// report no netmask: then the address stands alone (/32 or /128).
int prefixLength(const sockaddr* mask, int family) {
  const int full = family == AF_INET ? 32 : 128;
  if (mask == nullptr || mask->sa_family != family) return full;
  const auto* bytes = family == AF_INET
                          ? reinterpret_cast<const unsigned char*>(
                                &reinterpret_cast<const sockaddr_in*>(mask)->sin_addr)
                          : reinterpret_cast<const unsigned char*>(
                                &reinterpret_cast<const sockaddr_in6*>(mask)->sin6_addr);
  int bits = 0;
  for (int i = 0; i < full / 8; ++i) {
    for (int b = 7; b >= 0; --b) {
      if ((bytes[i] & (1u << b)) == 0) return bits;
      ++bits;
    }
  }
  return bits;
}

}  // namespace

std::vector<InterfaceAddress> listInterfaceAddresses() {
  std::vector<InterfaceAddress> result;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return result;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr) continue;
    const int family = it->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    char host[INET6_ADDRSTRLEN] = {0};
    const void* raw =
        family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(it->ifa_addr)->sin6_addr);
    ::inet_ntop(family, raw, host, sizeof(host));
    InterfaceAddress entry;
    entry.name = it->ifa_name;
    entry.address = host;
    entry.ipv6 = family == AF_INET6;
    entry.up = (it->ifa_flags & IFF_UP) != 0 && (it->ifa_flags & IFF_RUNNING) != 0;
    entry.loopback = (it->ifa_flags & IFF_LOOPBACK) != 0;
    entry.prefix_length = prefixLength(it->ifa_netmask, family);
    result.push_back(entry);
  }
  ::freeifaddrs(list);
  std::stable_sort(result.begin(), result.end(),
                   [](const auto& a, const auto& b) { return !a.ipv6 && b.ipv6; });
  return result;
}

bool interfaceMatches(const std::string& name, const std::string& spec) {
  // Comma-separated patterns; "^" excludes, "=" matches exactly, otherwise a prefix.
  bool any_include = false;
  bool included = false;
  size_t start = 0;
  while (start <= spec.size()) {
    const size_t comma = spec.find(',', start);
    std::string pattern =
        spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? spec.size() + 1 : comma + 1;
    if (pattern.empty()) continue;
    bool exclude = false;
    if (pattern[0] == '^') {
      exclude = true;
      pattern.erase(0, 1);
    }
    bool exact = false;
    if (!pattern.empty() && pattern[0] == '=') {
      exact = true;
      pattern.erase(0, 1);
    }
    const bool hit = exact ? name == pattern : name.rfind(pattern, 0) == 0;
    if (exclude) {
      if (hit) return false;
    } else {
      any_include = true;
      included = included || hit;
    }
  }
  return any_include ? included : true;
}

std::string addressForInterface(const std::string& spec) {
  const auto addresses = listInterfaceAddresses();
  for (const auto& entry : addresses) {
    if (entry.up && interfaceMatches(entry.name, spec)) return entry.address;
  }
  std::set<std::string> names;
  for (const auto& entry : addresses) names.insert(entry.name + (entry.up ? "" : " (down)"));
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  throw ConfigError("RAILSHARD_SOCKET_IFNAME='" + spec +
                    "' matches no interface that is up with an address; interfaces here: " +
                    (list.empty() ? "(none)" : list));
}

std::string sourceAddressFor(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* result = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &result) != 0 || result == nullptr) {
    throw ConfigError("cannot resolve store host '" + host + "'");
  }
  const int fd = ::socket(result->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  std::string address;
  if (fd >= 0 && ::connect(fd, result->ai_addr, result->ai_addrlen) == 0) {
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
      char text[INET6_ADDRSTRLEN] = {0};
      const void* raw =
          local.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      ::inet_ntop(local.ss_family, raw, text, sizeof(text));
      address = text;
    }
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(result);
  if (address.empty()) throw ConfigError("no route from this host to store host '" + host + "'");
  return address;
}

std::string defaultHostAddress() {
  for (const auto& entry : listInterfaceAddresses()) {
    if (!entry.up || entry.loopback || entry.ipv6) continue;
    if (entry.name.rfind("docker", 0) == 0 || entry.name.rfind("veth", 0) == 0 ||
        entry.name.rfind("virbr", 0) == 0) {
      continue;
    }
    return entry.address;
  }
  return "127.0.0.1";
}

std::string advertiseAddress(const std::string& socket_ifname, const std::string& store_host) {
  if (!socket_ifname.empty()) return addressForInterface(socket_ifname);
  if (store_host.empty()) return defaultHostAddress();
  if (store_host == "localhost" || store_host.rfind("127.", 0) == 0 || store_host == "::1") {
    return "127.0.0.1";
  }
  return sourceAddressFor(store_host);
}

}  // namespace railshard::launcher
