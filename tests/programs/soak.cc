// A bounded soak rank program: thousands of collectives of random kind, dtype, op, size and
// placement, every element of every result checked against a scalar reference, and the
// process's open file descriptors and resident memory sampled after a warm-up and at the end
// so a leak per collective shows up as growth.
//
//   soak [--seconds S] [--max-iterations N] [--seed X] [--max-bytes B (2 MiB)] [--warmup K]
//
// Every rank draws the same sequence of collectives from --seed (so the ranks must be given
// the same seed); each rank's input is a function of (seed, iteration, rank, element), so every
// rank computes every other rank's input, and from them the exact expected result, itself.
// Values are small integers scaled to each dtype so every partial result of every reduction
// order is exact (bf16 holds integers up to 256, f16 up to 2048, f32 up to 2^24): any
// difference at all is a wrong element, never rounding.
//
// One line per rank at the end (stdout):
//   soak rank R of N over tcp|shm: iterations I collectives C bytes B seconds T fds F0 -> F1
//   rss_kib R0 -> R1 (max RM) wrong W seed X
// Exit status: 0 all correct, 2 some element wrong (the first few are described on stderr),
// 1 a railshard error (its class and message on stderr).
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/types.h"
#include "launcher/init.h"
#include "tests/reference.h"

namespace {

using railshard::DataType;
using railshard::ReduceOp;

// The soak draws from every dtype and op; a new one must get a reference here (and in
// tests/reference.h) before it can be drawn.
static_assert(railshard::kNumDataTypes == 7 && railshard::kNumReduceOps == 5,
              "extend exactLimit(), Inputs and tests/reference.h to the new dtype or op");

enum class Kind { kAllreduce, kReduceScatter, kAllgather, kBroadcast, kBarrier };

const char* kindName(Kind kind) {
  switch (kind) {
    case Kind::kAllreduce:
      return "allreduce";
    case Kind::kReduceScatter:
      return "reduce_scatter";
    case Kind::kAllgather:
      return "allgather";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kBarrier:
      return "barrier";
  }
  return "?";
}

// splitmix64's finaliser: a cheap, well-mixed function of its argument, so element values
// can be computed independently (and identically on every rank) in any order.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Largest magnitude every value and every partial result must stay within to be exact in
// `dtype` (and in the double the reference compares in).
int64_t exactLimit(DataType dtype) {
  switch (dtype) {
    case DataType::kBFloat16:
      return 256;
    case DataType::kFloat16:
      return 2048;
    case DataType::kFloat32:
      return int64_t{1} << 24;
    case DataType::kInt32:
      return (int64_t{1} << 31) - 1;
    case DataType::kUInt8:
      return 255;
    case DataType::kFloat64:
    case DataType::kInt64:
      return int64_t{1} << 40;
  }
  return 1;
}

struct Plan {
  Kind kind = Kind::kBarrier;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;  // allreduce/broadcast: count; reduce_scatter: recv_count; allgather: send
  bool in_place = false;
  int root = 0;
};

// Draws iteration `it`'s collective; a pure function of (seed, it), so every rank agrees.
Plan drawPlan(uint64_t seed, uint64_t it, int size, size_t max_bytes) {
  uint64_t state = mix(seed ^ mix(it));
  auto next = [&]() { return state = mix(state); };
  Plan plan;
  const uint64_t k = next() % 100;
  plan.kind = k < 35   ? Kind::kAllreduce
              : k < 55 ? Kind::kReduceScatter
              : k < 75 ? Kind::kAllgather
              : k < 92 ? Kind::kBroadcast
                       : Kind::kBarrier;
  plan.dtype = static_cast<DataType>(next() % railshard::kNumDataTypes);
  plan.op = static_cast<ReduceOp>(next() % railshard::kNumReduceOps);
  plan.in_place = (next() & 1) != 0;
  plan.root = static_cast<int>(next() % static_cast<uint64_t>(size));
  const size_t element = railshard::sizeOf(plan.dtype);
  const uint64_t c = next() % 100;
  if (c < 4) {
    plan.count = 0;
  } else if (c < 8) {
    plan.count = 1;
  } else {
    // Log-uniform in bytes from one element to max_bytes: every size class (inline, one slot,
    // pipelined, every tuner band) gets a similar share of iterations.
    const double u = static_cast<double>(next() >> 11) / static_cast<double>(uint64_t{1} << 53);
    const double bytes = std::exp(u * std::log(static_cast<double>(max_bytes)));
    size_t total = std::max<size_t>(1, static_cast<size_t>(bytes) / element);
    // reduce_scatter's send and allgather's recv hold size blocks: keep them within max_bytes.
    if (plan.kind == Kind::kReduceScatter || plan.kind == Kind::kAllgather) {
      total = std::max<size_t>(1, total / static_cast<size_t>(size));
    }
    plan.count = total;
  }
  return plan;
}

// Rank `rank`'s input element `index` of the collective `plan` at iteration `it`, as an
// integer every dtype holds exactly; sized so the reduction over `size` ranks stays exact.
class Inputs {
 public:
  Inputs(uint64_t seed, uint64_t it, const Plan& plan, int size)
      : plan_(plan), size_(size), unsigned_(plan.dtype == DataType::kUInt8) {
    for (int r = 0; r < size; ++r) bases_.push_back(mix(seed ^ mix(it) ^ mix(0x5eed0000u + r)));
    const int64_t limit = exactLimit(plan.dtype);
    const bool reduces = plan.kind == Kind::kAllreduce || plan.kind == Kind::kReduceScatter;
    if (reduces && (plan.op == ReduceOp::kSum || plan.op == ReduceOp::kAvg)) {
      bound_ = limit / size;  // |sum| <= size * bound_ <= limit
    } else {
      bound_ = limit;  // min, max, and data that is only moved
    }
    // Prod: at most 4 ranks contribute a factor other than 1 at any element, each of
    // magnitude <= 3, so |product| <= 81, exact even in bf16 and uint8.
    prod_stride_ = std::max(3, (size + 3) / 4);
  }

