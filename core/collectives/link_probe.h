#pragma once

#include <cstddef>

#include "core/collectives/tuner.h"
#include "transport/message_tag.h"

namespace railshard::collectives {

class ShmEngine;

// What this machine measures at start-up, for the tuner (whose constants are only a first
// guess) and for efficiency figures on one host, where no NIC gives a limit.

// Bytes per second of a copy of `bytes` between two buffers of this process (GB/s, best of a
// few): the rate at which shared-memory collectives move data in and out of slots.
double measureCopyGBps(size_t bytes);
// Rate of the float sum kernel over two `bytes` operands into a third (GB/s of one vector,
// best of a few): the reductions of every algorithm.
double measureReduceGBps(size_t bytes);
// Microseconds of one hand-off among the ranks of `engine` (the fastest of `rounds` barriers,
// every rank of the engine calling this together): what a shared-memory step costs before
// any byte moves when the host's ranks are all running. The fastest, not the median: with
// more ranks than cores the median is mostly how long the scheduler kept a peer off a core,
// which varied 0.2-48 us between two start-ups of one job here, and which the model's TCP
// figures (constants) do not carry either, so a median made shared memory look slower than
// loopback TCP and the tuner pick a flat ring 3.5x slower than two levels.
double measureHandOffMicros(ShmEngine& engine, const transport::MessageTag& tag, int rounds);

// A 2-rank-or-more host's choice of how the single copy reads ordinary buffers: the time of
// one all-reduce of `bytes` staged through the segment and read across with process_vm_readv
// (microseconds, the fastest of a few on each rank, then the slowest rank's, so every rank of
// the engine has the same figures and makes the same choice). Every rank of `engine` calls
// this together; it leaves the engine's single-copy settings as it found them. Zeros (not
// timed) when some rank has fewer cores than the engine has ranks.
struct ReadProbe {
  double staged_us = 0;
  double cross_us = 0;
  // Reading across wins by a margin: the staged path is what every rank can always do, and on
  // a close call its smaller variance (no page pinning per call) is worth more.
  bool crossReadWins() const { return cross_us > 0 && cross_us < 0.95 * staged_us; }
};
ReadProbe probeCrossRead(ShmEngine& engine, const transport::MessageTag& tag, size_t bytes);

// The figures a host's leader publishes and every rank agrees on (the slowest host's).
struct MeasuredLinks {
  LinkModel shm{0, 0};     // shared memory: α per hand-off, β of copies; 0 = not measured
  double reduce_gbps = 0;  // 0 = not measured
  // The most ranks per core of any host with a segment: the job's ranks on its machine over
  // its leader's allowed cores (TunerInput::ranks_per_core), at least 1.
  double ranks_per_core = 1;
};

}  // namespace railshard::collectives
