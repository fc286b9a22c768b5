// nccl_net_bench: NCCL's traffic through a network plugin, without NCCL or a GPU. One process
// per host: the receiver listens on one device (--comms connections, each its own listen comm
// and 128-byte handle, as NCCL's proxy does), writes the handles to a file both hosts see, and
// receives; the sender reads them, connects, and streams --messages messages of --bytes per
// connection with --inflight requests in flight on each (NCCL_STEPS = 8), as NCCL's channels
// do. Every byte is checked on arrival against the pattern its sender wrote. Both print
//   result role=R comms=C bytes=B seconds=S gbps=G
//   timeline t=T epoch=E gbps=G  (every --window-ms, payload delivered in the window ending
//                                 T s after the start, E on the system clock)
// and the plugin's log lines behind "[E] " (NCCL_DEBUG=INFO's lines, timed).
// Any plugin that exports ncclNetPlugin_v11 works (--plugin PATH), e.g. to compare railshard's
// fused device with another. docs/nccl-plugin.md has the figures and the commands.
#include <dlfcn.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "plugins/nccl/net_api.h"

namespace {

namespace nccl = railshard::plugins::nccl;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string plugin;
  std::string role;
  std::string handle_file;
  int device = -1;  // -1: the last one (railshard's fused device)
  int comms = 8;
  size_t bytes = 4 << 20;
  int messages = 50;
  int inflight = 8;
  int window_ms = 250;
  bool check = true;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "nccl_net_bench: %s\n", what.c_str());
  std::exit(1);
}

// Seconds since the epoch: the clock the timeline, the log lines and a script that takes a rail
// down share (benchmarks/nccl_plugin_rail_down.sh).
double epochSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void logLine(nccl::LogLevel level, unsigned long, const char*, int, const char* format, ...) {
  // NCCL_DEBUG=INFO's lines; all of them (TRACE too) with RAILSHARD_LOG_LEVEL set.
  static const bool all = std::getenv("RAILSHARD_LOG_LEVEL") != nullptr;
  if (level > nccl::LogLevel::kInfo && !all) return;
  std::fprintf(stderr, "[%.3f] ", epochSeconds());
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fputc('\n', stderr);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--plugin") {
      o.plugin = value();
    } else if (arg == "--role") {
      o.role = value();
    } else if (arg == "--handle-file") {
      o.handle_file = value();
    } else if (arg == "--device") {
      o.device = std::stoi(value());
    } else if (arg == "--comms") {
      o.comms = std::stoi(value());
    } else if (arg == "--bytes") {
      o.bytes = std::stoull(value());
    } else if (arg == "--messages") {
      o.messages = std::stoi(value());
    } else if (arg == "--inflight") {
      o.inflight = std::stoi(value());
    } else if (arg == "--window-ms") {
      o.window_ms = std::stoi(value());
    } else if (arg == "--check") {
      o.check = value() != "0";
    } else {
      die("unknown option " + arg);
    }
  }
  if (o.plugin.empty() || o.handle_file.empty() || (o.role != "send" && o.role != "recv")) {
    die("usage: --plugin PATH --role send|recv --handle-file F [--device D] [--comms C] "
        "[--bytes B] [--messages N] [--inflight K] [--window-ms W] [--check 0|1]");
  }
  if (o.comms < 1 || o.inflight < 1 || o.inflight > nccl::kMaxRequests || o.messages < 1) {
    die("--comms, --messages >= 1; --inflight 1 to 32");
  }
  return o;
}

uint8_t patternByte(int comm, int message, size_t offset) {
  return static_cast<uint8_t>(offset * 131 + static_cast<size_t>(comm) * 17 +
                              static_cast<size_t>(message) * 29 + (offset >> 12));
}

void fill(std::vector<uint8_t>& buffer, int comm, int message) {
  for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = patternByte(comm, message, i);
}

// Payload delivered per window since the start, for the timeline.
struct Timeline {
  Clock::time_point start = Clock::now();
  double start_epoch = epochSeconds();
  int window_ms = 250;
  std::vector<uint64_t> bytes;
  void add(uint64_t n) {
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    const size_t window = static_cast<size_t>(ms / window_ms);
    if (bytes.size() <= window) bytes.resize(window + 1, 0);
    bytes[window] += n;
  }
  void print() const {
    for (size_t w = 0; w < bytes.size(); ++w) {
      const double end = (w + 1) * window_ms / 1000.0;
      std::printf("timeline t=%.3f epoch=%.3f gbps=%.4f\n", end, start_epoch + end,
                  bytes[w] * 8.0 / (window_ms / 1000.0) / 1e9);
    }
  }
};

std::string hex(const void* data, size_t n) {
  std::string out;
  char two[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(two, sizeof(two), "%02x", static_cast<const uint8_t*>(data)[i]);
    out += two;
  }
  return out;
}

void unhex(const std::string& text, void* data, size_t n) {
  if (text.size() != 2 * n) die("a handle line of " + std::to_string(text.size()) + " hex digits");
  for (size_t i = 0; i < n; ++i) {
    static_cast<uint8_t*>(data)[i] =
        static_cast<uint8_t>(std::stoul(text.substr(2 * i, 2), nullptr, 16));
  }
}

