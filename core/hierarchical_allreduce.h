#pragma once

// All-reduce of device buffers in two levels: NCCL inside each host (NVLink/PCIe, the fastest
// path between GPUs of one server) and railshard between hosts (its rails and rail scheduler).
// For a buffer of `count` elements and L ranks per host, with local rank r owning shard r
// (HierarchyPlan::shards):
//
//   1. grouped ncclReduce of every shard r onto local rank r (root r; uneven shards are fine)
//   2. each rank all-reduces its own shard with the same local rank on every other host, over
//      a railshard Communicator of one rank per host ("rail" r), on the device
//   3. grouped ncclBroadcast of every shard r from local rank r
//
// All three are ordered on the caller's stream. avg runs as sum at both levels and the shard
// owner divides by the world size before the broadcast (kernels::cuda::divide), so the result
// is sum / world_size rounded once, exactly as the flat paths do (ncclAvg inside the node and
// avg across would round integers twice).
//
// There is no CUDA IPC path without NCCL: when NCCL is missing (or the layout does not fit)
// device buffers take the staging path (pinned host buffers, device reductions), which is
// slower inside a host but always there.
//
// Failures are bounded: NCCL runs non-blocking (NcclApi::initRank / waitReady) with the
// communicator's deadlines, asynchronous NCCL errors are checked before and after each call,
// and any failure (a lost host in step 2 included) aborts this rank's NCCL communicator
// (ncclCommAbort), so it never blocks in NCCL again; local peers left waiting for it are
// bounded by their own deadlines and abort in turn. The object is unusable afterwards (every
// later call raises the first error).
//
// NEVER RUN ON A GPU here: the build machine has none; docs/gpu.md.
#include <memory>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/store.h"
#include "base/types.h"
#include "core/collectives/nccl_api.h"
#include "core/communicator.h"
#include "core/hierarchy_plan.h"

namespace railshard {

class HierarchicalAllreduce {
 public:
  // What the parent communicator knows; every rank of it passes the same hosts and prefix.
  struct Params {
    std::shared_ptr<Store> store;  // the parent's (Communicator::Options::store); required
    std::string key_prefix;        // the parent's store namespace
    int rank = 0;
    int size = 1;
    std::vector<std::string> hosts;  // host of every rank, by rank
    Config config;                   // timeouts; the cross-node communicators get the same
    std::string advertise_host;      // where peers reach this rank (cross-node mesh)
    int device = -1;                 // CUDA device of the buffers; -1 = the current one
  };

  // Why this rank cannot run the two-level all-reduce (layout, CUDA, NCCL); empty when it can.
  // Local and cheap: no store, no NCCL communicator.
  static std::string whyNot(const std::vector<std::string>& hosts, int rank);

  // Collective over every rank of the parent. The ranks first agree through the store whether
  // all of them can (a host without NCCL must not leave the others waiting in NCCL); null with
  // `why` set, identically on every rank, when any cannot. Otherwise builds the NCCL
  // communicator of this host and the cross-node railshard communicator of this local rank,
  // within Config::connect_timeout. Raises on a failure while building (a lost peer).
  static std::unique_ptr<HierarchicalAllreduce> create(const Params& params, std::string& why);

  ~HierarchicalAllreduce();
  HierarchicalAllreduce(const HierarchicalAllreduce&) = delete;
  HierarchicalAllreduce& operator=(const HierarchicalAllreduce&) = delete;

  // Device buffers of `count` elements (in place when send == recv), ordered on `stream`.
  // The caller's current device must be the buffers' (NCCL's rule). Returns once this rank's
  // cross-node transfer is done; the final broadcast may still be queued on `stream`.
  // `timeout` as Communicator::allreduce (kDefaultTimeout = Config::timeout).
  void allreduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                 void* stream, Communicator::Timeout timeout = Communicator::kDefaultTimeout);

  // Raises NCCL's asynchronous error, if any (and aborts the NCCL communicator then), or the
  // first failure. For bounded waits on the stream (Communicator::waitForDevice).
  void checkHealthy();
  // Aborts the NCCL communicator, so that kernels it queued stop; later calls raise `reason`.
  void abort(const std::string& reason) { fail(reason); }

  const HierarchyPlan& plan() const { return plan_; }
  // "hierarchical: NCCL 2.28.9 inside 2 hosts x 4 ranks, railshard between hosts"
  std::string describe() const;

 private:
  HierarchicalAllreduce(const Params& params, HierarchyPlan plan, const collectives::NcclApi& api);
  void connect(const Params& params);
  // Runs `body` between ncclGroupStart and ncclGroupEnd and waits for NCCL to take the work.
  template <typename Body>
  void group(const char* what, Deadline deadline, Body&& body);
  // Aborts the NCCL communicator and remembers `reason` for later calls.
  void fail(const std::string& reason);

  HierarchyPlan plan_;
  const collectives::NcclApi& api_;
  Config config_;
  int size_ = 1;
  int device_ = 0;  // the buffers' device: NCCL's communicator lives there
  collectives::nccl::Comm comm_ = nullptr;
  std::unique_ptr<Communicator> cross_;
  std::string failed_;  // the first failure; empty while usable
};

}  // namespace railshard
