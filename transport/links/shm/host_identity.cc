#include "transport/links/shm/host_identity.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

namespace railshard::transport::links::shm {

std::string hostIdentity() {
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  struct stat info {};
  std::string shm = "no-dev-shm";
  if (::stat("/dev/shm", &info) == 0) {
    shm = std::to_string(info.st_dev) + ":" + std::to_string(info.st_ino);
  }
  return std::string(host) + "/" + boot_id + "/" + shm;
}

std::string machineOf(const std::string& identity) {
  const size_t slash = identity.find('/');
  return slash == std::string::npos ? identity : identity.substr(slash + 1);
}

}  // namespace railshard::transport::links::shm
