#pragma once

// Two TCP meshes in threads joined by "rails" on 127.0.0.1, 127.0.0.2, ... (all local, so
// no root is needed): what the multi-rail tests share.
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/memory_store.h"
#include "tests/tcp_mesh_util.h"
#include "tests/test_util.h"

namespace railshard::test {

using railshard::Deadline;
using railshard::MemoryStore;
using railshard::transport::MessageTag;
using railshard::transport::RailStatus;
using railshard::transport::links::tcp::RailSpec;
using railshard::transport::messaging::Mesh;

inline constexpr char kToken[] = "multirail-test";

inline Deadline soon(int seconds = 30) {
  return railshard::deadlineAfter(std::chrono::seconds(seconds));
}

inline MessageTag tagOf(uint64_t sequence) {
  MessageTag tag;
  tag.sequence = sequence;
  tag.count = sequence * 7;
  return tag;
}

inline std::vector<uint8_t> pattern(size_t bytes, uint32_t seed) {
  std::vector<uint8_t> data(bytes);
  std::mt19937 rng(seed);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  return data;
}

struct Pair {
  std::unique_ptr<Mesh> t[2];
  // Both close at once, as two processes would: each lingers for the other's goodbye.
  ~Pair() {
    std::thread other([this] { t[1].reset(); });
    t[0].reset();
    other.join();
  }
};

// Two ranks joined by `rails` rails (127.0.0.1, 127.0.0.2, ...), created in parallel,
// rendezvousing through `store`.
inline void connectPairThrough(MemoryStore& store, Pair& pair, int rails,
                               railshard::RailWeights weights = railshard::RailWeights::kAdaptive,
                               int sockets = 1, const std::vector<double>& gbps = {}) {
  railshard::test::rethrowFirst(railshard::test::runRanks(2, [&](int rank) {
    auto options = tcpMeshOptions(rank, 2, kToken);
    options.links.weights = weights;
    options.connect.sockets_per_rail = sockets;
    options.rejoin_interval = std::chrono::milliseconds(200);
    options.connect.peer_rails.resize(2);
    for (int r = 0; r < rails; ++r) {
      RailSpec spec;
      spec.name = "lo" + std::to_string(r);
      spec.local_address = "127.0.0." + std::to_string(r + 1);
      spec.remote_address = spec.local_address;
      spec.gbps = gbps.empty() ? 10 : gbps[static_cast<size_t>(r)];
      options.connect.peer_rails[static_cast<size_t>(1 - rank)].push_back(spec);
    }
    pair.t[rank] = transport::links::tcp::connectMesh(store, options);
  }));
}

inline void connectPair(Pair& pair, int rails,
                        railshard::RailWeights weights = railshard::RailWeights::kAdaptive,
                        int sockets = 1, const std::vector<double>& gbps = {}) {
  MemoryStore store;
  connectPairThrough(store, pair, rails, weights, sockets, gbps);
}

inline std::vector<RailStatus> railsTo(const Mesh& t, int peer) {
  std::vector<RailStatus> result;
  for (const auto& r : t.rails()) {
    if (r.peer == peer) result.push_back(r);
  }
  return result;
}

// Waits (up to 10 s) until rail 1 between the pair is up again on both ranks.
inline bool railOneBackOnBoth(const Pair& pair) {
  auto bothUp = [&] { return railsTo(*pair.t[0], 1)[1].up && railsTo(*pair.t[1], 0)[1].up; };
  const Deadline until = soon(10);
  while (!bothUp() && railshard::Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return bothUp();
}

}  // namespace railshard::test