  int64_t value(int rank, size_t index) const {
    const uint64_t h = mix(bases_[static_cast<size_t>(rank)] + index * 0x9e3779b97f4a7c15ull);
    const bool reduces = plan_.kind == Kind::kAllreduce || plan_.kind == Kind::kReduceScatter;
    if (reduces && plan_.op == ReduceOp::kProd) {
      if ((static_cast<size_t>(rank) + index) % static_cast<size_t>(prod_stride_) != 0) return 1;
      static const int64_t kSigned[] = {2, -1, 3, -2};
      static const int64_t kUnsigned[] = {2, 3, 1, 2};
      return (unsigned_ ? kUnsigned : kSigned)[h & 3];
    }
    // h * span / 2^64: uniform enough in [0, span), and a multiply where % would divide.
    const uint64_t span = static_cast<uint64_t>(unsigned_ ? bound_ + 1 : 2 * bound_ + 1);
    const auto draw = static_cast<int64_t>((static_cast<unsigned __int128>(h) * span) >> 64);
    return unsigned_ ? draw : draw - bound_;
  }

  // The reduction over every rank's element `index`, as the dtype holds it.
  double reduced(size_t index) const {
    int64_t acc = value(0, index);
    for (int r = 1; r < size_; ++r) {
      const int64_t v = value(r, index);
      switch (plan_.op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          acc += v;
          break;
        case ReduceOp::kProd:
          acc *= v;
          break;
        case ReduceOp::kMin:
          acc = std::min(acc, v);
          break;
        case ReduceOp::kMax:
          acc = std::max(acc, v);
          break;
      }
    }
    if (plan_.op != ReduceOp::kAvg) return static_cast<double>(acc);
    // Avg is sum / size: integers truncate toward zero; f64 divides in f64; f32, f16 and bf16
    // divide in f32 and are then rounded once to the element type.
    switch (plan_.dtype) {
      case DataType::kFloat64:
        return static_cast<double>(acc) / size_;
      case DataType::kFloat32:
      case DataType::kFloat16:
      case DataType::kBFloat16: {
        const float quotient = static_cast<float>(acc) / static_cast<float>(size_);
        double cell[1];
        railshard::test::storeValue(cell, 0, plan_.dtype, quotient);
        return railshard::test::loadValue(cell, 0, plan_.dtype);
      }
      default:
        return static_cast<double>(acc / size_);
    }
  }

