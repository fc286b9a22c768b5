#include "transport/tcp/tcp_transport.h"

#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <sstream>

#include "core/base/error.h"
#include "core/base/logging.h"
#include "transport/tcp/tcp_transport_internal.h"

namespace railshard::transport::tcp {

TcpTransport::TcpTransport(Options options) : options_(std::move(options)) {}

std::unique_ptr<TcpTransport> TcpTransport::create(Store& store, Options options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    throw InvalidArgument("tcp transport: rank " + std::to_string(options.rank) +
                          " outside world of size " + std::to_string(options.size));
  }
  std::unique_ptr<TcpTransport> transport(new TcpTransport(std::move(options)));
  transport->peers_.resize(static_cast<size_t>(transport->options_.size));
  if (transport->options_.size > 1) transport->connectMesh(store);
  transport->epoll_fd_ = Fd(::epoll_create1(EPOLL_CLOEXEC));
  transport->wake_fd_ = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!transport->epoll_fd_.valid() || !transport->wake_fd_.valid()) {
    throw Error("tcp transport: epoll/eventfd: " + errnoText(errno));
  }
  epoll_event wake_event{};
  wake_event.events = EPOLLIN;
  wake_event.data.u64 = detail::kWakeToken;
  ::epoll_ctl(transport->epoll_fd_.get(), EPOLL_CTL_ADD, transport->wake_fd_.get(), &wake_event);
  for (auto& peer : transport->peers_) {
    if (!peer) continue;
    setNonBlocking(peer->fd.get(), true);
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = static_cast<uint64_t>(peer->rank);
    ::epoll_ctl(transport->epoll_fd_.get(), EPOLL_CTL_ADD, peer->fd.get(), &event);
  }
  transport->progress_ = std::thread([t = transport.get()] { t->progressLoop(); });
  return transport;
}

TcpTransport::~TcpTransport() {
  closing_.store(true);
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
        if (!predicate(*peer)) return false;
      }
      return true;
    };
    while (Clock::now() < until && !allDone([](Peer& p) { return p.lost || p.sends.empty(); })) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (auto& peer : peers_) {
      if (!peer) continue;
      std::lock_guard<std::mutex> lock(peer->mutex);
      if (peer->fd.valid()) ::shutdown(peer->fd.get(), SHUT_WR);
    }
    while (Clock::now() < until &&
           !allDone([](Peer& p) { return p.lost || p.read_closed || p.bye_received; })) {
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
    auto bye = std::make_shared<SendOp>(peer->rank, nullptr, 0, MessageTag{}, true);
    bye->header.kind = static_cast<uint8_t>(FrameKind::kBye);
    peer->sends.push_back(bye);
    flushSendsLocked(*peer);
    if (!peer->sends.empty()) setWriteInterest(*peer, true);
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
  Peer& peer = *peers_[static_cast<size_t>(peer_rank)];
  auto op = std::make_shared<SendOp>(peer_rank, data, bytes, tag, false);
  std::string lost_reason;
  {
    std::lock_guard<std::mutex> lock(peer.mutex);
    if (peer.lost || peer.bye_received) {
      lost_reason = peer.lost ? "the connection is gone" : "it closed its communicator";
    } else {
      peer.sends.push_back(op);
      if (peer.sends.size() == 1) {
        // Nothing queued ahead: write from this thread now, which saves the progress thread's
        // wake-up on every small message.
        flushSendsLocked(peer);
      }
      if (!peer.sends.empty()) setWriteInterest(peer, true);
    }
  }
  if (!lost_reason.empty()) {
    fail(makeError(ErrorKind::kPeerLost, "rank " + std::to_string(options_.rank) +
                                             ": cannot send " + describe(tag) + " to " +
                                             peerName(peer_rank) + ": " + lost_reason),
         true);
    checkHealthy();
  }
  return op;
}

