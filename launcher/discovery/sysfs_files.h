#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

// Small readers for sysfs-like trees. Every function takes full paths (the caller prefixes its
// sysfs root), never throws, and treats "missing", "unreadable" and "kernel says EINVAL" (as
// reading speed of a down link does) alike: as absent.
namespace railshard::launcher::discovery {

// The file's first line without trailing whitespace; nullopt when it cannot be read.
std::optional<std::string> readLine(const std::string& path);
// The whole file; nullopt when it cannot be read.
std::optional<std::string> readText(const std::string& path);
// The first line parsed as an integer (decimal, or hex with 0x); nullopt when absent or not a
// number.
std::optional<long long> readInteger(const std::string& path);

bool pathExists(const std::string& path);
bool isDirectory(const std::string& path);
// Entry names of a directory, sorted; empty when it does not exist.
std::vector<std::string> listDirectory(const std::string& path);
// The path with every symlink resolved; "" when it does not exist. Relative sysfs links
// ("../../devices/...") stay inside a fake root, which is what lets tests model /sys.
std::string resolvePath(const std::string& path);

// True for a PCI address with domain, "0000:17:00.0".
bool looksLikePciAddress(const std::string& text);
// The last path component that looks like a PCI address: the PCI device a sysfs device
// directory belongs to (for virtio-net, ".../0000:00:03.0/virtio2" gives "0000:00:03.0").
std::string nearestPciAddress(const std::string& resolved_path);

// CPU lists as sysfs writes them ("0-15,32-47").
std::set<int> parseCpuList(const std::string& text);
std::string formatCpuList(const std::set<int>& cpus);

}  // namespace railshard::launcher::discovery