 private:
  Plan plan_;
  int size_;
  bool unsigned_;
  int64_t bound_ = 0;
  int prod_stride_ = 3;
  std::vector<uint64_t> bases_;
};

// " 127.0.0.1:A -> 127.0.0.1:B" for a connected TCP socket, " listening on ..." for a
// listener: enough to tell a store connection from a peer connection.
std::string socketEnds(int fd) {
  auto text = [](const sockaddr_storage& address) {
    if (address.ss_family != AF_INET) return std::string("?");
    const auto& in = reinterpret_cast<const sockaddr_in&>(address);
    char host[INET_ADDRSTRLEN] = "?";
    ::inet_ntop(AF_INET, &in.sin_addr, host, sizeof(host));
    std::string out = host;
    out += ':';
    out += std::to_string(ntohs(in.sin_port));
    return out;
  };
  sockaddr_storage local{};
  sockaddr_storage peer{};
  socklen_t local_length = sizeof(local);
  socklen_t peer_length = sizeof(peer);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) != 0) return "";
  std::string out = " ";
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0) {
    out += "listening on ";
    out += text(local);
    return out;
  }
  out += text(local);
  out += " -> ";
  out += text(peer);
  return out;
}

// Open descriptors and what each refers to ("socket:[123]", "/dev/shm/..."), without the
// directory stream's own.
std::map<int, std::string> openFds() {
  std::map<int, std::string> fds;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return fds;
  const int own = ::dirfd(dir);
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    const int fd = std::atoi(entry->d_name);
    if (fd == own) continue;
    char target[512];
    const std::string path = std::string("/proc/self/fd/") + entry->d_name;
    const ssize_t n = ::readlink(path.c_str(), target, sizeof(target) - 1);
    std::string what = n > 0 ? std::string(target, static_cast<size_t>(n)) : "?";
    if (what.rfind("socket:", 0) == 0) what += socketEnds(fd);
    fds[fd] = what;
  }
  ::closedir(dir);
  return fds;
}

// Names every descriptor opened or closed between the samples, so a failing fd count says
// what kind of descriptor it is.
void describeFdChanges(int rank, const std::map<int, std::string>& before,
                       const std::map<int, std::string>& after) {
  for (const auto& [fd, target] : before) {
    const auto it = after.find(fd);
    if (it == after.end() || it->second != target) {
      std::fprintf(stderr, "rank %d: fd %d (%s) closed during the soak\n", rank, fd,
                   target.c_str());
    }
  }
  for (const auto& [fd, target] : after) {
    const auto it = before.find(fd);
    if (it == before.end() || it->second != target) {
      std::fprintf(stderr, "rank %d: fd %d (%s) opened during the soak\n", rank, fd,
                   target.c_str());
    }
  }
}

struct Rss {
  size_t total_kib = 0;
  // Resident minus shared (file and shared-memory pages): the process's own heap and stacks,
  // where a leak shows. Shared-memory transport pages count in the total as they are first
  // touched, which is not growth of this process.
  size_t private_kib = 0;
};

Rss rss() {
  unsigned long size_pages = 0;
  unsigned long resident_pages = 0;
  unsigned long shared_pages = 0;
  Rss out;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%lu %lu %lu", &size_pages, &resident_pages, &shared_pages) == 3) {
      const size_t page_kib = static_cast<size_t>(::sysconf(_SC_PAGESIZE)) / 1024;
      out.total_kib = resident_pages * page_kib;
      out.private_kib = (resident_pages - shared_pages) * page_kib;
    }
    std::fclose(f);
  }
  return out;
}

constexpr size_t kGuardBytes = 64;
constexpr uint8_t kGuard = 0xa5;
constexpr uint8_t kJunk = 0x5a;

class Soak {
 public:
  Soak(railshard::Communicator& comm, uint64_t seed, size_t max_bytes)
      : comm_(comm), seed_(seed), max_bytes_(max_bytes) {
    // Allocated and touched once, up front: the buffers' own pages must not show up as RSS
    // growth between the two samples.
    a_.assign(max_bytes_ + kGuardBytes, 0);
    b_.assign(max_bytes_ + kGuardBytes, 0);
  }

