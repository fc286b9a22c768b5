#pragma once

#include <string>

namespace railshard::transport::links::shm {

// Identifies "can share memory with": the kernel instance (boot id) plus the /dev/shm
// filesystem (device and inode), so two containers on one host with separate /dev/shm mounts
// count as different hosts, as they must.
std::string hostIdentity();
// The machine part of a hostIdentity() (its kernel instance and /dev/shm, not its host name):
// ranks that report different host names (UTS namespaces, a test bed of "hosts" on one box)
// but the same machine share its cores.
std::string machineOf(const std::string& identity);

}  // namespace railshard::transport::links::shm
