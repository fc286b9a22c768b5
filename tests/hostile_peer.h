#pragma once

// What tests that play an attacker need: a raw connection to a port, sends that tolerate the
// other side closing half-way, a check that the other side closed, and a capture of what the
// library logs to stderr (every refusal names its reason there).
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/error.h"
#include "tests/test_util.h"
#include "transport/links/tcp/socket.h"

namespace railshard::test {

// Sends everything this process writes to stderr (the library logs there) to a file as well
// as holding it for inspection; restores stderr when destroyed.
class StderrCapture {
 public:
  StderrCapture() : path_(tempPath("captured_stderr.log")) {
    std::fflush(stderr);
    saved_ = ::dup(STDERR_FILENO);
    const int fd = ::open(path_.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_APPEND, 0644);
    ::dup2(fd, STDERR_FILENO);
    ::close(fd);
  }
  ~StderrCapture() {
    std::fflush(stderr);
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    // Echo it, so a failure's log is in the test output.
    std::fputs(text().c_str(), stderr);
    ::unlink(path_.c_str());
  }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;

  std::string text() const {
    std::fflush(stderr);
    std::ifstream in(path_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // Waits until `needle` has been logged; false after `limit`.
  bool waitFor(const std::string& needle, std::chrono::milliseconds limit) const {
    const Deadline deadline = deadlineAfter(limit);
    while (Clock::now() < deadline) {
      if (text().find(needle) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

 private:
  std::string path_;
  int saved_ = -1;
};

inline transport::links::tcp::Fd connectTo(const std::string& host_port) {
  return transport::links::tcp::connectWithRetry(
      transport::links::tcp::resolve(host_port, "attacker"), deadlineAfter(std::chrono::seconds(5)),
      "attacker");
}

// Sends what it can: the other side may close half-way, which is what it should do.
inline void sendSome(int fd, const void* data, size_t size) {
  try {
    transport::links::tcp::sendAll(fd, data, size, deadlineAfter(std::chrono::seconds(5)),
                                   "attacker");
  } catch (const Error&) {
  }
}
inline void sendSome(int fd, const std::vector<uint8_t>& bytes) {
  sendSome(fd, bytes.data(), bytes.size());
}

// True when the other side closes `fd` within `limit` (reading and discarding first).
inline bool closedByPeer(int fd, std::chrono::milliseconds limit) {
  const Deadline deadline = deadlineAfter(limit);
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    uint8_t buffer[512];
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n == 0) return true;
    if (n < 0 && errno != EINTR && errno != EAGAIN) return true;
  }
  return false;
}

}  // namespace railshard::test
