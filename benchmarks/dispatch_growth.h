#pragma once

// dispatch_bench across Communicator::grow(): what the first member hands a joiner beyond
// the dispatcher (CollectiveDispatcher::admit()/joined() hand that over themselves, with
// the dispatcher-rank to launch-rank map: CollectiveDispatcher::launchRanks()).

#include <cstdint>
#include <string>
#include <vector>

#include "benchmarks/dispatch_ledger.h"
#include "core/communicator.h"

namespace railshard::bench {

struct HandOver {
  uint64_t policy = 0;           // index into --policies of the policy running
  double iterations_per_ms = 0;  // --work cpu calibration (one host: the first member's)
  std::vector<int> slots;        // launch rank -> launcher slot (whose speed a rank has)
  Ledger ledger;
};

// Collective over the grown communicator, after admit()/joined(). Every rank tells its
// launcher slot (`my_slot`: RAILSHARD_RANK of a restarted rank, the launch rank otherwise),
// merged into `h.slots` everywhere; then rank 0 (the first member) sends the rest of its `h`,
// which the joiners (`member` false) take and the members already hold.
void handOver(Communicator& grown, bool member, int my_slot, HandOver& h);

// How a grown communicator sees the cluster, for the joiner's log line: its host layout and,
// from the cluster graph the generation agreed on, the rails between this rank's host and
// the next ("2 hosts x 2 ranks; cluster graph: 2 rails h1 - h0"), or that it has no graph.
std::string describeLinks(const Communicator& comm);

}  // namespace railshard::bench
