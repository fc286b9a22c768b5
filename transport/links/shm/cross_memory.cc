#include "transport/links/shm/cross_memory.h"

#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "base/error.h"

namespace railshard::transport::links::shm {

void readFromProcess(int pid, uint64_t address, void* out, size_t bytes) {
  size_t done = 0;
  while (done < bytes) {
    iovec local{static_cast<uint8_t*>(out) + done, bytes - done};
    iovec remote{reinterpret_cast<void*>(address + done), bytes - done};
    const ssize_t n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == ESRCH) {
      throw PeerLostError("process " + std::to_string(pid) + " is gone (reading its buffer)");
    }
    if (n <= 0) {
      throw Error("cross-memory read of " + std::to_string(bytes - done) + " bytes from process " +
                  std::to_string(pid) +
                  " failed: " + (n < 0 ? std::strerror(errno) : "nothing was read"));
    }
    done += static_cast<size_t>(n);
  }
}

bool canReadProcess(int pid, uint64_t address, uint64_t expect) {
  uint64_t value = 0;
  iovec local{&value, sizeof(value)};
  iovec remote{reinterpret_cast<void*>(address), sizeof(value)};
  return ::process_vm_readv(pid, &local, 1, &remote, 1, 0) == sizeof(value) && value == expect;
}

}  // namespace railshard::transport::links::shm
