#include "transport/links/tcp/tcp_link.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "base/logging.h"
#include "transport/links/tcp/tcp_driver.h"

namespace railshard::transport::links::tcp {

namespace {

// Bytes read from one connection per poll before the others get a turn.
constexpr size_t kReadBudget = size_t{8} << 20;
// Over several links, a connection's kernel send buffer holds about this much of its rate,
// within these bounds (the kernel doubles the value for its bookkeeping): bytes in a socket's
// buffer are committed to that link, and with Linux's autotuned buffers (up to 4 MB) a slow
// link holds tens of milliseconds of data, so the links of a striped message finish far apart
// and acknowledgements queue behind that backlog (measured on the test bed: docs/multirail.md).
constexpr double kBufferSeconds = 0.001;
constexpr int kMinBuffer = 128 << 10;
constexpr int kMaxBuffer = 8 << 20;

}  // namespace

TcpLink::TcpLink(TcpDriver& driver, LinkAttributes attributes, Fd fd, int peer, int channel,
                 std::string target, std::string local_address)
    : driver_(driver),
      attributes_(std::move(attributes)),
      peer_(peer),
      channel_(channel),
      target_(std::move(target)),
      local_address_(std::move(local_address)),
      fd_(std::move(fd)) {
  if (fd_.valid()) setNonBlocking(fd_.get(), true);  // else dialled on first use (adoptLocked)
}

TcpLink::~TcpLink() = default;

bool TcpLink::canPost() const {
  // One data frame at a time inside the link: the messenger keeps the rest, where a link
  // that runs dry can take them over.
  return data_items_ == 0 && fd_.valid() && broken_.empty() && !shut_.load();
}

bool TcpLink::post(const messaging::OutFramePtr& frame) {
  Item item;
  item.header = frame->header;
  item.data = frame->data;
  item.frame = frame;
  sends_.push_back(std::move(item));
  ++data_items_;
  // Nothing queued ahead (the usual case): written from this thread now, which saves the
  // driver's wake-up on every small message. Frames ahead of it that completed meanwhile are
  // reported with the next flush unless this one completed too (then all of them did).
  unreported_ += writeLocked(false);
  if (data_items_ > 0) return false;
  unreported_ = 0;
  return true;
}

void TcpLink::postControl(const messaging::FrameHeader& header, const std::string& payload) {
  if (!fd_.valid() || shut_.load() || !broken_.empty()) return;
  Item item;
  item.header = header;
  item.owned = payload;
  // Ahead of a queued data frame (behind one already half on the wire, and behind other
  // control frames): acknowledgements and reports must not wait behind megabytes of pieces.
  auto at = sends_.begin();
  while (at != sends_.end() && (at->written > 0 || !at->frame)) ++at;
  sends_.insert(at, std::move(item));
  if (sends_.front().frame == nullptr) writeLocked(true);
  if (!sends_.empty()) setWriteInterest(true);
}

int TcpLink::writeLocked(bool control_only) {
  int completed = 0;
  while (!sends_.empty() && fd_.valid() && broken_.empty() && !shut_.load()) {
    Item& item = sends_.front();
    if (control_only && item.frame) break;
    iovec iov[2];
    int count = 0;
    if (item.written < sizeof(item.header)) {
      iov[count++] = {reinterpret_cast<uint8_t*>(&item.header) + item.written,
                      sizeof(item.header) - item.written};
      if (item.header.length > 0) {
        iov[count++] = {const_cast<uint8_t*>(item.payloadAt(0)), item.header.length};
      }
    } else {
      const size_t offset = item.written - sizeof(item.header);
      iov[count++] = {const_cast<uint8_t*>(item.payloadAt(offset)), item.header.length - offset};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(count);
    const ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        setWriteInterest(true);
        break;
      }
      brokeLocked("send failed: " + errnoText(errno));
      break;
    }
    item.written += static_cast<size_t>(n);
    taken_ += static_cast<uint64_t>(n);
    if (item.written < item.total()) {
      setWriteInterest(true);
      break;  // the socket's buffer is full
    }
    if (item.frame) {
      --data_items_;
      ++completed;
    }
    sends_.pop_front();
  }
  if (sends_.empty()) setWriteInterest(false);
  return completed;
}

int TcpLink::flushLocked() {
  const int completed = writeLocked(false) + unreported_;
  unreported_ = 0;
  return completed;
}

void TcpLink::setWriteInterest(bool on) {
  if (write_interest_ == on || !fd_.valid()) return;
  write_interest_ = on;
  driver_.setWriteInterest(*this, on);
}

void TcpLink::brokeLocked(const std::string& why) {
  // The driver's thread reports it with the link's context (the messenger takes it out, or
  // loses the peer); nothing more is written meanwhile.
  broken_ = why;
  RS_LOG_DEBUG("tcp: {} to rank {}: {}", attributes_.name, peer_, why);
  driver_.wake();
}

void TcpLink::shutdown() {
  // Any thread, with the messenger's lock: the descriptor stays open (the reader may be in a
  // recv on it) until the driver's thread closes it, and reports the link quiet.
  if (shut_.exchange(true)) return;
  if (fd_.valid()) ::shutdown(fd_.get(), SHUT_RDWR);
  sends_.clear();
  data_items_ = 0;
  unreported_ = 0;
  driver_.wake();
}

