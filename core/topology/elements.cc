#include "core/topology/elements.h"

#include <array>
#include <utility>

namespace railshard::topology {

namespace {

template <typename Enum, size_t N>
bool parseFrom(const std::array<std::pair<Enum, std::string_view>, N>& table, std::string_view text,
               Enum& out) {
  for (const auto& [value, text_value] : table) {
    if (text_value == text) {
      out = value;
      return true;
    }
  }
  return false;
}

template <typename Enum, size_t N>
std::string_view nameFrom(const std::array<std::pair<Enum, std::string_view>, N>& table,
                          Enum value) {
  for (const auto& [v, text] : table) {
    if (v == value) return text;
  }
  return "unknown";
}

constexpr std::array<std::pair<VertexKind, std::string_view>, 6> kVertexKinds{{
    {VertexKind::kHost, "host"},
    {VertexKind::kNuma, "numa"},
    {VertexKind::kPciSwitch, "pci_switch"},
    {VertexKind::kGpu, "gpu"},
    {VertexKind::kNic, "nic"},
    {VertexKind::kNetwork, "network"},
}};

constexpr std::array<std::pair<LinkKind, std::string_view>, 9> kLinkKinds{{
    {LinkKind::kNvLink, "nvlink"},
    {LinkKind::kPcie, "pcie"},
    {LinkKind::kCpuInterconnect, "cpu_interconnect"},
    {LinkKind::kEthernet, "ethernet"},
    {LinkKind::kInfiniBand, "infiniband"},
    {LinkKind::kRoce, "roce"},
    {LinkKind::kLoopback, "loopback"},
    {LinkKind::kShm, "shm"},
    {LinkKind::kVirtual, "virtual"},
}};

constexpr std::array<std::pair<LinkLayer, std::string_view>, 4> kLinkLayers{{
    {LinkLayer::kUnknown, "unknown"},
    {LinkLayer::kEthernet, "ethernet"},
    {LinkLayer::kInfiniBand, "infiniband"},
    {LinkLayer::kLoopback, "loopback"},
}};

constexpr std::array<std::pair<PathTransport, std::string_view>, 5> kTransports{{
    {PathTransport::kSelf, "self"},
    {PathTransport::kShm, "shm"},
    {PathTransport::kNvLink, "nvlink"},
    {PathTransport::kRdma, "rdma"},
    {PathTransport::kTcp, "tcp"},
}};

}  // namespace

std::string_view name(VertexKind kind) {
  return nameFrom(kVertexKinds, kind);
}
std::string_view name(LinkKind kind) {
  return nameFrom(kLinkKinds, kind);
}
std::string_view name(LinkLayer layer) {
  return nameFrom(kLinkLayers, layer);
}
std::string_view name(PathTransport transport) {
  return nameFrom(kTransports, transport);
}
bool parse(std::string_view text, VertexKind& out) {
  return parseFrom(kVertexKinds, text, out);
}
bool parse(std::string_view text, LinkKind& out) {
  return parseFrom(kLinkKinds, text, out);
}
bool parse(std::string_view text, LinkLayer& out) {
  return parseFrom(kLinkLayers, text, out);
}

}  // namespace railshard::topology

#include <arpa/inet.h>

#include "base/error.h"

namespace railshard::topology {

std::string networkIdOf(const std::string& cidr) {
  const size_t slash = cidr.find('/');
  const std::string address = cidr.substr(0, slash);
  const bool v6 = address.find(':') != std::string::npos;
  const int bits = v6 ? 128 : 32;
  int prefix = bits;
  if (slash != std::string::npos) {
    try {
      size_t used = 0;
      prefix = std::stoi(cidr.substr(slash + 1), &used);
      if (used != cidr.size() - slash - 1) prefix = -1;
    } catch (const std::exception&) {
      prefix = -1;
    }
  }
  unsigned char raw[16] = {0};
  if (prefix < 0 || prefix > bits ||
      ::inet_pton(v6 ? AF_INET6 : AF_INET, address.c_str(), raw) != 1) {
    throw InvalidArgument("topology: '" + cidr + "' is not an address/prefix");
  }
  for (int bit = prefix; bit < bits; ++bit)
    raw[bit / 8] &= static_cast<unsigned char>(~(0x80 >> (bit % 8)));
  char text[INET6_ADDRSTRLEN] = {0};
  ::inet_ntop(v6 ? AF_INET6 : AF_INET, raw, text, sizeof(text));
  return "net:" + std::string(text) + "/" + std::to_string(prefix);
}

}  // namespace railshard::topology
