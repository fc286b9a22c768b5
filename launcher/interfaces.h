#pragma once

#include <string>
#include <vector>

namespace railshard::launcher {

struct InterfaceAddress {
  std::string name;     // "eth0"
  std::string address;  // "10.0.0.2" or "fe80::1"
  bool ipv6 = false;
  bool up = false;
  bool loopback = false;
  int prefix_length = 0;  // from the netmask: 24 for 255.255.255.0, 64 for ffff:ffff:ffff:ffff::
};

// Addresses of this host's interfaces (getifaddrs), IPv4 first.
std::vector<InterfaceAddress> listInterfaceAddresses();

// Whether interface `name` is selected by `spec` (NCCL_SOCKET_IFNAME syntax: comma-separated
// patterns; "eth" a prefix, "=eth0" exact, "^docker" excludes). A spec with only exclusions
// selects everything else; an empty spec selects everything.
bool interfaceMatches(const std::string& name, const std::string& spec);

// The address of the first up interface that matches `spec` (NCCL_SOCKET_IFNAME syntax:
// "eth" prefix, "=eth0" exact, "^docker" excludes; comma-separated). ConfigError naming the
// interfaces that exist when none matches.
std::string addressForInterface(const std::string& spec);

// The local address the kernel would use to reach `host` (no packet is sent: a UDP socket is
// "connected" and asked for its name). Loopback hosts give the loopback address.
std::string sourceAddressFor(const std::string& host);

// First up, non-loopback IPv4 address (skipping docker/veth bridges), else 127.0.0.1.
std::string defaultHostAddress();

// The address a rank advertises to its peers (init() and the torch.distributed backend alike):
// the interface `socket_ifname` selects (RAILSHARD_SOCKET_IFNAME) when set; else 127.0.0.1
// when the store is on a loopback address, the local address that reaches the store's host
// otherwise, and defaultHostAddress() when that host is unknown ("").
std::string advertiseAddress(const std::string& socket_ifname, const std::string& store_host);

}  // namespace railshard::launcher
