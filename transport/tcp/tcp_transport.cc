#include "transport/tcp/tcp_transport.h"

#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <optional>
#include <sstream>

#include "base/error.h"
#include "base/logging.h"
#include "base/trace.h"
#include "transport/tcp/tcp_transport_internal.h"

namespace railshard::transport::tcp {

TcpTransport::TcpTransport(Options options) : options_(std::move(options)) {}

std::unique_ptr<TcpTransport> TcpTransport::create(Store& store, Options options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    throw InvalidArgument("tcp transport: rank " + std::to_string(options.rank) +
                          " outside world of size " + std::to_string(options.size));
  }
  if (options.sockets_per_rail < 1) {
    throw InvalidArgument("tcp transport: sockets_per_rail must be >= 1");
  }
  std::unique_ptr<TcpTransport> transport(new TcpTransport(std::move(options)));
  transport->peers_.resize(static_cast<size_t>(transport->options_.size));
  transport->epoll_fd_ = Fd(::epoll_create1(EPOLL_CLOEXEC));
  transport->wake_fd_ = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!transport->epoll_fd_.valid() || !transport->wake_fd_.valid()) {
    throw Error("tcp transport: epoll/eventfd: " + errnoText(errno));
  }
  if (transport->options_.size > 1) transport->connectMesh(store);
  epoll_event wake_event{};
  wake_event.events = EPOLLIN;
  wake_event.data.u64 = detail::kWakeToken;
  ::epoll_ctl(transport->epoll_fd_.get(), EPOLL_CTL_ADD, transport->wake_fd_.get(), &wake_event);
  for (auto& peer : transport->peers_) {
    if (!peer) continue;
    for (auto& channel : peer->channels) transport->registerChannel(*peer, *channel);
  }
  transport->progress_ = std::thread([t = transport.get()] { t->progressLoop(); });
  if (transport->multi_rail_) {
    transport->keeper_ = std::thread([t = transport.get()] { t->keeperLoop(); });
  }
  return transport;
}

void TcpTransport::registerChannel(Peer& peer, Channel& channel) {
  setNonBlocking(channel.fd.get(), true);
  channel.sndbuf = 0;
  if (peer.multi()) sizeSendBufferLocked(peer, channel);
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = detail::channelToken(peer.rank, channel.index);
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, channel.fd.get(), &event);
}

TcpTransport::~TcpTransport() {
  closing_.store(true);
  if (keeper_.joinable()) keeper_.join();  // it watches closing_
  if (progress_.joinable()) {
    if (!failed_.load()) sendByes();
    // Let queued frames (goodbyes, or abort messages after a failure) go out, then half-close
    // and wait for every peer to close too, bounded: closing a socket with unread data would
    // reset the connection and could destroy what the peer has not read yet.
    const Deadline until = deadlineAfter(detail::kLinger);
    auto allDone = [&](auto predicate) {
      for (auto& peer : peers_) {
        if (!peer) continue;
        std::lock_guard<std::mutex> lock(peer->mutex);
        for (auto& channel : peer->channels) {
          if (!predicate(*channel)) return false;
        }
      }
      return true;
    };
    while (Clock::now() < until && !allDone([](Channel& c) { return c.lost || c.sends.empty(); })) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (auto& peer : peers_) {
      if (!peer) continue;
      std::lock_guard<std::mutex> lock(peer->mutex);
      for (auto& channel : peer->channels) {
        if (channel->fd.valid()) ::shutdown(channel->fd.get(), SHUT_WR);
      }
    }
    while (Clock::now() < until &&
           !allDone([](Channel& c) { return c.lost || c.read_closed || c.bye_received; })) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    stopping_.store(true);
    wake();
    progress_.join();
  }
}

void TcpTransport::sendByes() {
  for (auto& peer : peers_) {
    if (!peer) continue;
    std::lock_guard<std::mutex> lock(peer->mutex);
    if (peer->lost) continue;
    // On every connection, after its data: the peer learns from the first one to arrive how
    // many messages were sent, and each connection can then be closed without a reset.
    for (auto& channel : peer->channels) {
      if (channel->lost) continue;
      auto bye = std::make_shared<Segment>();
      bye->header.kind = static_cast<uint8_t>(FrameKind::kBye);
      bye->header.message = peer->book.sent();
      queueSegmentLocked(*peer, *channel, bye);
    }
  }
}