RequestPtr TcpTransport::irecv(int peer_rank, void* data, size_t bytes, const MessageTag& tag) {
  checkHealthy();
  if (peer_rank < 0 || peer_rank >= options_.size || peer_rank == options_.rank) {
    throw InvalidArgument("irecv: bad peer rank " + std::to_string(peer_rank));
  }
  Peer& peer = *peers_[static_cast<size_t>(peer_rank)];
  auto op = std::make_shared<RecvOp>(peer_rank, data, bytes, tag);
  std::optional<std::string> problem;
  ErrorKind kind = ErrorKind::kMismatch;
  {
    std::lock_guard<std::mutex> lock(peer.mutex);
    if (!peer.staged.empty()) {
      auto staged = peer.staged.front();
      if (!(staged->header.tag == tag) || staged->header.payload_bytes != bytes) {
        problem =
            options_.formatter.mismatch
                ? options_.formatter.mismatch(options_.rank, tag, peer_rank, staged->header.tag)
                : "tag mismatch";
        if (staged->header.tag == tag) {
          problem = "rank " + std::to_string(options_.rank) + " expected " + std::to_string(bytes) +
                    " bytes for " + describe(tag) + " but rank " + std::to_string(peer_rank) +
                    " sent " + std::to_string(staged->header.payload_bytes) +
                    " (do all ranks use the same RAILSHARD_CHUNK_BYTES?)";
        }
      } else {
        peer.staged.pop_front();
        if (staged->complete) {
          if (bytes > 0) std::memcpy(data, staged->bytes.data(), bytes);
          op->markDone();
        } else {
          staged->claimer = op;
        }
      }
    } else if (peer.lost || peer.bye_received) {
      kind = ErrorKind::kPeerLost;
      problem = "rank " + std::to_string(options_.rank) + ": cannot receive " + describe(tag) +
                " from " + peerName(peer_rank) + ": " +
                (peer.lost ? "the connection is gone" : "it closed its communicator");
    } else {
      peer.recvs.push_back(op);
    }
  }
  if (problem) {
    fail(makeError(kind, *problem), true);
    checkHealthy();
  }
  return op;
}

void TcpTransport::wait(const RequestPtr& request, Deadline deadline) {
  // Poll before sleeping: a condition-variable wake-up costs a futex round trip, and on a VM
  // an idle CPU can take hundreds of microseconds to wake. First a few microseconds of
  // `pause`, then yielding (the progress thread that completes the request may need this
  // core), then sleep.
  if (request->done()) return;
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
  fail(makeError(ErrorKind::kTimeout, message.str()), true);
  checkHealthy();
}

void TcpTransport::abort(std::exception_ptr error, bool tell_peers) {
  fail(error, tell_peers);
}

void TcpTransport::setWriteInterest(Peer& peer, bool on) {
  if (peer.write_interest == on || peer.lost) return;
  peer.write_interest = on;
  epoll_event event{};
  event.events = EPOLLIN | (on ? EPOLLOUT : 0u);
  event.data.u64 = static_cast<uint64_t>(peer.rank);
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, peer.fd.get(), &event);
}

