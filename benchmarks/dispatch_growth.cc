#include "benchmarks/dispatch_growth.h"

#include <cstring>
#include <string>

#include "base/error.h"

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

  // Rank 0's: policy, calibration, members, then the ledger's bytes.
  std::vector<int64_t> head;
  std::vector<uint8_t> ledger;
  int64_t sizes[2] = {0, 0};
  if (grown.rank() == 0) {
    int64_t calibration = 0;
    std::memcpy(&calibration, &h.iterations_per_ms, sizeof(calibration));
    head = {static_cast<int64_t>(h.policy), calibration};
    for (const int m : h.members) head.push_back(m);
    ledger = h.ledger.encode();
    sizes[0] = static_cast<int64_t>(head.size());
    sizes[1] = static_cast<int64_t>(ledger.size());
  }
  grown.broadcast(sizes, 2, DataType::kInt64, 0);
  if (grown.rank() != 0) {
    head.resize(static_cast<size_t>(sizes[0]));
    ledger.resize(static_cast<size_t>(sizes[1]));
  }
  grown.broadcast(head.data(), head.size(), DataType::kInt64, 0);
  grown.broadcast(ledger.data(), ledger.size(), DataType::kUInt8, 0);
  if (member) return;
  if (head.size() < 2)
    throw ProtocolError("dispatch_bench hand-over: " + std::to_string(head.size()) +
                        " header words");
  h.policy = static_cast<uint64_t>(head[0]);
  std::memcpy(&h.iterations_per_ms, &head[1], sizeof(h.iterations_per_ms));
  h.members.assign(head.begin() + 2, head.end());
  h.ledger = Ledger::decode(ledger);
}

}  // namespace railshard::bench
