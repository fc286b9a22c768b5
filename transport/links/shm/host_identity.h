#pragma once

#include <string>

namespace railshard::transport::links::shm {

// Identifies "can share memory with": the kernel instance (boot id) plus the /dev/shm
// filesystem (device and inode), so two containers on one host with separate /dev/shm mounts
// count as different hosts, as they must.
std::string hostIdentity();

}  // namespace railshard::transport::links::shm