void TcpTransport::pauseProgressForTesting(bool paused) {
  progress_paused_for_testing_.store(paused);
  wake();
  while (paused && !progress_parked_for_testing_.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void TcpTransport::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
}

std::string TcpTransport::describe(const MessageTag& tag) const {
  if (options_.formatter.describe) return options_.formatter.describe(tag);
  return "message #" + std::to_string(tag.sequence) + " step " + std::to_string(tag.step);
}

std::string TcpTransport::peerName(int peer) const {
  const auto& p = peers_[static_cast<size_t>(peer)];
  return "rank " + std::to_string(peer) + (p ? " (" + p->address + ")" : "");
}

void TcpTransport::checkHealthy() const {
  if (failed_.load()) rethrowAfterQuiesce();
}

void TcpTransport::rethrowAfterQuiesce() const {
  // The progress thread may be in the middle of a recv() into a buffer of the failed
  // collective; the caller frees that buffer as soon as we throw.
  const Deadline until = deadlineAfter(std::chrono::seconds(5));
  while (!reader_quiesced_.load() && progress_.joinable() && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  std::lock_guard<std::mutex> lock(state_mutex_);
  std::rethrow_exception(error_);
}

RequestPtr TcpTransport::isend(int peer_rank, const void* data, size_t bytes,
                               const MessageTag& tag) {
  checkHealthy();
  if (peer_rank < 0 || peer_rank >= options_.size || peer_rank == options_.rank) {
    throw InvalidArgument("isend: bad peer rank " + std::to_string(peer_rank));
  }
  std::shared_ptr<SendOp> op = post(peer_rank, FrameKind::kData, std::nullopt,
                                    messaging::PieceInfo{0, tag, bytes, 0, bytes}, data);
  if (!op) rethrowAfterQuiesce();
  return op;
}

std::shared_ptr<TcpTransport::SendOp> TcpTransport::post(int peer_rank, FrameKind kind,
                                                         std::optional<uint64_t> message,
                                                         const messaging::PieceInfo& what,
                                                         const void* data) {
  Peer& peer = *peers_[static_cast<size_t>(peer_rank)];
  auto op = std::make_shared<SendOp>(peer_rank, what.length, what.tag);
  std::string lost_reason;
  {
    std::lock_guard<std::mutex> lock(peer.mutex);
    if (peer.lost || peer.bye_received) {
      lost_reason = peer.lost ? "the connection is gone" : "it closed its communicator";
    } else {
      const uint64_t number = message ? *message : peer.book.numberSend();
      auto piece = [&](size_t offset, size_t length) {
        auto segment = std::make_shared<Segment>();
        segment->header.kind = static_cast<uint8_t>(kind);
        if (kind == FrameKind::kPiece && what.resend) segment->header.error_kind = kPieceResent;
        segment->header.payload_bytes = length;
        segment->header.message = number;
        segment->header.offset = what.offset + offset;
        segment->header.total_bytes = what.total;
        segment->header.tag = what.tag;
        segment->data = static_cast<const uint8_t*>(data) + offset;
        segment->parent = op;
        segment->retained = peer.multi();
        return segment;
      };
      if (!peer.multi()) {
        op->outstanding = 1;
        op->unwritten = 1;
        queueSegmentLocked(peer, *peer.channels[0], piece(0, what.length));
      } else {
        std::vector<rails::Piece> pieces = peer.scheduler->split(what.length);
        op->outstanding = static_cast<int>(pieces.size());
        op->unwritten = op->outstanding;
        for (const auto& p : pieces) {
          queueSegmentLocked(peer, *peer.channels[static_cast<size_t>(p.rail)],
                             piece(p.offset, p.length));
        }
      }
      if (kind == FrameKind::kPiece) peer.piece_bytes_sent += what.length;
    }
  }
  if (!lost_reason.empty()) {
    fail(makeError(ErrorKind::kPeerLost, "rank " + std::to_string(options_.rank) +
                                             ": cannot send " + describe(what.tag) + " to " +
                                             peerName(peer_rank) + ": " + lost_reason),
         true);
    return nullptr;
  }
  return op;
}

RequestPtr TcpTransport::irecv(int peer_rank, void* data, size_t bytes, const MessageTag& tag) {
  checkHealthy();
  if (peer_rank < 0 || peer_rank >= options_.size || peer_rank == options_.rank) {
    throw InvalidArgument("irecv: bad peer rank " + std::to_string(peer_rank));
  }
  Peer& peer = *peers_[static_cast<size_t>(peer_rank)];
  auto op = std::make_shared<Request>(Request::Kind::kRecv, peer_rank, bytes, tag);
  std::optional<std::string> problem;
  ErrorKind kind = ErrorKind::kMismatch;
  {
    std::lock_guard<std::mutex> lock(peer.mutex);
    if (!peer.book.nextArrived() &&
        (peer.lost || (peer.bye_received && peer.book.received() >= peer.bye_messages))) {
      kind = ErrorKind::kPeerLost;
      problem = "rank " + std::to_string(options_.rank) + ": cannot receive " + describe(tag) +
                " from " + peerName(peer_rank) + ": " +
                (peer.lost ? "the connection is gone" : "it closed its communicator");
    } else {
      messaging::MessageBook::Posted posted = peer.book.post(op, data, bytes, tag);
      if (posted.problem) {
        kind = posted.problem->kind;
        problem = std::move(posted.problem->text);
      } else if (posted.complete) {
        // It had arrived whole before this receive.
        if (bytes > 0) std::memcpy(data, posted.complete->staged.data(), bytes);
        if (trace::enabled()) traceTransfer(*op, trace_rank_.load(std::memory_order_relaxed));
        op->markDone();
      }
    }
  }
  if (problem) {
    fail(makeError(kind, *problem), true);
    rethrowAfterQuiesce();
  }
  return op;
}

void TcpTransport::wait(const RequestPtr& request, Deadline deadline) {
  // Poll before sleeping: a condition-variable wake-up costs a futex round trip, and on a VM
  // an idle CPU can take hundreds of microseconds to wake. First a few microseconds of
  // `pause`, then yielding (the progress thread that completes the request may need this
  // core), then sleep.
  if (request->done()) return;
  if (multi_rail_ && request->kind() == Request::Kind::kSend) {
    Peer& peer = *peers_[static_cast<size_t>(request->peer())];
    if (peer.multi()) {
      auto& op = static_cast<SendOp&>(*request);
      std::lock_guard<std::mutex> lock(peer.mutex);
      op.waited = true;
      if (op.unwritten == 0 && !op.done()) releaseByCopyLocked(peer, op);
    }
  }
  const Clock::time_point spin_start = Clock::now();
  for (uint32_t i = 1;; ++i) {
    if (request->done()) return;
    if (failed_.load()) break;
    if ((i & 63u) == 0) {
      const auto spent = Clock::now() - spin_start;
      if (spent >= options_.spin) break;
      if (spent >= std::chrono::microseconds(20)) {
        sched_yield();
        continue;
      }
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  {
    waiters_.fetch_add(1);
    std::unique_lock<std::mutex> lock(state_mutex_);
    state_changed_.wait_until(lock, deadline, [&] { return request->done() || failed_.load(); });
    waiters_.fetch_sub(1);
    if (request->done()) return;
  }
  if (failed_.load()) rethrowAfterQuiesce();
  std::ostringstream message;
  const bool is_send = request->kind() == Request::Kind::kSend;
  message << "rank " << options_.rank << ": " << describe(request->tag()) << " timed out waiting "
          << (is_send ? "to send to " : "to receive from ") << peerName(request->peer())
          << " (RAILSHARD_TIMEOUT)";
  if (timeout_explainer_) message << ": " << timeout_explainer_(request->tag());
  // Raises whichever failure came first: this timeout, or one another thread (a peer's abort,
  // a lost connection) was publishing meanwhile. Never returns: the request is not done.
  fail(makeError(ErrorKind::kTimeout, message.str()), true);
  rethrowAfterQuiesce();
}

void TcpTransport::enterCollective(const MessageTag& tag) {
  checkHealthy();
  current_.enter(tag);
  // What arrived before this rank got here.
  std::optional<std::string> problem;
  for (auto& peer : peers_) {
    if (!peer || problem) continue;
    std::lock_guard<std::mutex> lock(peer->mutex);
    problem = peer->book.checkStaged(
        [&](const MessageTag& theirs) { return current_.unsolicited(peer->rank, theirs); });
  }
  if (problem) {
    fail(makeError(ErrorKind::kMismatch, *problem), true);
    rethrowAfterQuiesce();
  }
}

void TcpTransport::abort(std::exception_ptr error, bool tell_peers) {
  fail(error, tell_peers);
}

void TcpTransport::setWriteInterest(Channel& channel, bool on) {
  if (channel.write_interest == on || channel.lost || !channel.fd.valid()) return;
  channel.write_interest = on;
  epoll_event event{};
  event.events = EPOLLIN | (on ? EPOLLOUT : 0u);
  event.data.u64 = detail::channelToken(channel.peer, channel.index);
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, channel.fd.get(), &event);
}

void TcpTransport::sizeSendBufferLocked(Peer& peer, Channel& channel) {
  // Over several rails, bytes in a socket's kernel buffer are committed to that rail: with
  // Linux's autotuned buffers (up to 4 MB) a slow rail holds tens of milliseconds of data, so
  // the rails of a striped message finish far apart and acks queue behind that backlog. A
  // buffer of about kRailBufferSeconds of the rail's rate keeps it busy and the finish
  // times together (measured on the test bed: docs/multirail.md).
  const double bytes_per_second = peer.scheduler->gbps(channel.index) * 1e9 / 8;
  const int wanted =
      static_cast<int>(std::clamp(bytes_per_second * detail::kRailBufferSeconds,
                                  double(detail::kMinRailBuffer), double(detail::kMaxRailBuffer)));
  if (channel.sndbuf > 0 && std::abs(wanted - channel.sndbuf) * 4 < channel.sndbuf) return;
  if (::setsockopt(channel.fd.get(), SOL_SOCKET, SO_SNDBUF, &wanted, sizeof(wanted)) == 0) {
    channel.sndbuf = wanted;
  }
}

void TcpTransport::markBusyLocked(Channel& channel) {
  if (channel.busy) return;
  channel.busy = true;
  channel.sample_open = false;
  channel.last_progress = Clock::now();
}

void TcpTransport::queueSegmentLocked(Peer& peer, Channel& channel,
                                      std::shared_ptr<Segment> segment) {
  const bool was_empty = channel.sends.empty();
  if (isDataFrame(segment->header)) {
    channel.payload_sent += segment->header.payload_bytes;
    markBusyLocked(channel);
  }
  channel.sends.push_back(std::move(segment));
  // Nothing queued ahead: write from this thread now, which saves the progress thread's
  // wake-up on every small message.
  if (was_empty) flushSendsLocked(peer, channel);
  if (!channel.sends.empty()) setWriteInterest(channel, true);
}

void TcpTransport::queueControlLocked(Peer& peer, Channel& channel, FrameKind kind,
                                      uint64_t message, uint64_t offset, uint64_t extra) {
  if (channel.lost) return;
  auto control = std::make_shared<Segment>();
  control->header.kind = static_cast<uint8_t>(kind);
  control->header.message = message;
  control->header.offset = offset;
  control->header.total_bytes = extra;
  // When it was queued, on this rank's clock: acks carry it so that the peer can time a
  // rail by the receiving side's clock, free of the ack's own delay on the way back.
  control->header.tag.sequence = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
          .count());
  // Ahead of queued data (only after a frame already half on the wire): acks and failover
  // reports must not wait behind megabytes of pieces.
  auto at = channel.sends.begin();
  if (at != channel.sends.end() && (*at)->written > 0) ++at;
  const bool was_empty = channel.sends.empty();
  channel.sends.insert(at, std::move(control));
  if (was_empty || channel.sends.front()->written == 0) flushSendsLocked(peer, channel);
  if (!channel.sends.empty()) setWriteInterest(channel, true);
}

void TcpTransport::flushSendsLocked(Peer& peer, Channel& channel) {
  // Written out, then (several rails) take over part of a slower rail's backlog, and again.
  do {
    if (!writeQueuedLocked(peer, channel)) return;
  } while (peer.multi() && channel.up && options_.rail_weights == RailWeights::kAdaptive &&
           !failed_.load() && stealForLocked(peer, channel));
}

bool TcpTransport::writeQueuedLocked(Peer& peer, Channel& channel) {
  while (!channel.sends.empty() && !channel.lost && channel.fd.valid()) {
    Segment& segment = *channel.sends.front();
    const size_t total = sizeof(FrameHeader) + segment.header.payload_bytes;
    if (segment.written == 0) {
      segment.stream_begin = channel.stream_written;
      if (trace::enabled()) segment.trace_begin_ns = trace::now();
    }
    iovec iov[2];
    int iov_count = 0;
    if (segment.written < sizeof(FrameHeader)) {
      iov[iov_count++] = {reinterpret_cast<uint8_t*>(&segment.header) + segment.written,
                          sizeof(FrameHeader) - segment.written};
      if (segment.header.payload_bytes > 0) {
        iov[iov_count++] = {const_cast<uint8_t*>(segment.data), segment.header.payload_bytes};
      }
    } else {
      const size_t offset = segment.written - sizeof(FrameHeader);
      iov[iov_count++] = {const_cast<uint8_t*>(segment.data) + offset,
                          segment.header.payload_bytes - offset};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(iov_count);
    const ssize_t n = ::sendmsg(channel.fd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      // The progress thread reports the broken connection with context (or, with other rails
      // left, takes this one out); mark it so no one waits for this frame.
      channel.lost = true;
      channel.down_reason = "send failed: " + errnoText(errno);
      RS_LOG_DEBUG("rank {}: send to rank {} on {} failed: {}", options_.rank, peer.rank,
                   channel.name, errnoText(errno));
      wake();
      return false;
    }
    bytes_sent_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    channel.stream_written += static_cast<uint64_t>(n);
    segment.written += static_cast<size_t>(n);
    if (segment.written < total) return false;  // socket buffer full
    auto done = std::move(channel.sends.front());
    channel.sends.pop_front();
    onSegmentWrittenLocked(peer, channel, std::move(done));
  }
  return channel.sends.empty() && !channel.lost && channel.fd.valid();
}

void TcpTransport::onSegmentWrittenLocked(Peer& peer, Channel& channel,
                                          std::shared_ptr<Segment> segment) {
  if (!isDataFrame(segment->header)) return;
  if (segment->trace_begin_ns != 0) traceRailLocked(peer, channel, *segment);
  std::shared_ptr<SendOp> parent = segment->parent;
  if (parent) --parent->unwritten;
  if (!segment->retained || channel.acked >= segment->streamEnd()) {
    releaseLocked(*segment);
    return;
  }
  // Kept until the peer acknowledges it, so that it can be re-sent if this rail fails. A
  // small piece is copied so that its send completes now rather than an ack later.
  if (parent && segment->header.payload_bytes <= detail::kCopyPieceBytes) {
    segment->own();
    releaseLocked(*segment);
  }
  channel.unacked.push_back(std::move(segment));
  if (parent && parent->waited && parent->unwritten == 0) releaseByCopyLocked(peer, *parent);
}

void TcpTransport::releaseByCopyLocked(Peer& peer, const SendOp& op) {
  // The caller blocks on a send that is all on the wire: rather than wait for the peer's ack
  // (which queues behind the peer's own data in its socket), keep a copy of what is not
  // acknowledged yet and complete now. Bounded by what the sockets hold, not by the message.
  for (auto& channel : peer.channels) {
    for (auto& segment : channel->unacked) {
      if (segment->parent.get() != &op) continue;
      segment->own();
      releaseLocked(*segment);
    }
  }
}

void TcpTransport::releaseLocked(Segment& segment) {
  if (!segment.parent) return;
  std::shared_ptr<SendOp> parent = std::move(segment.parent);
  if (--parent->outstanding == 0) completeRequest(*parent);
}

void TcpTransport::completeRequest(Request& request) {
  if (trace::enabled()) traceTransfer(request, trace_rank_.load(std::memory_order_relaxed));
  request.markDone();
  if (waiters_.load() > 0) {
    { std::lock_guard<std::mutex> lock(state_mutex_); }
    state_changed_.notify_all();
  }
}

void TcpTransport::progressLoop() {
  epoll_event events[64];
  // With several rails the loop also watches for stalled rails and adopts reconnected ones.
  const int tick_ms =
      multi_rail_ ? static_cast<int>(std::clamp<long long>(
                        std::chrono::duration_cast<std::chrono::milliseconds>(options_.rail_timeout)
                                .count() /
                            8,
                        5, 100))
                  : 1000;
  const int heartbeat_tick_ms =
      options_.heartbeat_timeout > Duration::zero()
          ? static_cast<int>(std::clamp<long long>(
                std::chrono::duration_cast<std::chrono::milliseconds>(options_.heartbeat_timeout)
                        .count() /
                    10,
                10, 1000))
          : tick_ms;
  const int tick = std::min(tick_ms, heartbeat_tick_ms);
  while (!stopping_.load()) {
    if (progress_paused_for_testing_.load()) {
      progress_parked_for_testing_.store(true);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    progress_parked_for_testing_.store(false);
    if (failed_.load()) reader_quiesced_.store(true);
    const int n = ::epoll_wait(epoll_fd_.get(), events, 64, tick);
    if (n < 0 && errno != EINTR) {
      fail(makeError(ErrorKind::kGeneric, "tcp progress: epoll_wait: " + errnoText(errno)), true);
      return;
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t token = events[i].data.u64;
      if (token == detail::kWakeToken) {
        uint64_t value;
        [[maybe_unused]] ssize_t r = ::read(wake_fd_.get(), &value, sizeof(value));
        continue;
      }
      Peer& peer = *peers_[token >> 16];
      Channel& channel = *peer.channels[token & 0xffff];
      if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) handleReadable(peer, channel);
      if (events[i].events & EPOLLOUT) handleWritable(peer, channel);
    }
    // A send that failed inside flushSendsLocked (possibly on another thread) marked the
    // connection lost; make sure that is reported even if the socket never becomes readable.
    for (auto& peer : peers_) {
      if (!peer) continue;
      for (auto& channel : peer->channels) {
        bool lost;
        std::string reason;
        {
          std::lock_guard<std::mutex> lock(peer->mutex);
          lost = channel->lost && channel->fd.valid();
          reason = channel->down_reason;
        }
        if (!lost) continue;
        if (!failed_.load() && !otherRailUp(*peer, *channel)) {
          // The peer reset the connection, but what it sent before may still wait in the
          // receive queue: above all an abort frame saying why it left (a rank that raised
          // MismatchError and exited). Read that first, or every such peer would be reported
          // as lost instead (seen as a rare PeerLostError in the mismatch tests).
          handleReadable(*peer, *channel, true);
        }
        bool still_open;
        {
          std::lock_guard<std::mutex> lock(peer->mutex);
          still_open = channel->fd.valid();
        }
        if (still_open) onConnectionLost(*peer, *channel, reason.empty() ? "send failed" : reason);
      }
    }
    if (multi_rail_ && !failed_.load()) {
      installRejoined();
      checkStalls();
    }
    if (options_.heartbeat_timeout > Duration::zero() && !failed_.load() && !closing_.load()) {
      checkHeartbeats();
    }
  }
}

void TcpTransport::handleWritable(Peer& peer, Channel& channel) {
  std::lock_guard<std::mutex> lock(peer.mutex);
  flushSendsLocked(peer, channel);
  if (channel.sends.empty()) setWriteInterest(channel, false);
}

}  // namespace railshard::transport::tcp
