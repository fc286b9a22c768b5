// A rank program for tests/launch_test.cc: reports what railshard-launch handed this rank.
//
//   launch_probe          prints "rank=R store_fd=F|none listening=FD,...|none port_match=yes|no
//                         launcher_copy=closed|open|unknown" (the last two only with a store fd)
//   launch_probe exchange rank 0 accepts one connection per other rank on the inherited store
//                         socket and prints what each sends; the others connect to
//                         RAILSHARD_STORE_ADDR and send "hello from rank R"
//   launch_probe lost-mark R
//                         for railshard-launch --elastic: rank R writes "rank R giving up on
//                         purpose" to stderr and exits 3; every other rank connects to the
//                         store through launcher::bootstrapStore(), waits for the launcher's
//                         mark railshard/lost/R and prints "lost R: <its value>"
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "launcher/init.h"

namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

bool isListeningSocket(int fd) {
  int accepting = 0;
  socklen_t length = sizeof(accepting);
  return ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &length) == 0 && accepting == 1;
}

std::vector<int> openDescriptors() {
  std::vector<int> fds;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return fds;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    const int fd = std::atoi(entry->d_name);
    if (fd != ::dirfd(dir)) fds.push_back(fd);
  }
  ::closedir(dir);
  return fds;
}

// Whether the launcher (our parent) still holds the socket with inode `inode`. It closes its
// copy only after forking every rank, so give it a moment.
std::string launcherCopy(ino_t inode) {
  const std::string wanted = "socket:[" + std::to_string(inode) + "]";
  const std::string dir_name = "/proc/" + std::to_string(::getppid()) + "/fd";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (true) {
    DIR* dir = ::opendir(dir_name.c_str());
    if (dir == nullptr) return "unknown";
    bool found = false;
    while (const dirent* entry = ::readdir(dir)) {
      char target[256] = {0};
      const std::string path = dir_name + "/" + entry->d_name;
      if (::readlink(path.c_str(), target, sizeof(target) - 1) > 0 && wanted == target) {
        found = true;
      }
    }
    ::closedir(dir);
    if (!found) return "closed";
    if (std::chrono::steady_clock::now() > deadline) return "open";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

int report() {
  std::string line = "rank=" + env("RAILSHARD_RANK");
  const std::string store_fd = env("RAILSHARD_STORE_FD");
  line += " store_fd=" + (store_fd.empty() ? std::string("none") : store_fd);
  std::string listening;
  for (const int fd : openDescriptors()) {
    if (!isListeningSocket(fd)) continue;
    if (!listening.empty()) listening += ',';
    listening += std::to_string(fd);
  }
  line += " listening=" + (listening.empty() ? std::string("none") : listening);
  if (!store_fd.empty()) {
    const int fd = std::atoi(store_fd.c_str());
    sockaddr_storage addr{};
    socklen_t length = sizeof(addr);
    std::string bound = "?";
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0 &&
        addr.ss_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
      char host[INET_ADDRSTRLEN] = {0};
      ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
      bound = std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
    }
    line += std::string(" port_match=") + (bound == env("RAILSHARD_STORE_ADDR") ? "yes" : "no");
    struct stat info {};
    line += " launcher_copy=" + (::fstat(fd, &info) == 0 ? launcherCopy(info.st_ino) : "?");
  }
  std::printf("%s\n", line.c_str());
  return 0;
}

int exchange() {
  const int rank = std::atoi(env("RAILSHARD_RANK").c_str());
  const int world_size = std::atoi(env("RAILSHARD_WORLD_SIZE").c_str());
  if (rank == 0) {
    const int listener = std::atoi(env("RAILSHARD_STORE_FD").c_str());
    for (int peer = 1; peer < world_size; ++peer) {
      pollfd p{listener, POLLIN, 0};
      if (::poll(&p, 1, 10000) != 1) {
        std::printf("accept timed out\n");
        return 1;
      }
      const int conn = ::accept(listener, nullptr, nullptr);
      char buffer[128] = {0};
      size_t got = 0;
      ssize_t n;
      while (got < sizeof(buffer) - 1 &&
             (n = ::read(conn, buffer + got, sizeof(buffer) - 1 - got)) > 0) {
        got += static_cast<size_t>(n);
      }
      std::printf("got: %s\n", buffer);
      ::close(conn);
    }
    return 0;
  }
  const std::string addr = env("RAILSHARD_STORE_ADDR");
  const auto colon = addr.rfind(':');
  sockaddr_in peer{};
  peer.sin_family = AF_INET;
  peer.sin_port = htons(static_cast<uint16_t>(std::atoi(addr.substr(colon + 1).c_str())));
  ::inet_pton(AF_INET, addr.substr(0, colon).c_str(), &peer.sin_addr);
  // The socket listens from before any rank starts: the first connect must succeed.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&peer), sizeof(peer)) != 0) {
    std::printf("connect failed: %s\n", std::strerror(errno));
    return 1;
  }
  const std::string message = "hello from rank " + std::to_string(rank);
  if (::write(fd, message.data(), message.size()) != static_cast<ssize_t>(message.size())) {
    return 1;
  }
  ::close(fd);
  return 0;
}

int lostMark(int lost_rank) {
  const int rank = std::atoi(env("RAILSHARD_RANK").c_str());
  if (rank == lost_rank) {
    std::fprintf(stderr, "rank %d giving up on purpose\n\n", rank);  // blank line: not quoted
    return 3;
  }
  try {
    railshard::launcher::Bootstrap boot = railshard::launcher::bootstrapStore();
    const std::string key = "railshard/lost/" + std::to_string(lost_rank);
    const std::string value = boot.store->getString(key, std::chrono::seconds(15));
    std::printf("lost %d: %s\n", lost_rank, value.c_str());
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "rank %d: %s\n", rank, error.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "exchange") == 0) return exchange();
  if (argc > 2 && std::strcmp(argv[1], "lost-mark") == 0) return lostMark(std::atoi(argv[2]));
  return report();
}
