#pragma once

// Ranks placed on several "hosts" by a cluster graph, for the two-level tests
// (two_level_test.cc, two_level_failure_test.cc): threads of this process, so they can all map
// memory; the graph is what makes them hosts. Each host's ranks share one segment, the hosts
// are joined by real loopback TCP.
#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/memory_store.h"
#include "core/collectives/host_layout.h"
#include "core/communicator.h"
#include "core/topology/topology.h"
#include "tests/test_util.h"
#include "transport/transport.h"

namespace railshard::test {

// "h<index>", built by appending: GCC 12 warns (-Wrestrict, a false positive) about
// "h" + std::to_string(...).
inline std::string hostName(size_t index) {
  std::string name = "h";
  name += std::to_string(index);
  return name;
}

// A cluster graph of hosts h0, h1, ... with rank r on host host_of[r].
inline std::shared_ptr<topology::Topology> graphPlacing(const std::vector<int>& host_of) {
  auto graph = std::make_shared<topology::Topology>();
  const int hosts = *std::max_element(host_of.begin(), host_of.end()) + 1;
  for (int h = 0; h < hosts; ++h) {
    topology::Vertex host;
    host.id = host.host = host.name = hostName(static_cast<size_t>(h));
    host.kind = topology::VertexKind::kHost;
    graph->addVertex(host);
  }
  std::vector<topology::RankPlacement> ranks;
  std::vector<int> locals(static_cast<size_t>(hosts), 0);
  for (size_t r = 0; r < host_of.size(); ++r) {
    topology::RankPlacement placement;
    placement.rank = static_cast<int>(r);
    placement.host = hostName(static_cast<size_t>(host_of[r]));
    placement.local_rank = locals[static_cast<size_t>(host_of[r])]++;
    ranks.push_back(placement);
  }
  graph->setRanks(std::move(ranks));
  return graph;
}

// per_host[h] ranks on host h, numbered host by host.
inline std::vector<int> hostByHost(const std::vector<int>& per_host) {
  std::vector<int> host_of;
  for (size_t h = 0; h < per_host.size(); ++h) host_of.insert(host_of.end(), per_host[h], h);
  return host_of;
}

inline std::vector<std::exception_ptr> onPlacement(
    const std::vector<int>& host_of, const std::function<void(Communicator&)>& body,
    const std::function<void(int, Config&)>& tweak = {}) {
  const int size = static_cast<int>(host_of.size());
  MemoryStore store;
  auto graph = graphPlacing(host_of);
  return runRanks(size, [&](int rank) {
    Communicator::Options options;
    options.rank = rank;
    options.size = size;
    options.config.timeout = std::chrono::seconds(60);
    options.config.connect_timeout = std::chrono::seconds(30);
    options.config.chunk_bytes = 16 * 1024;     // several ring slices at moderate counts
    options.config.shm.slot_bytes = 64 * 1024;  // several shared-memory pieces too
    options.topology = graph;
    if (tweak) tweak(rank, options.config);
    auto comm = Communicator::create(store, options);
    body(*comm);
  });
}

inline std::vector<std::exception_ptr> onHosts(
    const std::vector<int>& per_host, const std::function<void(Communicator&)>& body,
    const std::function<void(int, Config&)>& tweak = {}) {
  return onPlacement(hostByHost(per_host), body, tweak);
}

// Payload bytes this rank handed to TCP so far, to ranks of its own host and to the others
// (per-connection counters).
struct TcpPayload {
  uint64_t to_host = 0;
  uint64_t to_others = 0;
};
inline TcpPayload tcpPayload(Communicator& comm) {
  const auto* layout = comm.hostLayout();
  TcpPayload payload;
  for (const auto& rail : comm.transport().rails()) {
    if (layout->host_of[static_cast<size_t>(rail.peer)] ==
        layout->host_of[static_cast<size_t>(comm.rank())]) {
      payload.to_host += rail.bytes_sent;
    } else {
      payload.to_others += rail.bytes_sent;
    }
  }
  return payload;
}

}  // namespace railshard::test
