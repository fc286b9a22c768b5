#include "core/communicator.h"

#include <cstring>
#include <limits>
#include <string>

#include "base/error.h"
#include "base/logging.h"
#include "base/trace.h"
#include "core/channels.h"
#include "core/collective_tag.h"
#include "core/collectives/algorithms.h"
#include "core/collectives/context.h"
#include "core/collectives/shm_engine.h"
#include "core/collectives/two_level.h"
#include "core/diagnostics.h"
#include "core/membership.h"
#include "core/planner.h"
#include "core/point_to_point.h"
#include "kernels/reduce.h"

namespace railshard {

std::unique_ptr<Communicator> Communicator::create(Store& store, const Options& options) {
  if (options.size < 1) {
    throw InvalidArgument("Communicator: world size must be >= 1, got " +
                          std::to_string(options.size));
  }
  if (!options.world_ranks.empty() &&
      options.world_ranks.size() != static_cast<size_t>(options.size)) {
    throw InvalidArgument("Communicator: world_ranks has " +
                          std::to_string(options.world_ranks.size()) + " entries for " +
                          std::to_string(options.size) + " ranks");
  }
  if (options.rank < 0 || options.rank >= options.size) {
    throw InvalidArgument("Communicator: rank " + std::to_string(options.rank) +
                          " is outside [0, " + std::to_string(options.size) + ")");
  }
  RS_LOG_DEBUG("rank {}/{}: config: {}", options.rank, options.size, options.config.describe());
  // Resolves RAILSHARD_KERNEL_ISA now, so a bad value fails at start-up, not mid-training.
  RS_LOG_DEBUG("rank {}: reduction kernels: {}", options.rank, kernels::activeIsa());
  collectives::Algorithm ignored;
  collectives::parseAlgorithm(options.config.algorithm, ignored);  // ConfigError when unknown
  Channels::Options channels;
  channels.rank = options.rank;
  channels.size = options.size;
  channels.key_prefix = options.key_prefix;
  channels.advertise_host = options.advertise_host;
  channels.config = &options.config;
  channels.topology = options.topology.get();
  std::unique_ptr<Communicator> communicator(
      new Communicator(options, Channels::connect(store, channels)));
  communicator->diagnostics_->start(store);
  return communicator;
}

Communicator::Communicator(const Options& options, std::unique_ptr<Channels> channels)
    : rank_(options.rank),
      size_(options.size),
      config_(options.config),
      membership_(std::make_unique<Membership>(options)),
      channels_(std::move(channels)),
      workspace_(std::make_unique<collectives::Workspace>()) {
  device_ = std::make_unique<DevicePath>(config_, *membership_);
  planner_ = std::make_unique<Planner>(config_, *channels_, rank_, size_);
  diagnostics_ = std::make_unique<Diagnostics>(config_, *membership_, *channels_, *planner_);
  auto explain = [this](const transport::MessageTag& tag) {
    return diagnostics_->diagnoseMissing(tag);
  };
  channels_->mesh().setTimeoutExplainer(explain);
  if (channels_->engine() != nullptr) channels_->engine()->setTimeoutExplainer(explain);
}

Communicator::~Communicator() {
  diagnostics_.reset();  // its publisher's thread and metrics collector stop first
  membership_->markClosed(config_);
}

const std::vector<int>& Communicator::worldRanks() const {
  return membership_->worldRanks();
}
int Communicator::worldRank() const {
  return membership_->worldRank();
}
int Communicator::generation() const {
  return membership_->generation();
}
int Communicator::launchRanks() const {
  return membership_->launchRanks();
}
bool Communicator::usesSharedMemory() const {
  return channels_->oneHost();
}
bool Communicator::usesHostSharedMemory() const {
  return channels_->twoLevel();
}
const collectives::HostLayout* Communicator::hostLayout() const {
  return channels_->layout();
}
const collectives::MeasuredLinks& Communicator::measuredLinks() const {
  return channels_->measured();
}
tracing::LinkLimit Communicator::linkLimit() const {
  return diagnostics_->linkLimit();
}
std::string_view Communicator::lastAlgorithm() const {
  return planner_->last();
}
transport::Transport& Communicator::transport() {
  return channels_->mesh();
}
const topology::Topology* Communicator::topology() const {
  return membership_->topology();
}

void Communicator::checkBuffer(const char* collective, const char* what, const void* buffer,
                               size_t count, DataType dtype) const {
  const size_t element = sizeOf(dtype);
  if (count > std::numeric_limits<size_t>::max() / (element * static_cast<size_t>(size_))) {
    throw InvalidArgument(std::string(collective) + ": count " + std::to_string(count) +
                          " overflows the addressable size");
  }
  if (buffer == nullptr && count > 0) {
    throw InvalidArgument(std::string(collective) + ": " + what + " buffer is null with count " +
                          std::to_string(count));
  }
}

void Communicator::checkDisjoint(const char* collective, const void* send, size_t send_bytes,
                                 const void* recv, size_t recv_bytes, bool in_place_allowed) {
  if (in_place_allowed && send == recv) return;
  const auto s = reinterpret_cast<uintptr_t>(send);
  const auto r = reinterpret_cast<uintptr_t>(recv);
  if (send_bytes > 0 && recv_bytes > 0 && s < r + recv_bytes && r < s + send_bytes) {
    // A partial overlap would be read by peers while this rank writes it: the result would
    // depend on timing, so it is refused rather than silently wrong.
    throw InvalidArgument(std::string(collective) + ": the send and recv buffers overlap" +
                          (in_place_allowed
                               ? " (in place, pass the same buffer as both)"
                               : " (" + std::string(collective) + " is not in place)"));
  }
}

void Communicator::checkTypes(const char* collective, DataType dtype, ReduceOp op) const {
  if (!isValid(dtype)) {
    throw InvalidArgument(std::string(collective) + ": invalid dtype " +
                          std::to_string(static_cast<int>(dtype)));
  }
  if (!isValid(op)) {
    throw InvalidArgument(std::string(collective) + ": invalid op " +
                          std::to_string(static_cast<int>(op)));
  }
}

Duration Communicator::timeoutFor(const char* collective, Timeout timeout) const {
  if (timeout == kDefaultTimeout) return std::chrono::duration_cast<Duration>(config_.timeout);
  if (timeout <= Timeout::zero()) {
    throw InvalidArgument(std::string(collective) + ": timeout must be positive, got " +
                          std::to_string(timeout.count()) + " ms");
  }
  return std::chrono::duration_cast<Duration>(timeout);
}

void Communicator::run(const transport::MessageTag& tag, Duration timeout, size_t bytes,
                       const char* algorithm, FunctionRef<void(const collectives::Context&)> fn,
                       bool over_transport) {
  diagnostics_->entered(tag);
  collectives::ShmEngine* engine = channels_->engine();
  if (engine != nullptr) engine->setTimeout(timeout);
  const trace::ScopedRank trace_rank(worldRank());
  trace::Span span(trace::Category::kCollective, collectiveName(tag));
  if (span.active()) {
    trace::Event& e = span.event();
    e.seq = tag.sequence;
    e.generation = generation();
    e.bytes = bytes;
    e.size = size_;
    e.detail = algorithm;
    e.dtype = tag.dtype;
    e.op = tag.collective == static_cast<uint8_t>(CollectiveKind::kAllreduce) ||
                   tag.collective == static_cast<uint8_t>(CollectiveKind::kReduceScatter)
               ? tag.op
               : 0xff;
    if (tag.collective == static_cast<uint8_t>(CollectiveKind::kBroadcast)) {
      e.root = static_cast<int32_t>(tag.root);
    }
    if (tag.collective == static_cast<uint8_t>(CollectiveKind::kBarrier)) e.dtype = 0xff;
    e.failed = true;  // until it returns
  }
  // The group's error state carries the error to every rank before this one can close (the
  // host's segment among them: a rank that closed first would leave the host's other ranks to
  // report "closed its communicator" instead of the cause).
  const auto failed = [&](const std::exception& e) {
    if (diagnostics_->counting()) diagnostics_->countError(e);
    if (engine != nullptr) engine->abort(kindOf(e), e.what());
  };
  transport::messaging::Mesh& mesh = channels_->mesh();
  try {
    if (channels_->oneHost() && !over_transport) {
      mesh.checkHealthy();
    } else {
      mesh.enterCollective(tag);
    }
    fn(collectives::Context{mesh, rank_, size_, config_.chunk_bytes, timeout, tag, *workspace_});
  } catch (const PeerLostError& e) {
    failed(e);
    throw PeerLostError(diagnostics_->explainLoss(tag, e.what()));
  } catch (const TimeoutError& e) {
    failed(e);
    throw TimeoutError(diagnostics_->explainTimeout(tag, e.what()));
  } catch (const std::exception& e) {
    failed(e);
    throw;
  }
  span.event().failed = false;
  if (diagnostics_->counting()) {
    diagnostics_->countCollective(collectiveName(tag), algorithm, bytes, diagnostics_->waited());
  }
}

DevicePath::Call Communicator::deviceCall() {
  return DevicePath::Call{
      sequence_, *planner_,
      [this](const transport::MessageTag& tag, Duration timeout, size_t bytes,
             const char* algorithm, const std::function<void(const collectives::Context&)>& fn) {
        run(tag, timeout, bytes, algorithm, fn, true);
      }};
}

void Communicator::allreduce(const void* send, void* recv, size_t count, DataType dtype,
                             ReduceOp op, const Placement& placement, Timeout timeout) {
  membership_->checkUsable("allreduce");
  checkTypes("allreduce", dtype, op);
  checkBuffer("allreduce", "send", send, count, dtype);
  checkBuffer("allreduce", "recv", recv, count, dtype);
  checkDisjoint("allreduce", send, count * sizeOf(dtype), recv, count * sizeOf(dtype), true);
  const Duration deadline = timeoutFor("allreduce", timeout);
  if (device_->onDevice("allreduce", placement, send, recv, count)) {
    return device_->allreduce(deviceCall(), send, recv, count, dtype, op, placement.stream,
                              deadline);
  }
  const auto tag = makeTag(CollectiveKind::kAllreduce, sequence_++, dtype, op, count, 0);
  if (size_ == 1) {
    planner_->ran("local");
    if (send != recv && count > 0) std::memcpy(recv, send, count * sizeOf(dtype));
    return;
  }
  const size_t bytes = count * sizeOf(dtype);
  const collectives::Algorithm algorithm = planner_->allreduce(bytes, tag);
  collectives::ShmEngine* engine = channels_->engine();
  const collectives::HostLayout* layout = channels_->layout();
  run(tag, deadline, bytes, planner_->last().data(), [&](const collectives::Context& context) {
    switch (algorithm) {
      case collectives::Algorithm::kShmDirect:
        return engine->allreduceDirect(send, recv, count, dtype, op, tag);
      case collectives::Algorithm::kShmReduceScatterGather:
        return engine->allreduceReduceScatterGather(send, recv, count, dtype, op, tag);
      case collectives::Algorithm::kRecursiveDoubling:
        return collectives::recursiveDoublingAllreduce(context, send, recv, count, dtype, op);
      case collectives::Algorithm::kRing:
        return collectives::ringAllreduce(context, send, recv, count, dtype, op);
      case collectives::Algorithm::kTwoLevel:
        return collectives::twoLevelAllreduce(context, engine, *layout, send, recv, count, dtype,
                                              op);
      case collectives::Algorithm::kTwoLevelDirect:
        return collectives::twoLevelDirectAllreduce(context, engine, *layout, send, recv, count,
                                                    dtype, op);
      case collectives::Algorithm::kTwoLevelLeader:
        return collectives::twoLevelLeaderAllreduce(context, engine, *layout, send, recv, count,
                                                    dtype, op);
    }
  });
}

void Communicator::reduceScatter(const void* send, void* recv, size_t recv_count, DataType dtype,
                                 ReduceOp op, const Placement& placement, Timeout timeout) {
  membership_->checkUsable("reduce_scatter");
  checkTypes("reduce_scatter", dtype, op);
  checkBuffer("reduce_scatter", "send", send, recv_count * static_cast<size_t>(size_), dtype);
  checkBuffer("reduce_scatter", "recv", recv, recv_count, dtype);
  const Duration deadline = timeoutFor("reduce_scatter", timeout);
  if (device_->onDevice("reduce_scatter", placement, send, recv, recv_count)) {
    return device_->reduceScatter(deviceCall(), send, recv, recv_count, dtype, op, placement.stream,
                                  deadline);
  }
  const auto tag = makeTag(CollectiveKind::kReduceScatter, sequence_++, dtype, op, recv_count, 0);
  const size_t bytes = recv_count * static_cast<size_t>(size_) * sizeOf(dtype);
  run(tag, deadline, bytes,
      channels_->oneHost()    ? "shm"
      : channels_->twoLevel() ? "two_level"
                              : "ring",
      [&](const collectives::Context& context) {
        if (channels_->oneHost())
          return channels_->engine()->reduceScatter(send, recv, recv_count, dtype, op, tag);
        if (channels_->twoLevel()) {
          return collectives::twoLevelReduceScatter(context, channels_->engine(),
                                                    *channels_->layout(), send, recv, recv_count,
                                                    dtype, op);
        }
        collectives::ringReduceScatter(context, send, recv, recv_count, dtype, op);
      });
}

void Communicator::allgather(const void* send, void* recv, size_t send_count, DataType dtype,
                             const Placement& placement, Timeout timeout) {
  membership_->checkUsable("allgather");
  checkTypes("allgather", dtype, ReduceOp::kSum);
  checkBuffer("allgather", "send", send, send_count, dtype);
  checkBuffer("allgather", "recv", recv, send_count * static_cast<size_t>(size_), dtype);
  const Duration deadline = timeoutFor("allgather", timeout);
  if (device_->onDevice("allgather", placement, send, recv, send_count)) {
    return device_->allgather(deviceCall(), send, recv, send_count, dtype, placement.stream,
                              deadline);
  }
  const auto tag =
      makeTag(CollectiveKind::kAllgather, sequence_++, dtype, ReduceOp::kSum, send_count, 0);
  const size_t bytes = send_count * static_cast<size_t>(size_) * sizeOf(dtype);
  const bool leaders =
      channels_->twoLevel() && collectives::allgatherThroughLeaders(*channels_->layout(), bytes);
  run(tag, deadline, bytes,
      channels_->oneHost()    ? "shm"
      : leaders               ? "two_level_leader"
      : channels_->twoLevel() ? "two_level"
                              : "ring",
      [&](const collectives::Context& context) {
        if (channels_->oneHost())
          return channels_->engine()->allgather(send, recv, send_count, dtype, tag);
        if (channels_->twoLevel()) {
          const auto& layout = *channels_->layout();
          if (leaders) {
            return collectives::twoLevelLeaderAllgather(context, channels_->engine(), layout, send,
                                                        recv, send_count, dtype);
          }
          return collectives::twoLevelAllgather(context, channels_->engine(), layout, send, recv,
                                                send_count, dtype);
        }
        collectives::ringAllgather(context, send, recv, send_count, dtype);
      });
}

void Communicator::broadcast(const void* send, void* recv, size_t count, DataType dtype, int root,
                             const Placement& placement, Timeout timeout) {
  membership_->checkUsable("broadcast");
  checkTypes("broadcast", dtype, ReduceOp::kSum);
  if (root < 0 || root >= size_) {
    throw InvalidArgument("broadcast: root " + std::to_string(root) + " is outside [0, " +
                          std::to_string(size_) + ")");
  }
  if (rank_ == root) checkBuffer("broadcast", "send", send, count, dtype);
  checkBuffer("broadcast", "recv", recv, count, dtype);
  const Duration deadline = timeoutFor("broadcast", timeout);
  // Only the root's send buffer is read; elsewhere it may be anything (often null).
  if (device_->onDevice("broadcast", placement, rank_ == root ? send : nullptr, recv, count)) {
    return device_->broadcast(deviceCall(), send, recv, count, dtype, root, placement.stream,
                              deadline);
  }
  const auto tag = makeTag(CollectiveKind::kBroadcast, sequence_++, dtype, ReduceOp::kSum, count,
                           static_cast<uint32_t>(root));
  run(tag, deadline, count * sizeOf(dtype),
      channels_->oneHost()    ? "shm"
      : channels_->twoLevel() ? "two_level"
                              : "chain",
      [&](const collectives::Context& context) {
        if (channels_->oneHost())
          return channels_->engine()->broadcast(send, recv, count, dtype, root, tag);
        if (channels_->twoLevel()) {
          return collectives::twoLevelBroadcast(context, channels_->engine(), *channels_->layout(),
                                                send, recv, count, dtype, root);
        }
        collectives::chainBroadcast(context, send, recv, count, dtype, root);
      });
}

void Communicator::barrier(Timeout timeout) {
  membership_->checkUsable("barrier");
  const Duration deadline = timeoutFor("barrier", timeout);
  const auto tag =
      makeTag(CollectiveKind::kBarrier, sequence_++, DataType::kUInt8, ReduceOp::kSum, 0, 0);
  run(tag, deadline, 0,
      channels_->oneHost()    ? "shm"
      : channels_->twoLevel() ? "two_level"
                              : "dissemination",
      [&](const collectives::Context& context) {
        if (channels_->oneHost()) return channels_->engine()->barrier(tag);
        if (channels_->twoLevel())
          return collectives::twoLevelBarrier(context, channels_->engine(), *channels_->layout());
        collectives::disseminationBarrier(context);
      });
}

void Communicator::abort(const std::string& reason) {
  membership_->checkUsable("abort");
  membership_->markAborted(reason.empty() ? std::string("(no reason given)") : reason);
  const std::string message = "rank " + std::to_string(rank_) +
                              ": the application aborted the communicator: " +
                              (reason.empty() ? std::string("(no reason given)") : reason);
  channels_->mesh().abort(makeError(ErrorKind::kGeneric, message), true);
}

}  // namespace railshard
