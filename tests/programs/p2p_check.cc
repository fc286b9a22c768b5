// A rank program for process-level tests of point-to-point messages: init() from whatever
// launched it, then rounds of a ring exchange (receive from the previous rank, send to the
// next, wait for the send first, then the receive), every message checked byte for byte.
//
//   p2p_check [--rounds N] [--bytes B1,B2,...] [--die-rank R --die-after K]
//
// --die-rank R --die-after K: in round K rank R posts its first send of the round and raises
//   SIGKILL on itself before anyone has read it.
// On success every rank prints "rank R ok payload=P tcp_bytes=T sockets=S": P payload bytes it
// sent, T bytes its transport's connections carried (0 when every message went through shared
// memory), S the sockets the process held with its communicator up (/proc/self/fd). Every
// error is printed with its class name and exits 1.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "launcher/init.h"
#include "transport/transport.h"

namespace {

uint8_t patternByte(int from, int round, size_t i) {
  return static_cast<uint8_t>(i * 131 + static_cast<size_t>(from) * 17 +
                              static_cast<size_t>(round) * 5);
}

// Descriptors of this process that are sockets (store, listeners, connections).
int countSockets() {
  int count = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (const dirent* entry = ::readdir(dir)) {
    char target[64] = {};
    const std::string path = std::string("/proc/self/fd/") + entry->d_name;
    const ssize_t n = ::readlink(path.c_str(), target, sizeof(target) - 1);
    if (n > 0 && std::strncmp(target, "socket:", 7) == 0) ++count;
  }
  ::closedir(dir);
  return count;
}

int run(int argc, char** argv) {
  int rounds = 5;
  int die_rank = -1;
  int die_after = 0;
  std::vector<size_t> sizes = {0, 1, 1000, 4032, 4033, (size_t{1} << 20) + 3};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--rounds") {
      rounds = std::stoi(value);
    } else if (flag == "--die-rank") {
      die_rank = std::stoi(value);
    } else if (flag == "--die-after") {
      die_after = std::stoi(value);
    } else if (flag == "--bytes") {
      sizes.clear();
      std::stringstream list(value);
      for (std::string item; std::getline(list, item, ',');) sizes.push_back(std::stoull(item));
    } else {
      std::fprintf(stderr, "p2p_check: unknown option %s\n", flag.c_str());
      return 2;
    }
  }
  auto comm = railshard::init();
  const int me = comm->rank();
  const int n = comm->size();
  const int next = (me + 1) % n;
  const int prev = (me + n - 1) % n;
  uint64_t payload = 0;
  for (int round = 0; round < rounds; ++round) {
    for (size_t bytes : sizes) {
      std::vector<uint8_t> out(bytes);
      for (size_t i = 0; i < bytes; ++i) out[i] = patternByte(me, round, i);
      std::vector<uint8_t> in(bytes, 0xEE);
      auto r = comm->irecv(in.data(), bytes, railshard::DataType::kUInt8, prev, 5);
      auto s = comm->isend(out.data(), bytes, railshard::DataType::kUInt8, next, 5);
      if (me == die_rank && round == die_after) ::raise(SIGKILL);
      comm->wait(s);
      comm->wait(r);
      for (size_t i = 0; i < bytes; ++i) {
        if (in[i] != patternByte(prev, round, i)) {
          std::fprintf(stderr, "rank %d: round %d, %zu bytes from rank %d: byte %zu differs\n", me,
                       round, bytes, prev, i);
          return 1;
        }
      }
      payload += bytes;
    }
  }
  uint64_t tcp = 0;
  for (const auto& rail : comm->transport().rails()) tcp += rail.bytes_sent;
  const int sockets = countSockets();
  comm->barrier();
  std::printf("rank %d ok payload=%llu tcp_bytes=%llu sockets=%d\n", me,
              static_cast<unsigned long long>(payload), static_cast<unsigned long long>(tcp),
              sockets);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const railshard::PeerLostError& e) {
    std::fprintf(stderr, "PeerLostError: %s\n", e.what());
  } catch (const railshard::TimeoutError& e) {
    std::fprintf(stderr, "TimeoutError: %s\n", e.what());
  } catch (const railshard::MismatchError& e) {
    std::fprintf(stderr, "MismatchError: %s\n", e.what());
  } catch (const railshard::Error& e) {
    std::fprintf(stderr, "Error: %s\n", e.what());
  }
  return 1;
}