void check(nccl::Result r, const char* what) {
  if (r != nccl::Result::kSuccess)
    die(std::string(what) + " failed (ncclResult " + std::to_string(static_cast<int>(r)) + ")");
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  void* library = ::dlopen(o.plugin.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) die(::dlerror());
  auto* net = static_cast<nccl::NetV11*>(::dlsym(library, "ncclNetPlugin_v11"));
  if (net == nullptr) die("no ncclNetPlugin_v11 in " + o.plugin);
  void* ctx = nullptr;
  nccl::CommConfig config{-1};
  check(net->init(&ctx, 1, &config, logLine, nullptr), "init");
  int ndev = 0;
  check(net->devices(&ndev), "devices");
  const int dev = o.device >= 0 ? o.device : ndev - 1;
  nccl::PropertiesV11 props{};
  check(net->getProperties(dev, &props), "getProperties");
  std::fprintf(stderr, "nccl_net_bench: %s device %d %s, %d Mbit/s\n", o.role.c_str(), dev,
               props.base.name, props.base.speed);

  std::vector<void*> comms(static_cast<size_t>(o.comms), nullptr);
  const auto connect_until = Clock::now() + std::chrono::seconds(60);
  if (o.role == "recv") {
    std::vector<void*> listens(comms.size());
    std::ostringstream lines;
    for (auto& listen : listens) {
      char handle[nccl::kHandleBytes] = {};
      check(net->listen(ctx, dev, handle, &listen), "listen");
      lines << hex(handle, sizeof(handle)) << "\n";
    }
    const std::string tmp = o.handle_file + ".tmp";
    std::ofstream(tmp) << lines.str();
    std::rename(tmp.c_str(), o.handle_file.c_str());
    for (size_t c = 0; c < comms.size(); ++c) {
      while (comms[c] == nullptr) {
        check(net->accept(listens[c], &comms[c], nullptr), "accept");
        if (Clock::now() > connect_until) die("no connection within 60 s");
        if (comms[c] == nullptr) std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      net->closeListen(listens[c]);
    }
  } else {
    std::vector<std::string> handles;
    while (handles.size() < comms.size()) {
      handles.clear();
      std::ifstream in(o.handle_file);
      for (std::string line; std::getline(in, line);) handles.push_back(line);
      if (handles.size() < comms.size()) {
        if (Clock::now() > connect_until) die("no handle file within 60 s");
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    std::vector<std::vector<char>> raw(comms.size(), std::vector<char>(nccl::kHandleBytes));
    for (size_t c = 0; c < comms.size(); ++c) unhex(handles[c], raw[c].data(), nccl::kHandleBytes);
    bool all = false;
    while (!all) {
      all = true;
      for (size_t c = 0; c < comms.size(); ++c) {
        if (comms[c] == nullptr)
          check(net->connect(ctx, dev, raw[c].data(), &comms[c], nullptr), "connect");
        all = all && comms[c] != nullptr;
      }
      if (Clock::now() > connect_until) die("not connected within 60 s");
    }
  }

  // Stream: per comm up to --inflight requests, --messages in all.
  struct Slot {
    void* request = nullptr;
    int message = -1;
    std::vector<uint8_t> buffer;
  };
  const bool sending = o.role == "send";
  std::vector<std::vector<Slot>> slots(comms.size(),
                                       std::vector<Slot>(static_cast<size_t>(o.inflight)));
  std::vector<int> posted(comms.size(), 0), finished(comms.size(), 0);
  for (auto& per_comm : slots) {
    for (auto& slot : per_comm) slot.buffer.resize(o.bytes);
  }
  void* mhandle = nullptr;
  check(net->regMr(comms[0], slots[0][0].buffer.data(), o.bytes, nccl::kPtrHost, &mhandle),
        "regMr");
  Timeline timeline;
  timeline.window_ms = o.window_ms;
  uint64_t total = 0;
  uint64_t wrong = 0;
  const auto start = Clock::now();
  const auto give_up = start + std::chrono::seconds(600);
  int remaining = o.comms * o.messages;
  while (remaining > 0) {
    if (Clock::now() > give_up) die("not finished within 600 s");
    for (size_t c = 0; c < comms.size(); ++c) {
      for (auto& slot : slots[c]) {
        if (slot.request == nullptr && posted[c] < o.messages) {
          slot.message = posted[c];
          if (sending) {
            if (o.check) fill(slot.buffer, static_cast<int>(c), slot.message);
            check(net->isend(comms[c], slot.buffer.data(), o.bytes, 0, mhandle, nullptr,
                             &slot.request),
                  "isend");
          } else {
            void* data[1] = {slot.buffer.data()};
            size_t sizes[1] = {o.bytes};
            int tags[1] = {0};
            void* handles[1] = {mhandle};
            check(net->irecv(comms[c], 1, data, sizes, tags, handles, nullptr, &slot.request),
                  "irecv");
          }
          if (slot.request != nullptr) ++posted[c];
        }
        if (slot.request == nullptr) continue;
        int done = 0;
        int size = 0;
        check(net->test(slot.request, &done, &size), "test");
        if (!done) continue;
        slot.request = nullptr;
        ++finished[c];
        --remaining;
        total += static_cast<uint64_t>(size);
        timeline.add(static_cast<uint64_t>(size));
        if (!sending && o.check) {
          if (static_cast<size_t>(size) != o.bytes) ++wrong;
          for (size_t i = 0; i < o.bytes; ++i) {
            if (slot.buffer[i] != patternByte(static_cast<int>(c), slot.message, i)) {
              ++wrong;
              break;
            }
          }
        }
      }
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  timeline.print();
  std::printf("result role=%s comms=%d bytes=%llu seconds=%.3f gbps=%.4f wrong=%llu\n",
              o.role.c_str(), o.comms, static_cast<unsigned long long>(total), seconds,
              total * 8.0 / seconds / 1e9, static_cast<unsigned long long>(wrong));
  std::fflush(stdout);
  net->deregMr(comms[0], mhandle);
  for (void* comm : comms) {
    if (sending) {
      net->closeSend(comm);
    } else {
      net->closeRecv(comm);
    }
  }
  net->finalize(ctx);
  return wrong == 0 ? 0 : 1;
}
