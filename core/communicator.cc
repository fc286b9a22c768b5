#include "core/communicator.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <thread>

#include "base/error.h"
#include "base/logging.h"
#include "base/trace.h"
#include "core/channels.h"
#include "core/collective_tag.h"
#include "core/collectives/algorithms.h"
#include "core/collectives/context.h"
#include "core/collectives/cuda_device_ops.h"
#include "core/collectives/shm_engine.h"
#include "core/collectives/tuner.h"
#include "core/collectives/two_level.h"
#include "core/hierarchical_allreduce.h"
#include "core/point_to_point.h"
#include "core/progress_publisher.h"
#include "core/shm_messages.h"
#include "core/topology/topology.h"
#include "kernels/reduce.h"
#include "transport/links/shm/host_identity.h"
#include "transport/links/shm/shm_segment.h"


namespace railshard {

namespace {

// How often a rank's position (the collective it is in) reaches the store; a timeout's
// diagnosis is as fresh as this.
constexpr auto kPublishPeriod = std::chrono::milliseconds(200);

}  // namespace

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
  ChannelOptions channels;
  channels.rank = options.rank;
  channels.size = options.size;
  channels.key_prefix = options.key_prefix;
  channels.advertise_host = options.advertise_host;
  channels.config = &options.config;
  channels.topology = options.topology.get();
  std::unique_ptr<transport::Transport> transport = connectChannels(store, channels);
  std::unique_ptr<Communicator> communicator(new Communicator(options, std::move(transport)));
  communicator->setUpSharedMemory(store, options.key_prefix);
  // One host's ranks share a segment: all of them (shm_) or this host's of several (host_shm_).
  collectives::ShmEngine* engine = communicator->engine();
  if (engine != nullptr) {
    transport::Transport* tcp_transport = communicator->transport_.get();
    engine->setHealthCheck([tcp_transport] { tcp_transport->checkHealthy(); });
    // A peer lost on the TCP side (closed connection, heartbeat) wakes shared-memory waits at
    // once instead of at their next health check.
    communicator->transport_->setFailureListener(
        [engine](ErrorKind kind, const std::string& message) { engine->abort(kind, message); });
  }
  Communicator* self = communicator.get();
  auto explain = [self](const transport::MessageTag& tag) { return self->diagnoseMissing(tag); };
  communicator->transport_->setTimeoutExplainer(explain);
  if (engine != nullptr) engine->setTimeoutExplainer(explain);
  communicator->setUpTracing(store, options);
  communicator->setUpMetrics();
  if (options.store && options.size > 1) {
    communicator->publisher_ = std::make_unique<ProgressPublisher>(
        options.store, options.key_prefix + "/entered/" + std::to_string(options.rank),
        kPublishPeriod);
  }
  return communicator;
}

Communicator::Communicator(const Options& options, std::unique_ptr<transport::Transport> transport)
    : rank_(options.rank),
      size_(options.size),
      config_(options.config),
      transport_(std::move(transport)),
      topology_(options.topology),
      workspace_(std::make_unique<collectives::Workspace>()),
      store_(options.store),
      world_ranks_(options.world_ranks),
      generation_(options.generation),
      launch_ranks_(options.launch_ranks > 0 ? options.launch_ranks : options.size),
      key_prefix_(options.key_prefix),
      key_root_(options.key_root.empty() ? options.key_prefix : options.key_root),
      advertise_host_(options.advertise_host),
      extend_topology_(options.extend_topology) {
  if (world_ranks_.empty()) {
    for (int r = 0; r < size_; ++r) world_ranks_.push_back(r);
  }
}

