#pragma once

#include <cstddef>
#include <string>

namespace railshard::collectives {

enum class Algorithm {
  kRing,                    // TCP: pipelined ring reduce-scatter + all-gather
  kRecursiveDoubling,       // TCP: log2(n) exchanges of the whole buffer (fold-in for non-2^k)
  kShmDirect,               // shared memory: everyone reduces everything, one synchronisation
  kShmReduceScatterGather,  // shared memory: segment per rank, then copy-out
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
};

struct TunerChoice {
  Algorithm algorithm;
  std::string reason;  // the estimates behind the choice, for the debug log
};

// Picks the cheapest applicable algorithm by the cost model, or `forced` when set (and
// applicable; a forced shared-memory algorithm without shared memory is a ConfigError).
// `explain` fills TunerChoice::reason with the estimates; it costs a string per call, so the
// hot path asks only when debug logging is on.
TunerChoice chooseAllreduce(const TunerInput& input, const std::string& forced,
                            bool explain = true);

// Estimated microseconds of one all-reduce, by the model (exposed for tests and docs).
double estimateMicros(Algorithm algorithm, const TunerInput& input);

LinkModel shmModel();
LinkModel tcpModel();

}  // namespace railshard::collectives
