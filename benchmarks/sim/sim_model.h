#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/collectives/host_layout.h"
#include "core/collectives/tuner.h"

namespace railshard::sim {

// What the simulated cluster is made of: the figures a user reads off the hardware, or that a
// start-up here measures (docs/simulator.md says which). Times in microseconds, rates in GB/s.
struct ClusterModel {
  std::vector<int> ranks_per_host;  // ranks numbered host by host, as the launchers do
  // Cores the ranks of a host share; 0: a core per rank. `cores_shared_by_hosts`: the hosts
  // are namespaces of one machine and these are all its cores (the test bed here).
  int cores = 0;
  bool cores_shared_by_hosts = false;
  collectives::LinkModel network = collectives::tcpModel();   // one host's NIC(s), each way
  collectives::LinkModel loopback = collectives::tcpModel();  // TCP between ranks of a host
  collectives::LinkModel shm = collectives::shmModel();       // hand-off and copy rate
  double reduce_gbps = 2.0;
  // A reduction whose operands outgrow a core's own cache (L2) streams them from further away,
  // at `reduce_far_gbps` (0: the same rate): what a direct sum of many ranks' buffers meets.
  size_t cache_bytes = 0;
  double reduce_far_gbps = 0;
  // CPU time of one message at each end (system calls, the progress thread's turn), and of
  // waking a rank that slept in a wait: what queues for the cores when ranks outnumber them.
  double message_cpu_us = 0;
  double wake_cpu_us = 0;
  // More per wake-up for every rank per core of the machine: a process woken among many comes
  // back to caches the others have taken (fitted here: docs/simulator.md).
  double wake_per_crowding_us = 0;
  // CPU time to look at another rank's flag in a shared-memory meeting (its cache line comes
  // from the core that wrote it), once per rank of the host at every meeting.
  double shm_peer_us = 0;
  // CPU time of a collective call itself on each rank (the communicator's entry, planning,
  // the caller's loop): what every rank needs a core for once per call, sleeping or not.
  double call_cpu_us = 0;
  // A shared-memory wait polls yielding the core, each poll costing `yield_us` of it (a
  // system call and a switch), for up to `spin_us` (RAILSHARD_SPIN_US), then sleeps until
  // the flag is set (woken a hand-off later, at the cost of a wake-up). 0: sleeps at once.
  double yield_us = 0;
  double spin_us = 2000;
  size_t shm_slot_bytes = size_t{1} << 20;

  int worldSize() const;
  collectives::HostLayout layout() const;
};

// One step of a rank's part in a collective. Sends do not wait for their receiver (isend);
// a receive waits for the message from `peer` (matched in order, as the transports do); a
// host sync is a shared-memory meeting: post, then wait for every rank of the host in turn.
enum class OpKind { kSend, kRecv, kCompute, kHostSync };
struct Op {
  OpKind kind = OpKind::kCompute;
  int peer = -1;
  double bytes = 0;   // send / receive
  double cpu_us = 0;  // compute
};
using Program = std::vector<Op>;

// Every rank's program for one all-reduce of `bytes` by `algorithm`, shaped like the real one
// (core/collectives/): who sends what to whom, what is reduced and copied, where the host's
// ranks meet. The groups across hosts come from the real HostLayout helpers (directGroups,
// crossRanges). Pipelining inside a step (the ring's chunks, two_level's 8 chunks) is not
// modelled: each step moves its whole piece.
std::vector<Program> allreducePrograms(collectives::Algorithm algorithm, const ClusterModel& model,
                                       const collectives::HostLayout& layout, size_t bytes);

// Every rank's program for one all-gather of `block_bytes` per rank as the communicator runs
// it: in shared memory on one host, twoLevelAllgather on several with several ranks each,
// else the ring (what CollectiveDispatcher pays each step, 128 bytes per rank).
std::vector<Program> allgatherPrograms(const ClusterModel& model,
                                       const collectives::HostLayout& layout, size_t block_bytes);

struct SimResult {
  double micros = 0;    // the last rank's finish
  size_t messages = 0;  // point-to-point messages in all
  // Per rank, ascending: the ranks of other hosts it exchanged a message with (the
  // connections it would open on first use).
  std::vector<std::vector<int>> peers;
};

// Runs the programs as a discrete-event simulation: each rank advances through its ops in
// virtual time; a host's NIC sends and receives one message at a time each (α after a byte
// leaves, it arrives, at β), cores are a pool the host's ranks (or the machine's) queue for.
SimResult simulate(const ClusterModel& model, const collectives::HostLayout& layout,
                   const std::vector<Program>& programs);

// The tuner's input for this cluster, as the planner builds it from a communicator
// (core/planner.cc): the real tuner then chooses.
collectives::TunerInput tunerInput(const ClusterModel& model, const collectives::HostLayout& layout,
                                   size_t bytes);

}  // namespace railshard::sim
