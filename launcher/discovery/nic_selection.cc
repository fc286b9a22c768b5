#include "launcher/discovery/nic_selection.h"

#include "launcher/interfaces.h"

namespace railshard::launcher::discovery {
namespace {

bool startsWith(const std::string& text, const char* prefix) {
  return text.rfind(prefix, 0) == 0;
}

// Whether `spec` has a pattern that includes (not "^"-excludes) something: only such a spec
// names interfaces; "^docker" alone excludes docker and leaves the defaults alone.
bool hasInclude(const std::string& spec) {
  size_t start = 0;
  while (start < spec.size()) {
    size_t comma = spec.find(',', start);
    if (comma == std::string::npos) comma = spec.size();
    if (comma > start && spec[start] != '^') return true;
    start = comma + 1;
  }
  return false;
}

}  // namespace

bool isBridgeOrContainer(const std::string& name, bool is_bridge, bool has_master) {
  for (const char* prefix : {"docker", "virbr", "br-", "cni", "flannel"}) {
    if (startsWith(name, prefix)) return true;
  }
  return is_bridge || has_master;
}

std::string exclusionReason(const NicFacts& nic, const std::string& spec) {
  if (!spec.empty() && !interfaceMatches(nic.name, spec)) {
    return "not selected by RAILSHARD_SOCKET_IFNAME=" + spec;
  }
  if (!nic.up) return "down";
  const bool named = !spec.empty() && hasInclude(spec);
  if (!named) {
    if (nic.loopback) return "loopback";
    if (nic.bridge_or_container) return "bridge/container interface";
    if (startsWith(nic.name, "ifb")) return "ifb";
  }
  if (!nic.has_address && !nic.rdma) return "no address";
  return "";
}

}  // namespace railshard::launcher::discovery