  // Runs iteration `it` with `plan`; returns false (after describing it) if anything was
  // wrong.
  bool run(uint64_t it, const Plan& plan) {
    const int rank = comm_.rank();
    const int size = comm_.size();
    const size_t element = railshard::sizeOf(plan.dtype);
    const size_t n = plan.count;
    const size_t blocks = static_cast<size_t>(size);
    Inputs in(seed_, it, plan, size);
    it_ = it;
    plan_ = &plan;
    wrong_here_ = 0;
    uint8_t* a = a_.data();
    uint8_t* b = b_.data();
    auto fill = [&](uint8_t* buffer, size_t offset, int source_rank, size_t first, size_t len) {
      for (size_t i = 0; i < len; ++i) {
        railshard::test::storeValue(buffer, offset + i, plan.dtype,
                                    static_cast<double>(in.value(source_rank, first + i)));
      }
    };
    auto guard = [&](uint8_t* buffer, size_t elements) {
      std::memset(buffer + elements * element, kGuard, kGuardBytes);
    };
    switch (plan.kind) {
      case Kind::kAllreduce: {
        fill(a, 0, rank, 0, n);
        uint8_t* recv = plan.in_place ? a : b;
        if (!plan.in_place) std::memset(b, kJunk, n * element);
        guard(a, n);
        guard(b, n);
        timed([&] { comm_.allreduce(a, recv, n, plan.dtype, plan.op); });
        for (size_t i = 0; i < n; ++i) check(recv, i, in.reduced(i), "result", i);
        if (!plan.in_place) checkInput(a, in, rank, 0, n);
        checkGuard(a, n);
        checkGuard(b, n);
        bytes_ += n * element;
        break;
      }
      case Kind::kReduceScatter: {
        fill(a, 0, rank, 0, n * blocks);
        uint8_t* recv = plan.in_place ? a + static_cast<size_t>(rank) * n * element : b;
        if (!plan.in_place) std::memset(b, kJunk, n * element);
        guard(a, n * blocks);
        guard(b, n);
        timed([&] { comm_.reduceScatter(a, recv, n, plan.dtype, plan.op); });
        const size_t first = static_cast<size_t>(rank) * n;
        for (size_t i = 0; i < n; ++i) check(recv, i, in.reduced(first + i), "result", first + i);
        if (!plan.in_place) checkInput(a, in, rank, 0, n * blocks);
        checkGuard(a, n * blocks);
        checkGuard(b, n);
        bytes_ += n * blocks * element;
        break;
      }
      case Kind::kAllgather: {
        // In place: this rank's input already sits at its block of the receive buffer.
        uint8_t* recv = plan.in_place ? a : b;
        uint8_t* send = plan.in_place ? a + static_cast<size_t>(rank) * n * element : a;
        std::memset(recv, kJunk, n * blocks * element);
        fill(send, 0, rank, 0, n);
        guard(a, plan.in_place ? n * blocks : n);
        guard(b, n * blocks);
        timed([&] { comm_.allgather(send, recv, n, plan.dtype); });
        for (size_t r = 0; r < blocks; ++r) {
          for (size_t i = 0; i < n; ++i) {
            check(recv, r * n + i, static_cast<double>(in.value(static_cast<int>(r), i)), "block",
                  r * n + i);
          }
        }
        if (!plan.in_place) checkInput(a, in, rank, 0, n);
        checkGuard(a, plan.in_place ? n * blocks : n);
        checkGuard(b, n * blocks);
        bytes_ += n * blocks * element;
        break;
      }
      case Kind::kBroadcast: {
        const bool root = rank == plan.root;
        uint8_t* recv = plan.in_place ? a : b;
        std::memset(recv, kJunk, n * element);
        if (root) fill(a, 0, rank, 0, n);
        guard(a, n);
        guard(b, n);
        timed([&] { comm_.broadcast(a, recv, n, plan.dtype, plan.root); });
        for (size_t i = 0; i < n; ++i) {
          check(recv, i, static_cast<double>(in.value(plan.root, i)), "result", i);
        }
        if (root && !plan.in_place) checkInput(a, in, rank, 0, n);
        checkGuard(a, n);
        checkGuard(b, n);
        bytes_ += n * element;
        break;
      }
      case Kind::kBarrier:
        timed([&] { comm_.barrier(); });
        break;
    }
    return wrong_here_ == 0;
  }

