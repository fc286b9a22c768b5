// Every rank's part in an all-reduce, step by step, shaped like core/collectives/.
#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "benchmarks/sim/sim_model.h"
#include "core/collectives/two_level.h"
#include "transport/links/shm/shm_segment.h"

namespace railshard::sim {

namespace {

using collectives::Algorithm;
using collectives::HostLayout;

double transferUs(double bytes, double gbps) {
  return gbps > 0 ? bytes / (gbps * 1e3) : 0;
}

class Builder {
 public:
  Builder(const ClusterModel& model, const HostLayout& layout, size_t bytes)
      : model_(model),
        layout_(layout),
        bytes_(static_cast<double>(bytes)),
        programs_(static_cast<size_t>(layout.worldSize())) {
    for (int r = 0; r < layout.worldSize(); ++r) compute(r, model.call_cpu_us);
  }

  std::vector<Program> take() { return std::move(programs_); }
  double bytes() const { return bytes_; }

  void send(int rank, int peer, double bytes) {
    at(rank).push_back({OpKind::kSend, peer, bytes, 0});
  }
  void recv(int rank, int peer, double bytes) {
    at(rank).push_back({OpKind::kRecv, peer, bytes, 0});
  }
  void reduce(int rank, double bytes) {
    const bool far = model_.cache_bytes > 0 && model_.reduce_far_gbps > 0 &&
                     bytes > static_cast<double>(model_.cache_bytes);
    compute(rank, transferUs(bytes, far ? model_.reduce_far_gbps : model_.reduce_gbps));
  }
  void copy(int rank, double bytes) { compute(rank, transferUs(bytes, model_.shm.beta_gbps)); }
  void compute(int rank, double us) {
    if (us > 0) at(rank).push_back({OpKind::kCompute, -1, 0, us});
  }
  // Reads of `blocks` pieces another rank wrote in shared memory: each starts with a cache
  // line from another core (the flags of a meeting are charged by the engine).
  void touch(int rank, double blocks) { compute(rank, blocks * model_.shm_peer_us); }
  void hostSync(int rank) { at(rank).push_back({OpKind::kHostSync, -1, 0, 0}); }

  // recursiveDoublingAllreduce over `members` (core/collectives/recursive_doubling.cc): the
  // first 2(n - p) fold into pairs, log2(p) swaps of the whole buffer, the result handed back.
  void recursiveDoubling(const std::vector<int>& members, double bytes) {
    const int n = static_cast<int>(members.size());
    if (n < 2) return;
    int p = 1;
    while (p * 2 <= n) p *= 2;
    const int extra = n - p;
    auto world = [&](int i) { return members[static_cast<size_t>(i)]; };
    for (int i = 0; i < 2 * extra; i += 2) {
      send(world(i + 1), world(i), bytes);
      recv(world(i), world(i + 1), bytes);
      reduce(world(i), bytes);
    }
    for (int mask = 1; mask < p; mask <<= 1) {
      for (int v = 0; v < p; ++v) {
        const int me = v < extra ? v * 2 : v + extra;
        const int partner_v = v ^ mask;
        const int partner = partner_v < extra ? partner_v * 2 : partner_v + extra;
        send(world(me), world(partner), bytes);
      }
      for (int v = 0; v < p; ++v) {
        const int me = v < extra ? v * 2 : v + extra;
        const int partner_v = v ^ mask;
        const int partner = partner_v < extra ? partner_v * 2 : partner_v + extra;
        recv(world(me), world(partner), bytes);
        reduce(world(me), bytes);
      }
    }
    for (int i = 0; i < 2 * extra; i += 2) {
      send(world(i), world(i + 1), bytes);
      recv(world(i + 1), world(i), bytes);
    }
  }

  // ringAllreduce over `members`: n - 1 reduce-scatter steps of a 1/n segment, each sent on,
  // received and reduced, then n - 1 all-gather steps.
  void ring(const std::vector<int>& members, double bytes) {
    const int n = static_cast<int>(members.size());
    if (n < 2) return;
    const double segment = bytes / n;
    for (int phase = 0; phase < 2; ++phase) {
      for (int step = 0; step < n - 1; ++step) {
        for (int i = 0; i < n; ++i) {
          send(members[static_cast<size_t>(i)], members[static_cast<size_t>((i + 1) % n)], segment);
        }
        for (int i = 0; i < n; ++i) {
          const int me = members[static_cast<size_t>(i)];
          recv(me, members[static_cast<size_t>((i + n - 1) % n)], segment);
          if (phase == 0) reduce(me, segment);
        }
      }
    }
  }

