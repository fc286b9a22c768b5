#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace railshard::transport::links::ibverbs {

enum class GidType : uint8_t { kIb, kRoceV1, kRoceV2, kUnknown };

// One entry of a port's GID table, as sysfs shows it
// (/sys/class/infiniband/<dev>/ports/<port>/gids/<i> and gid_attrs/{types,ndevs}/<i>).
struct GidEntry {
  int index = 0;
  std::array<uint8_t, 16> gid{};
  GidType type = GidType::kUnknown;
  std::string netdev;  // the Ethernet device a RoCE GID belongs to ("" for IB)

  bool isZero() const;
  bool isIpv4Mapped() const;  // ::ffff:a.b.c.d, a RoCE GID made from an IPv4 address
  bool isLinkLocal() const;   // fe80::/64
  std::string text() const;   // "fe80:0000:...:0001", sysfs's spelling
};

enum class AddressFamily : uint8_t { kIpv4, kIpv6 };

// "fe80:0000:0000:0000:0202:c9ff:fe00:0001" (sysfs) or any inet6 spelling -> bytes.
std::optional<std::array<uint8_t, 16>> parseGid(const std::string& text);
GidType parseGidType(const std::string& text);  // "IB/RoCE v1", "RoCE v2"

// Reads a port's table from sysfs (`sysfs_root` is "/sys" outside tests). Zero GIDs and
// unreadable entries are left out; an absent port gives an empty table.
std::vector<GidEntry> readGidTable(const std::string& sysfs_root, const std::string& device,
                                   int port);

struct GidChoice {
  int index = -1;      // -1: none fits
  std::string reason;  // why this one, or why none
};

// Picks the GID a RoCE queue pair should use, as NCCL and UCX do: RoCE v2 (routable) before
// v1, an address of the wanted family (IPv4-mapped for IPv4; global, non-mapped for IPv6),
// on `netdev` when given, lowest index among equals. For InfiniBand the table's index 0 (the
// port GID) is right, since IB routes by LID inside a subnet.
GidChoice selectGid(const std::vector<GidEntry>& table, bool infiniband, AddressFamily family,
                    const std::string& netdev = "");

}  // namespace railshard::transport::links::ibverbs
