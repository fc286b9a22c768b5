#pragma once

#include <cstddef>
#include <string>

namespace railshard::collectives {

enum class Algorithm {
  kRing,                    // TCP: pipelined ring reduce-scatter + all-gather
  kRecursiveDoubling,       // TCP: log2(n) exchanges of the whole buffer (fold-in for non-2^k)
  kShmDirect,               // shared memory: everyone reduces everything, one synchronisation
  kShmReduceScatterGather,  // shared memory: segment per rank, then copy-out
  // Several hosts with several ranks each (core/collectives/two_level.h):
  kTwoLevel,        // reduce-scatter in the host, ring across hosts per block, all-gather
  kTwoLevelDirect,  // host sum in shared memory, recursive doubling across hosts
  kTwoLevelLeader,  // the same with one rank per host across, then a broadcast in the host
};

std::string_view name(Algorithm algorithm);
// "auto" -> nullopt-like false; throws ConfigError for unknown names.
bool parseAlgorithm(const std::string& text, Algorithm& out);

// Per-transport figures of the cost model: a message or synchronisation costs alpha, and
// moving one byte through memory or the network costs 1/beta.
struct LinkModel {
  double alpha_us;
  double beta_gbps;  // GB/s
};

struct TunerInput {
  size_t bytes = 0;
  int world_size = 1;
  bool shm = false;  // all ranks on one host with a shared segment
  size_t shm_slot_bytes = 0;
  // Several hosts: how many, the most ranks one has, and whether each host's ranks share a
  // segment (the two-level algorithms; shm_slot_bytes is then that segment's).
  int hosts = 1;
  int ranks_per_host = 1;
  bool host_shm = false;
  // The link between two hosts (all its rails together): α per message, β of payload; from
  // the cluster graph's rails (nominal, or probed with RAILSHARD_PROBE), tcpModel() when
  // unknown. Flat algorithms over several hosts are bound by it too.
  LinkModel network{0, 0};
  // Measured at start-up (link_probe.h; the slowest host's): shared memory's hand-off and copy
  // rate, and the reduction kernel's rate. Zero: not measured, shmModel() and the default
  // reduction rate stand in.
  LinkModel shm_link{0, 0};
  double reduce_gbps = 0;
  // The most ranks per core on any host's machine (>= 1; the job's ranks on that machine over
  // its leader's cores, agreed by all ranks at start-up): where ranks outnumber the cores,
  // their simultaneous messages queue for them (each wakes a thread), so the α of the
  // algorithms in which every rank of a host sends at once (flat ones, the direct variant,
  // the two-level rings) grows by this.
  double ranks_per_core = 1;
};

struct TunerChoice {
  Algorithm algorithm;
  std::string reason;  // the estimates behind the choice, for the debug log
};

// Picks the cheapest applicable algorithm by the cost model (on one host with a segment, the
// cheapest shared-memory one), or `forced` when set (and
// applicable; a forced shared-memory algorithm without shared memory is a ConfigError).
// `explain` fills TunerChoice::reason with the estimates; it costs a string per call, so the
// hot path asks only when debug logging is on.
TunerChoice chooseAllreduce(const TunerInput& input, const std::string& forced,
                            bool explain = true);

// Estimated microseconds of one all-reduce, by the model (exposed for tests and docs).
double estimateMicros(Algorithm algorithm, const TunerInput& input);

LinkModel shmModel();
LinkModel tcpModel();
// The network model of `input`: its own when set, else tcpModel().
LinkModel networkModel(const TunerInput& input);
// The shared-memory model of `input`: measured when it was, else shmModel().
LinkModel sharedMemoryModel(const TunerInput& input);

}  // namespace railshard::collectives