  // ShmEngine::allreduceDirect on one host: copy in, meet, read and reduce all L inputs. One
  // meeting: the slots alternate between steps, and the next step's meeting proves this
  // step's reads are over.
  void hostSumDirect(const std::vector<int>& host) {
    const double l = static_cast<double>(host.size());
    // Up to 24 bytes travel in the flag's own cache line; more are read from the peers' slots.
    const double slots =
        bytes_ > static_cast<double>(transport::links::shm::kInlineBytes) ? l - 1 : 0;
    for (int r : host) copy(r, bytes_);
    for (int r : host) hostSync(r);
    for (int r : host) touch(r, slots);
    for (int r : host) reduce(r, bytes_ * l);
  }

 private:
  Program& at(int rank) { return programs_[static_cast<size_t>(rank)]; }

  const ClusterModel& model_;
  const HostLayout& layout_;
  double bytes_;
  std::vector<Program> programs_;
};

}  // namespace

std::vector<Program> allreducePrograms(Algorithm algorithm, const ClusterModel& model,
                                       const HostLayout& layout, size_t bytes) {
  Builder b(model, layout, bytes);
  const double size = static_cast<double>(bytes);
  std::vector<int> everyone(static_cast<size_t>(layout.worldSize()));
  for (size_t r = 0; r < everyone.size(); ++r) everyone[r] = static_cast<int>(r);
  switch (algorithm) {
    case Algorithm::kRing:
      b.ring(everyone, size);
      break;
    case Algorithm::kRecursiveDoubling:
      b.recursiveDoubling(everyone, size);
      break;
    case Algorithm::kShmDirect:
      b.hostSumDirect(everyone);
      break;
    case Algorithm::kShmReduceScatterGather: {
      // Segment per rank: copy in, meet, reduce one segment of every rank's, meet, copy out.
      // Segments of a few elements: the ranks past the element count have none to reduce,
      // and every non-empty segment is a piece read from another rank's slot.
      const double n = static_cast<double>(everyone.size());
      const double segments = std::min(n, std::max(1.0, size / 4));
      for (int r : everyone) b.copy(r, size);
      for (int r : everyone) b.hostSync(r);
      for (int r : everyone) {
        if (r < segments) b.touch(r, n - 1);
        b.reduce(r, size);  // n operands of size / n
      }
      for (int r : everyone) b.hostSync(r);
      for (int r : everyone) {
        b.touch(r, segments - (r < segments ? 1 : 0));
        b.copy(r, size * (n - 1) / n);
      }
      break;
    }
    case Algorithm::kTwoLevelDirect:
      for (const auto& host : layout.hosts) b.hostSumDirect(host);
      for (const auto& group : collectives::directGroups(layout)) b.recursiveDoubling(group, size);
      break;
    case Algorithm::kTwoLevelLeader: {
      std::vector<int> leaders;
      for (const auto& host : layout.hosts) {
        b.hostSumDirect(host);
        leaders.push_back(host.front());
      }
      b.recursiveDoubling(leaders, size);
      // ShmEngine::broadcast: the leader copies in, the host meets, everyone copies out.
      for (const auto& host : layout.hosts) {
        b.copy(host.front(), size);
        for (int r : host) b.hostSync(r);
        for (int r : host) b.copy(r, size);
      }
      break;
    }
    case Algorithm::kTwoLevel: {
      // Reduce-scatter in the host, a ring per cross range, all-gather in the host.
      for (const auto& host : layout.hosts) {
        const double l = static_cast<double>(host.size());
        for (int r : host) b.copy(r, size);
        for (int r : host) b.hostSync(r);
        for (int r : host) b.reduce(r, size / l * l);
        for (int r : host) b.hostSync(r);
      }
      const size_t count = std::max<size_t>(1, bytes / 4);
      for (const auto& range : collectives::crossRanges(layout, count)) {
        b.ring(range.members,
               size * static_cast<double>(range.end - range.begin) / static_cast<double>(count));
      }
      for (const auto& host : layout.hosts) {
        for (int r : host) b.hostSync(r);
        for (int r : host) b.copy(r, size);
      }
      break;
    }
  }
  return b.take();
}

std::vector<Program> allgatherPrograms(const ClusterModel& model, const HostLayout& layout,
                                       size_t block_bytes) {
  Builder b(model, layout, block_bytes);
  const double block = static_cast<double>(block_bytes);
  const int n = layout.worldSize();
  if (layout.hostCount() == 1) {
    // ShmEngine::allgather: copy in, meet, copy out everyone's.
    for (const int r : layout.hosts.front()) b.copy(r, block);
    for (const int r : layout.hosts.front()) b.hostSync(r);
    for (const int r : layout.hosts.front()) b.copy(r, block * n);
    return b.take();
  }
  if (!layout.twoLevel()) {
    // ringAllgather: n - 1 steps of one block.
    for (int step = 0; step < n - 1; ++step) {
      for (int r = 0; r < n; ++r) b.send(r, (r + 1) % n, block);
      for (int r = 0; r < n; ++r) b.recv(r, (r + n - 1) % n, block);
    }
    return b.take();
  }
  if (collectives::allgatherThroughLeaders(layout, block_bytes * static_cast<size_t>(n))) {
    // twoLevelLeaderAllgather: the host's blocks in shared memory, Bruck's rounds over the
    // leaders (at distance d a leader sends the chunks it holds, up to d hosts' worth, to the
    // leader d before it and receives as many from the one d after), a broadcast in the host.
    std::vector<int> leaders;
    std::vector<double> chunk;
    for (const auto& host : layout.hosts) {
      for (const int r : host) b.copy(r, block);
      for (const int r : host) b.hostSync(r);
      for (const int r : host) b.copy(r, block * static_cast<double>(host.size()));
      leaders.push_back(host.front());
      chunk.push_back(block * static_cast<double>(host.size()));
    }
    const int hosts = layout.hostCount();
    auto held = [&](int from, int count) {  // bytes of hosts from, from + 1, ... (count of them)
      double bytes = 0;
      for (int j = 0; j < count; ++j) bytes += chunk[static_cast<size_t>((from + j) % hosts)];
      return bytes;
    };
    for (int d = 1; d < hosts; d *= 2) {
      const int count = std::min(d, hosts - d);
      for (int i = 0; i < hosts; ++i) {
        b.send(leaders[static_cast<size_t>(i)],
               leaders[static_cast<size_t>((i - d + hosts) % hosts)], held(i, count));
      }
      for (int i = 0; i < hosts; ++i) {
        b.recv(leaders[static_cast<size_t>(i)], leaders[static_cast<size_t>((i + d) % hosts)],
               held((i + d) % hosts, count));
      }
    }
    for (const auto& host : layout.hosts) {
      b.copy(host.front(), block * n);
      for (const int r : host) b.hostSync(r);
      for (const int r : host) b.copy(r, block * n);
    }
    return b.take();
  }
  // twoLevelAllgather: every rank sends its block to its handler on every other host, each
  // handler receives the blocks it handles, the host's ranks share them in shared memory.
  for (int r = 0; r < n; ++r) {
    const int mine = layout.host_of[static_cast<size_t>(r)];
    for (int h = 0; h < layout.hostCount(); ++h) {
      if (h != mine) b.send(r, collectives::blockHandler(layout, h, r), block);
    }
  }
  for (int h = 0; h < layout.hostCount(); ++h) {
    const auto handled = collectives::handledBlocks(layout, h);
    const auto& host = layout.hosts[static_cast<size_t>(h)];
    for (size_t l = 0; l < host.size(); ++l) {
      for (const int from : handled[l]) {
        if (from != host[l] && layout.host_of[static_cast<size_t>(from)] != h) {
          b.recv(host[l], from, block);
        }
      }
    }
    for (const int r : host) b.copy(r, block);
    for (const int r : host) b.hostSync(r);
    for (const int r : host) b.copy(r, block * n);
  }
  return b.take();
}

}  // namespace railshard::sim