void TcpTransport::flushSendsLocked(Peer& peer) {
  while (!peer.sends.empty() && !peer.lost) {
    SendOp& op = *peer.sends.front();
    const size_t total = sizeof(FrameHeader) + op.header.payload_bytes;
    iovec iov[2];
    int iov_count = 0;
    if (op.written < sizeof(FrameHeader)) {
      iov[iov_count++] = {reinterpret_cast<uint8_t*>(&op.header) + op.written,
                          sizeof(FrameHeader) - op.written};
      if (op.header.payload_bytes > 0) {
        iov[iov_count++] = {const_cast<uint8_t*>(op.data), op.header.payload_bytes};
      }
    } else {
      const size_t offset = op.written - sizeof(FrameHeader);
      iov[iov_count++] = {const_cast<uint8_t*>(op.data) + offset, op.header.payload_bytes - offset};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(iov_count);
    const ssize_t n = ::sendmsg(peer.fd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // The reader side notices the broken connection too and reports it with context;
      // mark it so no one waits for this frame.
      peer.lost = true;
      RS_LOG_DEBUG("rank {}: send to rank {} failed: {}", options_.rank, peer.rank,
                   errnoText(errno));
      wake();
      return;
    }
    bytes_sent_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    op.written += static_cast<size_t>(n);
    if (op.written < total) return;  // socket buffer full
    auto done = peer.sends.front();
    peer.sends.pop_front();
    if (!done->internal) completeRequest(*done);
  }
}

void TcpTransport::completeRequest(Request& request) {
  request.markDone();
  if (waiters_.load() > 0) {
    { std::lock_guard<std::mutex> lock(state_mutex_); }
    state_changed_.notify_all();
  }
}

void TcpTransport::progressLoop() {
  epoll_event events[64];
  while (!stopping_.load()) {
    if (failed_.load()) reader_quiesced_.store(true);
    const int n = ::epoll_wait(epoll_fd_.get(), events, 64, 1000);
    if (n < 0 && errno != EINTR) {
      fail(makeError(ErrorKind::kGeneric, "tcp progress: epoll_wait: " + errnoText(errno)), true);
      return;
    }
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == detail::kWakeToken) {
        uint64_t value;
        [[maybe_unused]] ssize_t r = ::read(wake_fd_.get(), &value, sizeof(value));
        continue;
      }
      Peer& peer = *peers_[events[i].data.u64];
      if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) handleReadable(peer);
      if (events[i].events & EPOLLOUT) handleWritable(peer);
    }
    // A send that failed inside flushSendsLocked (possibly on another thread) marked the peer
    // lost; make sure that is reported even if the socket never becomes readable.
    for (auto& peer : peers_) {
      if (!peer) continue;
      bool lost;
      {
        std::lock_guard<std::mutex> lock(peer->mutex);
        lost = peer->lost && peer->fd.valid();
      }
      if (lost) onConnectionLost(*peer, "send failed: connection reset");
    }
  }
}

void TcpTransport::handleWritable(Peer& peer) {
  std::lock_guard<std::mutex> lock(peer.mutex);
  flushSendsLocked(peer);
  if (peer.sends.empty()) setWriteInterest(peer, false);
}

void TcpTransport::handleReadable(Peer& peer) {
  size_t budget = detail::kReadBudget;
  while (budget > 0 && peer.fd.valid()) {
    if (failed_.load()) {
      reader_quiesced_.store(true);
      drainAfterFailure(peer);
      return;
    }
    ssize_t n;
    if (!peer.in_payload) {
      n = ::recv(peer.fd.get(), reinterpret_cast<uint8_t*>(&peer.header) + peer.header_got,
                 sizeof(FrameHeader) - peer.header_got, MSG_DONTWAIT);
    } else {
      const size_t want = std::min<size_t>(peer.header.payload_bytes - peer.payload_got, budget);
      n = ::recv(peer.fd.get(), peer.target + peer.payload_got, want, MSG_DONTWAIT);
    }
    if (n == 0) {
      onConnectionLost(peer, "connection closed by the peer (process exited or crashed?)");
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      onConnectionLost(peer, "connection error: " + errnoText(errno));
      return;
    }
    bytes_received_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    budget -= std::min(budget, static_cast<size_t>(n));
    if (!peer.in_payload) {
      peer.header_got += static_cast<size_t>(n);
      if (peer.header_got == sizeof(FrameHeader)) onHeader(peer);
    } else {
      peer.payload_got += static_cast<size_t>(n);
      if (peer.payload_got == peer.header.payload_bytes) onPayloadComplete(peer);
    }
  }
}

