#include "transport/links/ibverbs/gid_table.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace railshard::transport::links::ibverbs {

namespace {

std::string readLine(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
  return line;
}

}  // namespace

bool GidEntry::isZero() const {
  return std::all_of(gid.begin(), gid.end(), [](uint8_t b) { return b == 0; });
}

bool GidEntry::isIpv4Mapped() const {
  for (int i = 0; i < 10; ++i) {
    if (gid[static_cast<size_t>(i)] != 0) return false;
  }
  return gid[10] == 0xff && gid[11] == 0xff;
}

bool GidEntry::isLinkLocal() const {
  return gid[0] == 0xfe && (gid[1] & 0xc0) == 0x80 && gid[2] == 0 && gid[3] == 0 && gid[4] == 0 &&
         gid[5] == 0 && gid[6] == 0 && gid[7] == 0;
}

std::string GidEntry::text() const {
  std::string out;
  char group[8];
  for (size_t i = 0; i < gid.size(); i += 2) {
    std::snprintf(group, sizeof(group), "%02x%02x", gid[i], gid[i + 1]);
    if (!out.empty()) out += ':';
    out += group;
  }
  return out;
}

std::optional<std::array<uint8_t, 16>> parseGid(const std::string& text) {
  std::array<uint8_t, 16> bytes{};
  if (::inet_pton(AF_INET6, text.c_str(), bytes.data()) != 1) return std::nullopt;
  return bytes;
}

GidType parseGidType(const std::string& text) {
  if (text == "IB/RoCE v1") return GidType::kRoceV1;  // the kernel's name for both
  if (text == "RoCE v2") return GidType::kRoceV2;
  if (text == "IB") return GidType::kIb;
  return GidType::kUnknown;
}

std::vector<GidEntry> readGidTable(const std::string& sysfs_root, const std::string& device,
                                   int port) {
  namespace fs = std::filesystem;
  const fs::path base =
      fs::path(sysfs_root) / "class/infiniband" / device / "ports" / std::to_string(port);
  std::vector<GidEntry> table;
  std::error_code ec;
  if (!fs::is_directory(base / "gids", ec)) return table;
  const bool infiniband = readLine(base / "link_layer") == "InfiniBand";
  for (const auto& file : fs::directory_iterator(base / "gids", ec)) {
    GidEntry entry;
    try {
      entry.index = std::stoi(file.path().filename().string());
    } catch (...) {
      continue;
    }
    auto gid = parseGid(readLine(file.path()));
    if (!gid) continue;
    entry.gid = *gid;
    if (entry.isZero()) continue;
    // Reading the type of an unused entry fails (EINVAL); IB ports have one kind only.
    const std::string type = readLine(base / "gid_attrs/types" / std::to_string(entry.index));
    entry.type = infiniband ? GidType::kIb : parseGidType(type);
    entry.netdev = readLine(base / "gid_attrs/ndevs" / std::to_string(entry.index));
    table.push_back(entry);
  }
  std::sort(table.begin(), table.end(),
            [](const GidEntry& a, const GidEntry& b) { return a.index < b.index; });
  return table;
}

GidChoice selectGid(const std::vector<GidEntry>& table, bool infiniband, AddressFamily family,
                    const std::string& netdev) {
  GidChoice choice;
  if (infiniband) {
    for (const auto& e : table) {
      if (e.index == 0) {
        choice.index = 0;
        choice.reason = "InfiniBand port GID (index 0)";
        return choice;
      }
    }
    choice.reason = "the InfiniBand port has no GID at index 0";
    return choice;
  }
  // Lower score is better; candidates that do not fit at all are skipped.
  int best_score = 1 << 30;
  for (const auto& e : table) {
    if (e.isZero() || (e.type != GidType::kRoceV2 && e.type != GidType::kRoceV1)) continue;
    const bool family_fits =
        family == AddressFamily::kIpv4 ? e.isIpv4Mapped() : (!e.isIpv4Mapped() && !e.isLinkLocal());
    if (!family_fits) continue;
    int score = e.index;
    if (e.type != GidType::kRoceV2) score += 1 << 20;  // v1 only when there is no v2
    if (!netdev.empty() && e.netdev != netdev) score += 1 << 24;
    if (score < best_score) {
      best_score = score;
      choice.index = e.index;
      choice.reason = std::string(e.type == GidType::kRoceV2 ? "RoCE v2" : "RoCE v1") + " " +
                      (family == AddressFamily::kIpv4 ? "IPv4" : "IPv6") + " GID " + e.text() +
                      (e.netdev.empty() ? "" : " on " + e.netdev);
    }
  }
  if (choice.index < 0) {
    choice.reason = std::string("no RoCE GID with an ") +
                    (family == AddressFamily::kIpv4 ? "IPv4" : "IPv6") +
                    " address (is an address configured on the port's Ethernet device? set "
                    "RAILSHARD_IB_GID_INDEX to choose one)";
  }
  return choice;
}

}  // namespace railshard::transport::links::ibverbs