// The publisher's thread stops before the transport and store it uses go away.
Communicator::~Communicator() {
  // Its last description stays with the trace, for the file written at exit.
  if (trace_provider_ != 0) trace::removeMetadataProvider(trace_provider_);
  tearDownMetrics();  // its collector reads the transport
  publisher_.reset();
  markClosed();
  transport_->setFailureListener(nullptr);  // the engine it wakes goes first
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

void Communicator::checkUsable(const char* collective) const {
  if (retired_ != nullptr) {
    throw InvalidArgument(std::string(collective) + ": this communicator (generation " +
                          std::to_string(generation_) + ") was " +
                          (std::string(retired_) == "shrink" ? "shrunk" : "grown") +
                          "; use the communicator " + retired_ + "() returned");
  }
  if (!aborted_.empty()) {
    throw InvalidArgument(std::string(collective) +
                          ": this communicator was aborted by the application: " + aborted_);
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

namespace {

// The value of `key` if it is set, without waiting.
std::optional<std::string> peek(Store& store, const std::string& key) {
  try {
    return store.getString(key, Duration::zero());
  } catch (const TimeoutError&) {
    return std::nullopt;
  }
}

// The collective's name as a literal (name() returns views of literals).
const char* collectiveName(const transport::MessageTag& tag) {
  return name(static_cast<CollectiveKind>(tag.collective)).data();
}

std::string joinRanks(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) text += ',';
    text += std::to_string(ranks[i]);
  }
  return text;
}

}  // namespace

std::string Communicator::describeRank(int rank) const {
  std::string text = "rank " + std::to_string(rank);
  std::vector<std::string> notes;
  const int world = world_ranks_[static_cast<size_t>(rank)];
  if (world != rank) notes.push_back("launch rank " + std::to_string(world));
  if (topology_ != nullptr && topology_->worldSize() == size_) {
    notes.push_back("host " + topology_->rank(rank).host);
  }
  for (size_t i = 0; i < notes.size(); ++i) text += (i == 0 ? " (" : ", ") + notes[i];
  if (!notes.empty()) text += ")";
  return text;
}

std::string Communicator::explainLoss(const transport::MessageTag& tag, double waited,
                                      const std::string& error) {
  auto lost = transport_->lostPeers();
  // Over shared memory the engine sees a dead peer's pid first; its TCP connection (same
  // process) ends at the same moment, and the transport says which rank that was.
  for (int i = 0; i < 20 && lost.empty() && engine() != nullptr; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    lost = transport_->lostPeers();
  }
  std::string who;
  for (const auto& peer : lost) {
    who += (who.empty() ? "" : ", ") + describeRank(peer.rank);
    // Early, so that the survivors' shrink() need not wait for this rank to say it.
    if (publisher_) {
      auto [key, value] = lostMarkFor(peer);
      publisher_->post(std::move(key), std::move(value));
    }
  }
  return "rank " + std::to_string(rank_) + ": " + describeTag(tag) + " failed after waiting " +
         formatSeconds(waited) + ": lost " + (who.empty() ? "a peer" : who) + ": " + error;
}

std::string Communicator::diagnoseMissing(const transport::MessageTag& tag) {
  if (PointToPoint::isPointToPoint(tag)) {
    // Only the two ranks of a pair know about its messages; nothing is published.
    return "the peer has not posted the matching send or recv (messages between two ranks "
           "match in the order they are posted)";
  }
  if (!store_ || !publisher_) return {};
  const double waited = std::chrono::duration<double>(Clock::now() - collective_start_).count();
  publisher_->flush();
  std::vector<int> missing;
  std::vector<int> waiting;
  std::string lasts;
  const std::string name(collectiveName(tag));
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) {
      waiting.push_back(r);
      continue;
    }
    std::optional<std::string> position;
    try {
      position = peek(*store_, key_prefix_ + "/entered/" + std::to_string(r));
    } catch (const Error& e) {
      return std::string("who is missing is unknown: ") + e.what();
    }
    const uint64_t sequence = position ? std::strtoull(position->c_str(), nullptr, 10) : 0;
    if (position && sequence >= tag.sequence) {
      waiting.push_back(r);
      continue;
    }
    missing.push_back(r);
    if (!lasts.empty()) lasts += "; ";
    lasts += describeRank(r) + ": ";
    if (position) {
      lasts += "last entered " + position->substr(position->find(' ') + 1) + " #" +
               std::to_string(sequence);
    } else {
      lasts += "entered no collective";
    }
  }
  if (missing.empty()) {
    return "every rank entered " + name + " #" + std::to_string(tag.sequence) +
           ", but data stopped flowing (a stalled network path or a hung process?)";
  }
  return std::string(missing.size() == 1 ? "rank " : "ranks ") + joinRanks(missing) +
         " never entered " + name + " #" + std::to_string(tag.sequence) + " (ranks " +
         joinRanks(waiting) + " waiting " + formatSeconds(waited) + "; " + lasts + ")";
}

