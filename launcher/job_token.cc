#include "launcher/job_token.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "base/error.h"

namespace railshard::launcher {

namespace {

constexpr size_t kTokenBytes = 16;

// getrandom(2) first: it needs no file descriptor and works in a chroot without /dev. The
// device is the fallback for kernels or seccomp profiles that refuse the system call.
bool fillFromGetrandom(uint8_t* data, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::getrandom(data + done, size - done, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

void fillFromUrandom(uint8_t* data, size_t size) {
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw Error(std::string("cannot make a job token: getrandom failed and /dev/urandom: ") +
                std::strerror(errno));
  }
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      throw Error(std::string("cannot make a job token: reading /dev/urandom: ") +
                  std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
}

}  // namespace

std::string makeJobToken() {
  uint8_t bytes[kTokenBytes];
  if (!fillFromGetrandom(bytes, sizeof(bytes))) fillFromUrandom(bytes, sizeof(bytes));
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token;
  token.reserve(2 * kTokenBytes);
  for (const uint8_t byte : bytes) {
    token.push_back(kHex[byte >> 4]);
    token.push_back(kHex[byte & 0xf]);
  }
  return token;
}

}  // namespace railshard::launcher
