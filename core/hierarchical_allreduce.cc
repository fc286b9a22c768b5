#include "core/hierarchical_allreduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "base/error.h"
#include "kernels/cuda/device_runtime.h"
#include "kernels/cuda/reduce.h"

namespace railshard {

using collectives::NcclApi;
namespace nccl = collectives::nccl;

namespace {

// A per-call budget for the cross-node communicator from what is left of ours.
Communicator::Timeout remaining(Deadline deadline) {
  return Communicator::Timeout(std::max(1, millisUntil(deadline)));
}

std::string storeBase(const std::string& key_prefix) {
  return key_prefix + "/hier";
}

// Every rank votes; each learns whether all can. Identical answer on every rank: the reason
// is the one stored under /why (any refusing rank's; all writes precede all reads).
std::string agree(Store& store, const std::string& base, int rank, int size,
                  const std::string& mine, Duration timeout) {
  if (!mine.empty()) {
    store.setString(base + "/why", "rank " + std::to_string(rank) + ": " + mine, timeout);
  }
  store.add(base + "/refusals", mine.empty() ? 0 : 1, timeout);
  store.setString(base + "/voted/" + std::to_string(rank), "", timeout);
  std::vector<std::string> voted;
  for (int r = 0; r < size; ++r) voted.push_back(base + "/voted/" + std::to_string(r));
  store.wait(voted, timeout);
  const int64_t refusals = store.add(base + "/refusals", 0, timeout);
  if (refusals == 0) return {};
  std::string why = store.getString(base + "/why", timeout);
  if (refusals > 1) why += " (and " + std::to_string(refusals - 1) + " more ranks cannot)";
  return why;
}

}  // namespace

std::string HierarchicalAllreduce::whyNot(const std::vector<std::string>& hosts, int rank) {
  const HierarchyPlan plan = HierarchyPlan::make(hosts, rank);
  if (!plan.usable) return plan.reason;
  if (!kernels::cuda::available()) return kernels::cuda::unavailableReason();
  if (NcclApi::get() == nullptr) {
    return NcclApi::unavailableReason() +
           "; device buffers take the staging path (there is no CUDA IPC path without NCCL)";
  }
  return {};
}

std::unique_ptr<HierarchicalAllreduce> HierarchicalAllreduce::create(const Params& params,
                                                                     std::string& why) {
  if (params.store == nullptr) {
    throw InvalidArgument("hierarchical all-reduce: the communicator has no store");
  }
  if (params.hosts.size() != static_cast<size_t>(params.size)) {
    throw InvalidArgument("hierarchical all-reduce: " + std::to_string(params.hosts.size()) +
                          " hosts for " + std::to_string(params.size) + " ranks");
  }
  why = agree(*params.store, storeBase(params.key_prefix), params.rank, params.size,
              whyNot(params.hosts, params.rank), params.config.connect_timeout);
  if (!why.empty()) return nullptr;
  std::unique_ptr<HierarchicalAllreduce> created(new HierarchicalAllreduce(
      params, HierarchyPlan::make(params.hosts, params.rank), *NcclApi::get()));
  created->connect(params);
  return created;
}

HierarchicalAllreduce::HierarchicalAllreduce(const Params& params, HierarchyPlan plan,
                                             const NcclApi& api)
    : plan_(std::move(plan)),
      api_(api),
      config_(params.config),
      size_(params.size),
      device_(params.device >= 0 ? params.device : kernels::cuda::currentDevice()) {}

HierarchicalAllreduce::~HierarchicalAllreduce() {
  cross_.reset();
  // After a failure the communicator is already aborted (and null).
  if (comm_ != nullptr) api_.commDestroy(comm_);
}

void HierarchicalAllreduce::connect(const Params& params) {
  const Deadline deadline = deadlineAfter(params.config.connect_timeout);
  const std::string host = plan_.node_hosts[static_cast<size_t>(plan_.node)];
  try {
    // One NCCL id per host, made by its local rank 0.
    const std::string id_key =
        storeBase(params.key_prefix) + "/nccl_id/" + std::to_string(plan_.node);
    nccl::UniqueId id{};
    if (plan_.local_rank == 0) {
      api_.check(api_.getUniqueId(&id), "ncclGetUniqueId");
      params.store->set(id_key, Store::Bytes(id.internal, id.internal + sizeof(id.internal)),
                        remaining(deadline));
    } else {
      const Store::Bytes bytes = params.store->get(id_key, remaining(deadline));
      if (bytes.size() != sizeof(id.internal)) {
        throw ProtocolError("hierarchical all-reduce: NCCL id of host " + host + " has " +
                            std::to_string(bytes.size()) + " bytes, expected " +
                            std::to_string(sizeof(id.internal)));
      }
      std::memcpy(id.internal, bytes.data(), bytes.size());
    }
    // NCCL binds the communicator to the current device. The buffers' device stays current
    // afterwards (as in every device collective): "restoring" a thread that had no device
    // yet would create a context on GPU 0 in every process.
    kernels::cuda::setDevice(device_);
    comm_ = api_.initRank(plan_.localSize(), id, plan_.local_rank, deadline,
                          "hierarchical all-reduce: NCCL inside host " + host);

    // One host: NCCL does the whole all-reduce, there is no level between hosts.
    if (plan_.numNodes() == 1) return;
    // Rail `local_rank`: this local rank on every host.
    Communicator::Options options;
    options.rank = plan_.node;
    options.size = plan_.numNodes();
    options.config = params.config;
    // One rank per host: its device all-reduces are staging ones; it must not try (or, with
    // RAILSHARD_NCCL=on, insist on) a two-level plan of its own.
    options.config.nccl = NcclMode::kOff;
    options.key_prefix = params.key_prefix + "/xnode/" + std::to_string(plan_.local_rank);
    options.advertise_host = params.advertise_host;
    options.store = params.store;
    cross_ = Communicator::create(*params.store, options);
  } catch (const std::exception& e) {
    fail(e.what());
    throw;
  }
}

void HierarchicalAllreduce::checkHealthy() {
  if (!failed_.empty()) {
    throw PeerLostError("hierarchical all-reduce: unusable after an earlier failure: " + failed_);
  }
  try {
    api_.checkAsync(comm_, "hierarchical all-reduce");
  } catch (const std::exception& e) {
    fail(e.what());
    throw;
  }
}

void HierarchicalAllreduce::fail(const std::string& reason) {
  if (failed_.empty()) failed_ = reason.empty() ? "unknown error" : reason;
  if (comm_ != nullptr) {
    api_.commAbort(comm_);
    comm_ = nullptr;
  }
}

template <typename Body>
void HierarchicalAllreduce::group(const char* what, Deadline deadline, Body&& body) {
  api_.check(api_.groupStart(), "ncclGroupStart", comm_);
  try {
    body();
  } catch (...) {
    api_.groupEnd();  // close the group; the caller aborts the communicator
    throw;
  }
  api_.check(api_.groupEnd(), "ncclGroupEnd", comm_);
  api_.waitReady(comm_, deadline, std::string("hierarchical all-reduce: ") + what);
}

void HierarchicalAllreduce::allreduce(const void* send, void* recv, size_t count, DataType dtype,
                                      ReduceOp op, void* stream, Communicator::Timeout timeout) {
  if (!failed_.empty()) {
    throw InvalidArgument("hierarchical all-reduce: unusable after an earlier failure: " + failed_);
  }
  if (count == 0) return;
  // The calling thread may be on another device (a process group's worker thread starts on
  // 0); kernels and the divide below must run on the buffers' device.
  kernels::cuda::setDevice(device_);
  const Deadline deadline =
      deadlineAfter(timeout.count() >= 0 ? Duration(timeout) : Duration(config_.timeout));
  const collectives::SegmentLayout shards = plan_.shards(count);
  const size_t element = sizeOf(dtype);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  // avg: sum at both levels, one divide by the world size (see the header).
  const ReduceOp level_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  const int nccl_dtype = nccl::dataType(dtype);
  const int nccl_op = nccl::redOp(level_op);
  const auto mine = static_cast<size_t>(plan_.local_rank);
  uint8_t* my_shard = out + shards.offset[mine] * element;
  const size_t my_length = shards.length[mine];
  try {
    api_.checkAsync(comm_, "hierarchical all-reduce");
    if (plan_.numNodes() == 1) {
      // Everything is inside this host: NCCL's own all-reduce (its ring/tree over NVLink) beats
      // a reduce + broadcast, and avg stays sum-then-divide as everywhere else.
      group("all-reduce inside the host", deadline, [&] {
        api_.check(api_.allReduce(in, out, count, nccl_dtype, nccl_op, comm_, stream),
                   "ncclAllReduce", comm_);
      });
      if (op == ReduceOp::kAvg) {
        kernels::cuda::divide(out, count, dtype, static_cast<size_t>(size_), stream);
      }
      api_.checkAsync(comm_, "hierarchical all-reduce");
      return;
    }
    group("reduce inside the host", deadline, [&] {
      for (size_t r = 0; r < shards.length.size(); ++r) {
        if (shards.length[r] == 0) continue;  // count < ranks per host: same on every rank
        const size_t at = shards.offset[r] * element;
        api_.check(api_.reduce(in + at, out + at, shards.length[r], nccl_dtype, nccl_op,
                               static_cast<int>(r), comm_, stream),
                   "ncclReduce", comm_);
      }
    });
    if (my_length > 0) {
      // Ordered after the reduce on `stream`; blocks until this rank's transfers are done.
      cross_->allreduce(my_shard, my_shard, my_length, dtype, level_op,
                        Communicator::Placement{MemoryKind::kDevice, stream}, remaining(deadline));
      if (op == ReduceOp::kAvg) {
        kernels::cuda::divide(my_shard, my_length, dtype, static_cast<size_t>(size_), stream);
      }
    }
    group("broadcast inside the host", deadline, [&] {
      for (size_t r = 0; r < shards.length.size(); ++r) {
        if (shards.length[r] == 0) continue;
        uint8_t* shard = out + shards.offset[r] * element;
        api_.check(api_.broadcast(shard, shard, shards.length[r], nccl_dtype, static_cast<int>(r),
                                  comm_, stream),
                   "ncclBroadcast", comm_);
      }
    });
    api_.checkAsync(comm_, "hierarchical all-reduce");
  } catch (const std::exception& e) {
    // Abort: this rank never blocks in NCCL again, and its NCCL resources are freed at once.
    // Local peers waiting for its shard in the broadcast are bounded by their own deadlines
    // (their next wait on the stream times out), after which they abort too.
    fail(e.what());
    throw;
  }
}

std::string HierarchicalAllreduce::describe() const {
  if (plan_.numNodes() == 1) {
    return "NCCL " + api_.versionString() + " all-reduce inside one host of " +
           std::to_string(plan_.localSize()) + " ranks";
  }
  return "hierarchical: NCCL " + api_.versionString() + " inside " +
         std::to_string(plan_.numNodes()) + " hosts x " + std::to_string(plan_.localSize()) +
         " ranks, railshard between hosts";
}

}  // namespace railshard
