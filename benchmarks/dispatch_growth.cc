#include "benchmarks/dispatch_growth.h"

#include <cstring>

#include "core/collectives/host_layout.h"
#include "core/topology/topology.h"

namespace railshard::bench {

void handOver(Communicator& grown, bool member, int my_slot, HandOver& h) {
  const int64_t mine = my_slot;
  std::vector<int64_t> slots(static_cast<size_t>(grown.size()));
  grown.allgather(&mine, slots.data(), 1, DataType::kInt64);
  if (h.slots.size() < static_cast<size_t>(grown.launchRanks())) {
    h.slots.resize(static_cast<size_t>(grown.launchRanks()), -1);
  }
  for (size_t r = 0; r < slots.size(); ++r) {
    h.slots[static_cast<size_t>(grown.worldRanks()[r])] = static_cast<int>(slots[r]);
  }

  // Rank 0's policy, calibration and ledger length in one broadcast, then the ledger's bytes.
  int64_t head[3] = {0, 0, 0};
  std::vector<uint8_t> ledger;
  if (grown.rank() == 0) {
    ledger = h.ledger.encode();
    head[0] = static_cast<int64_t>(h.policy);
    std::memcpy(&head[1], &h.iterations_per_ms, sizeof(head[1]));
    head[2] = static_cast<int64_t>(ledger.size());
  }
  grown.broadcast(head, 3, DataType::kInt64, 0);
  if (grown.rank() != 0) ledger.resize(static_cast<size_t>(head[2]));
  grown.broadcast(ledger.data(), ledger.size(), DataType::kUInt8, 0);
  if (member) return;
  h.policy = static_cast<uint64_t>(head[0]);
  std::memcpy(&h.iterations_per_ms, &head[1], sizeof(h.iterations_per_ms));
  h.ledger = Ledger::decode(ledger);
}

std::string describeLinks(const Communicator& comm) {
  std::string text =
      comm.hostLayout() != nullptr ? comm.hostLayout()->describe() : std::string("one rank");
  const topology::Topology* graph = comm.topology();
  if (graph == nullptr) return text + "; no cluster graph (hosts compared through the store)";
  const std::string mine = graph->rank(comm.rank()).host;
  for (const auto& placement : graph->ranks()) {
    if (placement.host == mine) continue;
    const size_t rails = graph->rails(mine, placement.host).size();
    return text + "; cluster graph: " + std::to_string(rails) +
           (rails == 1 ? " rail " : " rails ") + mine + " - " + placement.host;
  }
  return text + "; cluster graph: one host";
}

}  // namespace railshard::bench