  uint64_t bytes() const { return bytes_; }
  double collectiveSeconds() const { return collective_seconds_; }
  // The longest single collective so far and what it was: a stall shows up here.
  double slowestSeconds() const { return slowest_seconds_; }
  const std::string& slowest() const { return slowest_; }
  void resetTiming() {
    collective_seconds_ = 0;
    slowest_seconds_ = 0;
    slowest_ = "none";
  }
  uint64_t wrong() const { return wrong_; }

 private:
  template <typename Fn>
  void timed(Fn&& fn) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    collective_seconds_ += seconds;
    if (seconds > slowest_seconds_) {
      slowest_seconds_ = seconds;
      slowest_ = std::string(kindName(plan_->kind)) + " " +
                 std::string(railshard::name(plan_->dtype)) + " count " +
                 std::to_string(plan_->count) + " at iteration " + std::to_string(it_);
    }
  }

  void report(const char* what, size_t index, const std::string& got, const std::string& want) {
    ++wrong_here_;
    ++wrong_;
    if (++reported_ > 20) return;
    std::fprintf(stderr,
                 "rank %d: WRONG iteration %" PRIu64
                 " %s %s %s count %zu root %d %s: %s element %zu is %s, expected %s\n",
                 comm_.rank(), it_, kindName(plan_->kind),
                 std::string(railshard::name(plan_->dtype)).c_str(),
                 std::string(railshard::name(plan_->op)).c_str(), plan_->count, plan_->root,
                 plan_->in_place ? "in-place" : "out-of-place", what, index, got.c_str(),
                 want.c_str());
  }

  void check(const uint8_t* buffer, size_t i, double expected, const char* what, size_t index) {
    const double got = railshard::test::loadValue(buffer, i, plan_->dtype);
    if (got != expected) report(what, index, std::to_string(got), std::to_string(expected));
  }

  // Out-of-place: the library must not write into the send buffer.
  void checkInput(const uint8_t* buffer, const Inputs& in, int rank, size_t first, size_t len) {
    for (size_t i = 0; i < len; ++i) {
      const double expected = static_cast<double>(in.value(rank, first + i));
      const double got = railshard::test::loadValue(buffer, i, plan_->dtype);
      if (got != expected) report("send buffer", i, std::to_string(got), std::to_string(expected));
    }
  }

  // Nothing past the end of a buffer may be written.
  void checkGuard(const uint8_t* buffer, size_t elements) {
    const uint8_t* g = buffer + elements * railshard::sizeOf(plan_->dtype);
    for (size_t i = 0; i < kGuardBytes; ++i) {
      if (g[i] != kGuard) {
        report("guard byte past the end", i, std::to_string(g[i]), std::to_string(kGuard));
        return;
      }
    }
  }

  railshard::Communicator& comm_;
  uint64_t seed_;
  size_t max_bytes_;
  std::vector<uint8_t> a_;
  std::vector<uint8_t> b_;
  uint64_t bytes_ = 0;
  double collective_seconds_ = 0;
  double slowest_seconds_ = 0;
  std::string slowest_;
  uint64_t wrong_ = 0;
  uint64_t wrong_here_ = 0;
  uint64_t reported_ = 0;
  uint64_t it_ = 0;
  const Plan* plan_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  double seconds = 60;
  uint64_t max_iterations = UINT64_MAX;
  uint64_t seed = 1;
  size_t max_bytes = 2u << 20;
  uint64_t warmup = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const char* value = argv[i + 1];
    if (key == "--seconds") {
      seconds = std::atof(value);
    } else if (key == "--max-iterations") {
      max_iterations = std::strtoull(value, nullptr, 10);
    } else if (key == "--seed") {
      seed = std::strtoull(value, nullptr, 10);
    } else if (key == "--max-bytes") {
      max_bytes = std::strtoull(value, nullptr, 10);
    } else if (key == "--warmup") {
      warmup = std::strtoull(value, nullptr, 10);
    } else {
      std::fprintf(stderr, "soak: unknown option %s\n", key.c_str());
      return 64;
    }
  }
  try {
    auto comm = railshard::init();
    const int rank = comm->rank();
    const int size = comm->size();
    Soak soak(*comm, seed, max_bytes);
    bool ok = true;
    // Warm-up, not counted: every collective at the largest size in both placements (so
    // buffers the library grows to the largest message are already grown), then ordinary
    // random iterations. Iteration numbers of the warm-up are distinct from the soak's.
    uint64_t it = uint64_t{1} << 40;
    for (Kind kind : {Kind::kAllreduce, Kind::kReduceScatter, Kind::kAllgather, Kind::kBroadcast}) {
      for (bool in_place : {false, true}) {
        Plan plan;
        plan.kind = kind;
        plan.dtype = DataType::kFloat32;
        plan.op = ReduceOp::kSum;
        plan.in_place = in_place;
        plan.count = max_bytes / 4;
        if (kind == Kind::kReduceScatter || kind == Kind::kAllgather) plan.count /= size;
        ok &= soak.run(it++, plan);
      }
    }
    for (uint64_t i = 0; i < warmup; ++i, ++it)
      ok &= soak.run(it, drawPlan(seed, it, size, max_bytes));
    const uint64_t warmup_bytes = soak.bytes();
    soak.resetTiming();
    const auto fds_start = openFds();
    const Rss rss_start = rss();
    size_t rss_max = rss_start.total_kib;
    const auto start = std::chrono::steady_clock::now();
    uint64_t iterations = 0;
    uint64_t control = 0;
    // Ranks may only stop together: every 16 iterations they agree (one max all-reduce) on
    // whether any of them is out of time or has seen a wrong element.
    constexpr uint64_t kAgreeEvery = 16;
    while (iterations < max_iterations) {
      ok &= soak.run(iterations, drawPlan(seed, iterations, size, max_bytes));
      ++iterations;
      if (iterations % kAgreeEvery == 0) {
        rss_max = std::max(rss_max, rss().total_kib);
        const double elapsed =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        int32_t stop = (elapsed >= seconds || !ok) ? 1 : 0;
        comm->allreduce(&stop, 1, DataType::kInt32, ReduceOp::kMax);
        ++control;
        if (stop != 0) break;
      }
    }
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const auto fds_end = openFds();
    describeFdChanges(rank, fds_start, fds_end);
    const Rss rss_end = rss();
    rss_max = std::max(rss_max, rss_end.total_kib);
    // No rank exits (closing its connection to rank 0's store) before every rank has taken
    // its end sample: rank 0 would otherwise count the others' departures as its own leak.
    comm->barrier();
    std::printf(
        "soak rank %d of %d over %s: iterations %" PRIu64 " collectives %" PRIu64 " bytes %" PRIu64
        " seconds %.1f fds %zu -> %zu rss_kib %zu -> %zu (max %zu)"
        " private_kib %zu -> %zu wrong %" PRIu64 " seed %" PRIu64
        " in_collectives %.1f s slowest %.0f ms (%s)\n",
        rank, size, comm->usesSharedMemory() ? "shm" : "tcp", iterations, iterations + control,
        soak.bytes() - warmup_bytes, elapsed, fds_start.size(), fds_end.size(), rss_start.total_kib,
        rss_end.total_kib, rss_max, rss_start.private_kib, rss_end.private_kib, soak.wrong(), seed,
        soak.collectiveSeconds(), soak.slowestSeconds() * 1000, soak.slowest().c_str());
    std::fflush(stdout);
    return ok ? 0 : 2;
  } catch (const railshard::MismatchError& e) {
    std::fprintf(stderr, "MismatchError: %s\n", e.what());
  } catch (const railshard::PeerLostError& e) {
    std::fprintf(stderr, "PeerLostError: %s\n", e.what());
  } catch (const railshard::TimeoutError& e) {
    std::fprintf(stderr, "TimeoutError: %s\n", e.what());
  } catch (const railshard::Error& e) {
    std::fprintf(stderr, "Error: %s\n", e.what());
  }
  return 1;
}