void TcpLink::detach() {
  // A frame half on the wire finishes from a copy, so that the peer's parser stays in step and
  // an abort can follow; unstarted data frames are dropped.
  std::deque<Item> kept;
  for (auto& item : sends_) {
    if (!item.frame) {
      kept.push_back(std::move(item));
      continue;
    }
    if (item.written == 0) continue;
    const size_t sent = item.written > sizeof(item.header) ? item.written - sizeof(item.header) : 0;
    item.owned.assign(reinterpret_cast<const char*>(item.data) + sent, item.header.length - sent);
    item.owned_from = sent;
    item.data = nullptr;
    item.frame.reset();
    kept.push_back(std::move(item));
  }
  sends_.swap(kept);
  data_items_ = 0;
  if (!sends_.empty()) setWriteInterest(true);
}

void TcpLink::rateChanged(double gbps) {
  if (!fd_.valid()) return;
  const double bytes_per_second = gbps * 1e9 / 8;
  const int wanted = static_cast<int>(
      std::clamp(bytes_per_second * kBufferSeconds, double(kMinBuffer), double(kMaxBuffer)));
  if (sndbuf_ > 0 && std::abs(wanted - sndbuf_) * 4 < sndbuf_) return;
  if (::setsockopt(fd_.get(), SOL_SOCKET, SO_SNDBUF, &wanted, sizeof(wanted)) == 0) {
    sndbuf_ = wanted;
  }
}

void TcpLink::redial(uint32_t generation) {
  driver_.redial(*this, generation);
}

bool TcpLink::closeLocked() {
  if (!fd_.valid()) return false;
  fd_.reset();
  write_interest_ = false;
  sends_.clear();
  data_items_ = 0;
  return true;
}

void TcpLink::adoptLocked(Fd fd) {
  fd_ = std::move(fd);
  setNonBlocking(fd_.get(), true);
  setNoDelay(fd_.get());
  sends_.clear();
  data_items_ = 0;
  write_interest_ = false;
  sndbuf_ = 0;
  broken_.clear();
  shut_.store(false);
  read_closed_.store(false);
  header_got_ = 0;
  in_payload_ = false;
  payload_got_ = 0;
  landing_ = {};
  drain_ = false;
}

void TcpLink::halfCloseLocked() {
  if (fd_.valid()) ::shutdown(fd_.get(), SHUT_WR);
}

void TcpLink::breakForTesting() {
  if (fd_.valid()) ::shutdown(fd_.get(), SHUT_RDWR);
}

void TcpLink::failed(const std::string& why, bool peer_closed) {
  read_closed_.store(true);
  auto guard = messenger().guard();
  messenger().linkFailedLocked(index(), why, peer_closed);
  // The messenger shuts it (taken out, or the peer lost); closed by the driver's next turn.
  shut_.store(true);
  driver_.wake();
}

void TcpLink::readable(bool after_send_failure) {
  static thread_local std::vector<uint8_t> sink(size_t{1} << 16);
  size_t budget = after_send_failure ? SIZE_MAX : kReadBudget;
  bool boundary_dry = false;
  while (budget > 0 && fd_.valid() && !read_closed_.load() &&
         (after_send_failure || !shut_.load())) {
    ssize_t n;
    if (!in_payload_) {
      n = ::recv(fd_.get(), reinterpret_cast<uint8_t*>(&header_) + header_got_,
                 sizeof(header_) - header_got_, MSG_DONTWAIT);
    } else {
      if (!drain_ && driver_.failure().failed()) {
        // User memory is off limits from now on: the rest of the payload is dropped.
        drain_ = true;
        driver_.readerQuiesced();
      }
      const size_t want =
          static_cast<size_t>(std::min<uint64_t>(header_.length - payload_got_, budget));
      uint8_t* into = drain_ ? sink.data() : landing_.target + payload_got_;
      n = ::recv(fd_.get(), into, drain_ ? std::min(want, sink.size()) : want, MSG_DONTWAIT);
    }
    if (n == 0) {
      failed("connection closed by the peer (process exited or crashed?)", true);
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        boundary_dry = !in_payload_ && header_got_ == 0;
        break;
      }
      const int err = errno;
      failed("connection error: " + errnoText(err), err == ECONNRESET || err == EPIPE);
      return;
    }
    budget -= std::min(budget, static_cast<size_t>(n));
    if (!in_payload_) {
      header_got_ += static_cast<size_t>(n);
      if (header_got_ == sizeof(header_)) startFrame();
    } else {
      payload_got_ += static_cast<uint64_t>(n);
      if (payload_got_ == header_.length) {
        in_payload_ = false;
        auto guard = messenger().guard();
        messenger().landedLocked(index(), header_, landing_);
        landing_ = {};
      }
    }
  }
  if (boundary_dry) {
    auto guard = messenger().guard();
    messenger().idleLocked(index());
  }
}

void TcpLink::startFrame() {
  header_got_ = 0;
  payload_got_ = 0;
  drain_ = false;
  try {
    messaging::validateFrameHeader(header_);
  } catch (const ProtocolError& e) {
    auto guard = messenger().guard();
    messenger().protocolErrorLocked(index(), e.what());
    read_closed_.store(true);  // nothing after a broken frame can be parsed
    return;
  }
  auto guard = messenger().guard();
  landing_ = messenger().arrivingLocked(index(), header_);
  if (header_.length == 0) {
    messenger().landedLocked(index(), header_, landing_);
    landing_ = {};
    return;
  }
  in_payload_ = true;
  drain_ = landing_.discard || landing_.target == nullptr;
}

}  // namespace railshard::transport::links::tcp