std::string Communicator::explainTimeout(const transport::MessageTag& tag, double waited,
                                         const std::string& error) {
  // The rank that timed out first said who was missing before it told the others; only a
  // rank that timed out without that (an algorithm's own deadline) asks the store itself.
  const bool explained = error.find(" never entered ") != std::string::npos ||
                         error.find("every rank entered") != std::string::npos ||
                         error.find("who is missing is unknown") != std::string::npos;
  const std::string diagnosis = explained ? std::string() : diagnoseMissing(tag);
  return "rank " + std::to_string(rank_) + ": " + describeTag(tag) + " timed out after " +
         formatSeconds(waited) + (diagnosis.empty() ? "" : ": " + diagnosis) + " -- " + error;
}

template <typename Fn>
void Communicator::run(const transport::MessageTag& tag, Duration timeout, size_t bytes,
                       const char* algorithm, Fn&& fn, bool over_transport) {
  if (publisher_) publisher_->entered(tag.sequence, collectiveName(tag));
  if (engine() != nullptr) engine()->setTimeout(timeout);
  const trace::ScopedRank trace_rank(worldRank());
  trace::Span span(trace::Category::kCollective, collectiveName(tag));
  if (span.active()) {
    trace::Event& e = span.event();
    e.seq = tag.sequence;
    e.generation = generation_;
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
  const Clock::time_point start = Clock::now();
  collective_start_ = start;
  auto waited = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  // The host's segment carries the error before this rank can close: the transport's failure
  // listener would too, but from its own thread, and a rank that closed first would leave the
  // host's other ranks to report "closed its communicator" instead of the cause.
  const auto failed = [&](const std::exception& e) {
    if (metrics_) countError(e);
    if (engine() != nullptr) engine()->abort(kindOf(e), e.what());
  };
  try {
    if (shm_ && !over_transport) {
      transport_->checkHealthy();
    } else {
      transport_->enterCollective(tag);
    }
    fn(collectives::Context{*transport_, rank_, size_, config_.chunk_bytes, timeout, tag,
                            *workspace_});
  } catch (const PeerLostError& e) {
    failed(e);
    throw PeerLostError(explainLoss(tag, waited(), e.what()));
  } catch (const TimeoutError& e) {
    failed(e);
    throw TimeoutError(explainTimeout(tag, waited(), e.what()));
  } catch (const std::exception& e) {
    failed(e);
    throw;
  }
  span.event().failed = false;
  if (metrics_) countCollective(collectiveName(tag), algorithm, bytes, waited());
}

void Communicator::runOutOfLine(const transport::MessageTag& tag, Duration timeout, size_t bytes,
                                const char* algorithm,
                                const std::function<void(const collectives::Context&)>& fn,
                                bool over_transport) {
  run(tag, timeout, bytes, algorithm, fn, over_transport);
}

void Communicator::allreduce(const void* send, void* recv, size_t count, DataType dtype,
                             ReduceOp op, const Placement& placement, Timeout timeout) {
  checkUsable("allreduce");
  checkTypes("allreduce", dtype, op);
  checkBuffer("allreduce", "send", send, count, dtype);
  checkBuffer("allreduce", "recv", recv, count, dtype);
  checkDisjoint("allreduce", send, count * sizeOf(dtype), recv, count * sizeOf(dtype), true);
  const Duration deadline = timeoutFor("allreduce", timeout);
  if (onDevice("allreduce", placement, send, recv, count)) {
    return allreduceOnDevice(send, recv, count, dtype, op, placement.stream, deadline);
  }
  const auto tag = makeTag(CollectiveKind::kAllreduce, sequence_++, dtype, op, count, 0);
  if (size_ == 1) {
    last_algorithm_ = "local";
    if (send != recv && count > 0) std::memcpy(recv, send, count * sizeOf(dtype));
    return;
  }
  collectives::TunerInput input;
  input.bytes = count * sizeOf(dtype);
  input.world_size = size_;
  input.shm = shm_ != nullptr;
  input.shm_slot_bytes = two_level_ ? host_slot_bytes_ : shm_ ? shm_->slotBytes() : 0;
  input.hosts = layout_ ? layout_->hostCount() : 1;
  input.ranks_per_host = layout_ ? layout_->maxLocal() : size_;
  input.host_shm = two_level_;
  input.network = network_;
  input.shm_link = measured_.shm;
  input.reduce_gbps = measured_.reduce_gbps;
  // Users ask which algorithm ran; at debug level every all-reduce says so, with the model's
  // estimates behind the choice. Only then are the strings built: they cost more than a
  // small shared-memory all-reduce.
  const bool explain = log::logger().should_log(spdlog::level::debug);
  // The choice depends only on the size (and the communicator's fixed properties), and
  // training repeats the same sizes: remember the last one.
  if (explain || input.bytes != tuned_bytes_ || !tuned_) {
    const auto choice = collectives::chooseAllreduce(input, config_.algorithm, explain);
    tuned_ = true;
    tuned_bytes_ = input.bytes;
    tuned_algorithm_ = choice.algorithm;
    if (explain) {
      RS_LOG_DEBUG("rank {}: {} -> {} ({})", rank_, describeTag(tag),
                   collectives::name(choice.algorithm), choice.reason);
    }
  }
  last_algorithm_ = collectives::name(tuned_algorithm_);
  run(tag, deadline, input.bytes, last_algorithm_.data(), [&](const collectives::Context& context) {
    switch (tuned_algorithm_) {
      case collectives::Algorithm::kShmDirect:
        return shm_->allreduceDirect(send, recv, count, dtype, op, tag);
      case collectives::Algorithm::kShmReduceScatterGather:
        return shm_->allreduceReduceScatterGather(send, recv, count, dtype, op, tag);
      case collectives::Algorithm::kRecursiveDoubling:
        return collectives::recursiveDoublingAllreduce(context, send, recv, count, dtype, op);
      case collectives::Algorithm::kRing:
        return collectives::ringAllreduce(context, send, recv, count, dtype, op);
      case collectives::Algorithm::kTwoLevel:
        return collectives::twoLevelAllreduce(context, host_shm_.get(), *layout_, send, recv, count,
                                              dtype, op);
      case collectives::Algorithm::kTwoLevelDirect:
        return collectives::twoLevelDirectAllreduce(context, host_shm_.get(), *layout_, send, recv,
                                                    count, dtype, op);
    }
  });
}

void Communicator::reduceScatter(const void* send, void* recv, size_t recv_count, DataType dtype,
                                 ReduceOp op, const Placement& placement, Timeout timeout) {
  checkUsable("reduce_scatter");
  checkTypes("reduce_scatter", dtype, op);
  checkBuffer("reduce_scatter", "send", send, recv_count * static_cast<size_t>(size_), dtype);
  checkBuffer("reduce_scatter", "recv", recv, recv_count, dtype);
  const Duration deadline = timeoutFor("reduce_scatter", timeout);
  if (onDevice("reduce_scatter", placement, send, recv, recv_count)) {
    return reduceScatterOnDevice(send, recv, recv_count, dtype, op, placement.stream, deadline);
  }
  const auto tag = makeTag(CollectiveKind::kReduceScatter, sequence_++, dtype, op, recv_count, 0);
  const size_t bytes = recv_count * static_cast<size_t>(size_) * sizeOf(dtype);
  run(tag, deadline, bytes,
      shm_         ? "shm"
      : two_level_ ? "two_level"
                   : "ring",
      [&](const collectives::Context& context) {
        if (shm_) return shm_->reduceScatter(send, recv, recv_count, dtype, op, tag);
        if (two_level_) {
          return collectives::twoLevelReduceScatter(context, host_shm_.get(), *layout_, send, recv,
                                                    recv_count, dtype, op);
        }
        collectives::ringReduceScatter(context, send, recv, recv_count, dtype, op);
      });
}

void Communicator::allgather(const void* send, void* recv, size_t send_count, DataType dtype,
                             const Placement& placement, Timeout timeout) {
  checkUsable("allgather");
  checkTypes("allgather", dtype, ReduceOp::kSum);
  checkBuffer("allgather", "send", send, send_count, dtype);
  checkBuffer("allgather", "recv", recv, send_count * static_cast<size_t>(size_), dtype);
  const Duration deadline = timeoutFor("allgather", timeout);
  if (onDevice("allgather", placement, send, recv, send_count)) {
    return allgatherOnDevice(send, recv, send_count, dtype, placement.stream, deadline);
  }
  const auto tag =
      makeTag(CollectiveKind::kAllgather, sequence_++, dtype, ReduceOp::kSum, send_count, 0);
  const size_t bytes = send_count * static_cast<size_t>(size_) * sizeOf(dtype);
  run(tag, deadline, bytes,
      shm_         ? "shm"
      : two_level_ ? "two_level"
                   : "ring",
      [&](const collectives::Context& context) {
        if (shm_) return shm_->allgather(send, recv, send_count, dtype, tag);
        if (two_level_) {
          return collectives::twoLevelAllgather(context, host_shm_.get(), *layout_, send, recv,
                                                send_count, dtype);
        }
        collectives::ringAllgather(context, send, recv, send_count, dtype);
      });
}

void Communicator::broadcast(const void* send, void* recv, size_t count, DataType dtype, int root,
                             const Placement& placement, Timeout timeout) {
  checkUsable("broadcast");
  checkTypes("broadcast", dtype, ReduceOp::kSum);
  if (root < 0 || root >= size_) {
    throw InvalidArgument("broadcast: root " + std::to_string(root) + " is outside [0, " +
                          std::to_string(size_) + ")");
  }
  if (rank_ == root) checkBuffer("broadcast", "send", send, count, dtype);
  checkBuffer("broadcast", "recv", recv, count, dtype);
  const Duration deadline = timeoutFor("broadcast", timeout);
  // Only the root's send buffer is read; elsewhere it may be anything (often null).
  if (onDevice("broadcast", placement, rank_ == root ? send : nullptr, recv, count)) {
    return broadcastOnDevice(send, recv, count, dtype, root, placement.stream, deadline);
  }
  const auto tag = makeTag(CollectiveKind::kBroadcast, sequence_++, dtype, ReduceOp::kSum, count,
                           static_cast<uint32_t>(root));
  run(tag, deadline, count * sizeOf(dtype),
      shm_         ? "shm"
      : two_level_ ? "two_level"
                   : "chain",
      [&](const collectives::Context& context) {
        if (shm_) return shm_->broadcast(send, recv, count, dtype, root, tag);
        if (two_level_) {
          return collectives::twoLevelBroadcast(context, host_shm_.get(), *layout_, send, recv,
                                                count, dtype, root);
        }
        collectives::chainBroadcast(context, send, recv, count, dtype, root);
      });
}

void Communicator::barrier(Timeout timeout) {
  checkUsable("barrier");
  const Duration deadline = timeoutFor("barrier", timeout);
  const auto tag =
      makeTag(CollectiveKind::kBarrier, sequence_++, DataType::kUInt8, ReduceOp::kSum, 0, 0);
  run(tag, deadline, 0,
      shm_         ? "shm"
      : two_level_ ? "two_level"
                   : "dissemination",
      [&](const collectives::Context& context) {
        if (shm_) return shm_->barrier(tag);
        if (two_level_) return collectives::twoLevelBarrier(context, host_shm_.get(), *layout_);
        collectives::disseminationBarrier(context);
      });
}

void Communicator::abort(const std::string& reason) {
  checkUsable("abort");
  aborted_ = reason.empty() ? std::string("(no reason given)") : reason;
  const std::string message =
      "rank " + std::to_string(rank_) + ": the application aborted the communicator: " + aborted_;
  if (engine() != nullptr) engine()->abort(ErrorKind::kGeneric, message);
  transport_->abort(makeError(ErrorKind::kGeneric, message), true);
}

}  // namespace railshard
