#include "core/communicator.h"

#include <limits>
#include <string>

#include "core/base/error.h"
#include "core/base/logging.h"
#include "core/collective_tag.h"
#include "core/collectives/algorithms.h"
#include "core/collectives/context.h"
#include "transport/tcp/tcp_transport.h"

namespace railshard {

std::unique_ptr<Communicator> Communicator::create(Store& store, const Options& options) {
  if (options.size < 1) {
    throw InvalidArgument("Communicator: world size must be >= 1, got " +
                          std::to_string(options.size));
  }
  if (options.rank < 0 || options.rank >= options.size) {
    throw InvalidArgument("Communicator: rank " + std::to_string(options.rank) +
                          " is outside [0, " + std::to_string(options.size) + ")");
  }
  RS_LOG_DEBUG("rank {}/{}: config: {}", options.rank, options.size, options.config.describe());
  transport::tcp::TcpTransport::Options tcp;
  tcp.rank = options.rank;
  tcp.size = options.size;
  tcp.token = options.config.token;
  tcp.advertise_host = options.advertise_host;
  tcp.key_prefix = options.key_prefix;
  tcp.connect_timeout = options.config.connect_timeout;
  tcp.formatter = tagFormatter();
  auto transport = transport::tcp::TcpTransport::create(store, std::move(tcp));
  return std::unique_ptr<Communicator>(new Communicator(options, std::move(transport)));
}

Communicator::Communicator(const Options& options, std::unique_ptr<transport::Transport> transport)
    : rank_(options.rank),
      size_(options.size),
      config_(options.config),
      transport_(std::move(transport)),
      workspace_(std::make_unique<collectives::Workspace>()) {}

Communicator::~Communicator() = default;

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

namespace {

collectives::Context makeContext(transport::Transport& transport, int rank, int size,
                                 const Config& config, collectives::Workspace& workspace,
                                 const transport::MessageTag& tag) {
  return collectives::Context{transport,
                              rank,
                              size,
                              config.chunk_bytes,
                              std::chrono::duration_cast<Duration>(config.timeout),
                              tag,
                              workspace};
}

}  // namespace

void Communicator::allreduce(const void* send, void* recv, size_t count, DataType dtype,
                             ReduceOp op) {
  checkTypes("allreduce", dtype, op);
  checkBuffer("allreduce", "send", send, count, dtype);
  checkBuffer("allreduce", "recv", recv, count, dtype);
  transport_->checkHealthy();
  const auto tag = makeTag(CollectiveKind::kAllreduce, sequence_++, dtype, op, count, 0);
  RS_LOG_TRACE("rank {}: {} via ring", rank_, describeTag(tag));
  collectives::ringAllreduce(makeContext(*transport_, rank_, size_, config_, *workspace_, tag),
                             send, recv, count, dtype, op);
}

void Communicator::reduceScatter(const void* send, void* recv, size_t recv_count, DataType dtype,
                                 ReduceOp op) {
  checkTypes("reduce_scatter", dtype, op);
  checkBuffer("reduce_scatter", "send", send, recv_count * static_cast<size_t>(size_), dtype);
  checkBuffer("reduce_scatter", "recv", recv, recv_count, dtype);
  transport_->checkHealthy();
  const auto tag = makeTag(CollectiveKind::kReduceScatter, sequence_++, dtype, op, recv_count, 0);
  collectives::ringReduceScatter(
      makeContext(*transport_, rank_, size_, config_, *workspace_, tag), send, recv, recv_count,
      dtype, op);
}

void Communicator::allgather(const void* send, void* recv, size_t send_count, DataType dtype) {
  checkTypes("allgather", dtype, ReduceOp::kSum);
  checkBuffer("allgather", "send", send, send_count, dtype);
  checkBuffer("allgather", "recv", recv, send_count * static_cast<size_t>(size_), dtype);
  transport_->checkHealthy();
  const auto tag = makeTag(CollectiveKind::kAllgather, sequence_++, dtype, ReduceOp::kSum,
                           send_count, 0);
  collectives::ringAllgather(makeContext(*transport_, rank_, size_, config_, *workspace_, tag),
                             send, recv, send_count, dtype);
}

void Communicator::broadcast(const void* send, void* recv, size_t count, DataType dtype,
                             int root) {
  checkTypes("broadcast", dtype, ReduceOp::kSum);
  if (root < 0 || root >= size_) {
    throw InvalidArgument("broadcast: root " + std::to_string(root) + " is outside [0, " +
                          std::to_string(size_) + ")");
  }
  if (rank_ == root) checkBuffer("broadcast", "send", send, count, dtype);
  checkBuffer("broadcast", "recv", recv, count, dtype);
  transport_->checkHealthy();
  const auto tag = makeTag(CollectiveKind::kBroadcast, sequence_++, dtype, ReduceOp::kSum, count,
                           static_cast<uint32_t>(root));
  collectives::chainBroadcast(makeContext(*transport_, rank_, size_, config_, *workspace_, tag),
                              send, recv, count, dtype, root);
}

void Communicator::barrier() {
  transport_->checkHealthy();
  const auto tag =
      makeTag(CollectiveKind::kBarrier, sequence_++, DataType::kUInt8, ReduceOp::kSum, 0, 0);
  collectives::disseminationBarrier(
      makeContext(*transport_, rank_, size_, config_, *workspace_, tag));
}

}  // namespace railshard