void TcpTransport::onHeader(Peer& peer) {
  try {
    validateFrameHeader(peer.header);
  } catch (const ProtocolError& e) {
    fail(makeError(ErrorKind::kProtocol, "rank " + std::to_string(options_.rank) + ": " +
                                             peerName(peer.rank) +
                                             " broke the protocol: " + e.what()),
         true);
    return;
  }
  peer.header_got = 0;
  peer.payload_got = 0;
  peer.in_payload = true;
  switch (static_cast<FrameKind>(peer.header.kind)) {
    case FrameKind::kBye: {
      peer.in_payload = false;
      bool pending;
      {
        std::lock_guard<std::mutex> lock(peer.mutex);
        peer.bye_received = true;
        pending = !peer.recvs.empty();
      }
      if (pending && !stopping_.load()) {
        fail(makeError(ErrorKind::kPeerLost,
                       "rank " + std::to_string(options_.rank) + ": " + peerName(peer.rank) +
                           " closed its communicator while this rank still waited for data "
                           "from it"),
             true);
      }
      return;
    }
    case FrameKind::kAbort:
      peer.abort_text.assign(peer.header.payload_bytes, '\0');
      peer.target = reinterpret_cast<uint8_t*>(peer.abort_text.data());
      break;
    case FrameKind::kData: {
      std::optional<std::string> problem;
      {
        std::lock_guard<std::mutex> lock(peer.mutex);
        if (!peer.recvs.empty()) {
          auto op = peer.recvs.front();
          if (!(op->tag() == peer.header.tag)) {
            problem = options_.formatter.mismatch
                          ? options_.formatter.mismatch(options_.rank, op->tag(), peer.rank,
                                                        peer.header.tag)
                          : "tag mismatch";
          } else if (op->bytes() != peer.header.payload_bytes) {
            problem = "rank " + std::to_string(options_.rank) + " expected " +
                      std::to_string(op->bytes()) + " bytes for " + describe(op->tag()) +
                      " but rank " + std::to_string(peer.rank) + " sent " +
                      std::to_string(peer.header.payload_bytes) +
                      " (do all ranks use the same RAILSHARD_CHUNK_BYTES?)";
          } else {
            peer.recvs.pop_front();
            peer.target_op = op;
            peer.target = op->data;
          }
        } else if (peer.header.payload_bytes > detail::kMaxStagedBytes) {
          problem = "rank " + std::to_string(peer.rank) + " sent an unsolicited message of " +
                    std::to_string(peer.header.payload_bytes) + " bytes";
        } else {
          auto staged = std::make_shared<Staged>();
          staged->header = peer.header;
          staged->bytes.resize(peer.header.payload_bytes);
          peer.staged.push_back(staged);
          peer.target_staged = staged;
          peer.target = staged->bytes.data();
        }
      }
      if (problem) {
        // The payload has nowhere safe to go; after fail() the reader drops it.
        fail(makeError(ErrorKind::kMismatch, *problem), true);
        return;
      }
      break;
    }
  }
  if (peer.header.payload_bytes == 0) onPayloadComplete(peer);
}

void TcpTransport::onPayloadComplete(Peer& peer) {
  peer.in_payload = false;
  peer.header_got = 0;
  if (static_cast<FrameKind>(peer.header.kind) == FrameKind::kAbort) {
    // Forward it (tell_peers): a rank that fails only closes its connections after its own
    // abort frames, so every peer reads an abort before it sees that rank's connection end.
    const bool tagged = peer.abort_text.find("[reported by rank") != std::string::npos;
    fail(makeError(static_cast<ErrorKind>(peer.header.error_kind),
                   tagged
                       ? peer.abort_text
                       : peer.abort_text + " [reported by rank " + std::to_string(peer.rank) + "]"),
         true);
    return;
  }
  if (peer.target_op) {
    completeRequest(*peer.target_op);
    peer.target_op.reset();
  } else if (peer.target_staged) {
    std::shared_ptr<RecvOp> claimer;
    {
      std::lock_guard<std::mutex> lock(peer.mutex);
      peer.target_staged->complete = true;
      claimer = peer.target_staged->claimer;
      if (claimer && claimer->bytes() > 0) {
        std::memcpy(claimer->data, peer.target_staged->bytes.data(), claimer->bytes());
      }
    }
    if (claimer) completeRequest(*claimer);
    peer.target_staged.reset();
  }
  peer.target = nullptr;
}

}  // namespace railshard::transport::tcp
