// The start-up ring (ring_exchange.h): its connections, and the all-gather over them.
#include "transport/bootstrap/ring_exchange.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <span>

#include "base/error.h"
#include "base/fnv.h"
#include "base/logging.h"
#include "transport/links/tcp/hello.h"
#include "transport/links/tcp/hello_acceptor.h"

namespace railshard::transport::bootstrap {

namespace tcp = links::tcp;

namespace {

constexpr uint32_t kStepMagic = 0x52534252;  // "RSBR"
// One rank's value, at most: addresses and host descriptions are far smaller; this only
// stops a garbled length from allocating the machine's memory.
constexpr uint64_t kMaxValueBytes = uint64_t{64} << 20;

// Precedes each value passed along the ring.
struct StepHeader {
  uint32_t magic = kStepMagic;
  uint32_t call = 0;    // which all-gather of the group's (0, 1, ...)
  uint32_t origin = 0;  // whose value follows
  uint32_t reserved = 0;
  uint64_t what = 0;  // FNV-1a of the call's name: every rank must be at the same call
  uint64_t bytes = 0;
};
static_assert(sizeof(StepHeader) == 32, "StepHeader is part of the wire format");

std::string keyOf(const RingOptions& options, int rank) {
  return options.key_prefix + "/boot/" + std::to_string(rank);
}

int millisUntil(Deadline deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1000));
}

}  // namespace

RingExchange::RingExchange(Store& store, const RingOptions& options) : options_(options) {
  if (options_.size < 1 || options_.rank < 0 || options_.rank >= options_.size) {
    throw InvalidArgument("start-up ring: rank " + std::to_string(options_.rank) +
                          " of a group of " + std::to_string(options_.size));
  }
  if (options_.size == 1) return;
  const int rank = options_.rank;
  next_rank_ = (rank + 1) % options_.size;
  prev_rank_ = (rank + options_.size - 1) % options_.size;
  const Deadline deadline = deadlineAfter(options_.timeout);
  const std::string host = options_.advertise_host.empty() ? "127.0.0.1" : options_.advertise_host;
  tcp::Fd listener =
      tcp::listenOn(tcp::resolve(tcp::joinHostPort(host, 0), "start-up ring address"));
  store.setString(keyOf(options_, rank), tcp::localAddress(listener.get()).toString(),
                  options_.timeout);
  const std::string next_address = store.getString(
      keyOf(options_, next_rank_), std::max<Duration>(Duration(0), deadline - Clock::now()));

  // Connect first, then accept: the connection lands in the successor's backlog whether or
  // not it accepts yet, so no rank waits on another to start.
  const std::string token = options_.token.substr(0, tcp::kMaxToken);
  const std::string to = "rank " + std::to_string(rank) + " joining the start-up ring at rank " +
                         std::to_string(next_rank_) + " (" + next_address + ")";
  next_ = tcp::connectWithRetry(tcp::resolve(next_address, to), deadline, to);
  tcp::Hello hello;
  hello.rank = static_cast<uint32_t>(rank);
  hello.world_size = static_cast<uint32_t>(options_.size);
  hello.token_bytes = static_cast<uint16_t>(token.size());
  tcp::sendAll(next_.get(), &hello, sizeof(hello), deadline, to);
  tcp::sendAll(next_.get(), token.data(), token.size(), deadline, to);

  // Strangers and silent connections are refused and logged as at the data ports.
  const std::string expected_token = options_.token.substr(0, tcp::kMaxToken);
  // A hello claiming to be the predecessor, refused for its job token, world size or wire
  // version. Alone it may be a stranger's (the ring waits on, and its timeout says so); with the
  // successor gone too it is this job's rank configured differently, which refused this rank in
  // turn and went before reading its hello (a reset, not a refusal): said now, not at the
  // deadline.
  std::string predecessor_refused;
  tcp::HelloAcceptor("rank " + std::to_string(rank), "start-up ring connection")
      .run(
          {listener.get()}, deadline, options_.timeout,
          [&] {
            // The successor closing the connection, before its reply, refused this rank's
            // hello (it logs why): say so now rather than wait out the deadline.
            const NextState state = nextState();
            if (state == NextState::kRefused) throw PeerLostError(refusedText(to));
            if (!predecessor_refused.empty() && state == NextState::kGone) {
              throw PeerLostError("rank " + std::to_string(rank) +
                                  " refused the connection (a different RAILSHARD_TOKEN or world "
                                  "size?) of rank " +
                                  std::to_string(prev_rank_) +
                                  ", its predecessor in the start-up ring: " + predecessor_refused);
            }
            return prev_.valid();
          },
          [&](const tcp::ReceivedHello& received, int) {
            // -1: any rank of the group passes checkHello's rank test; the ring wants one.
            std::string reason =
                tcp::checkHello(received.hello, received.token, expected_token, -1, options_.size);
            if (!reason.empty() && static_cast<int>(received.hello.rank) == prev_rank_ &&
                received.hello.magic == tcp::kHelloMagic) {
              predecessor_refused = reason;
            }
            if (reason.empty() && static_cast<int>(received.hello.rank) != prev_rank_) {
              reason = "rank " + std::to_string(received.hello.rank) +
                       " is not this rank's predecessor in the ring";
            }
            return reason;
          },
          [&](tcp::Fd fd, const tcp::ReceivedHello&, const std::string& from) {
            tcp::Hello reply;
            reply.rank = static_cast<uint32_t>(rank);
            reply.world_size = static_cast<uint32_t>(options_.size);
            try {
              tcp::sendAll(fd.get(), &reply, sizeof(reply), deadline, "ring reply to " + from);
            } catch (const Error& e) {
              return std::string(e.what());
            }
            prev_ = std::move(fd);
            return std::string();
          },
          [&] {
            return "rank " + std::to_string(prev_rank_) +
                   " (its predecessor in the start-up ring) did not connect" +
                   (predecessor_refused.empty() ? std::string()
                                                : " (a connection claiming to be it was refused: " +
                                                      predecessor_refused + ")");
          });
  // The successor's reply: it took this rank's hello. Or why not.
  for (NextState state = nextState(); state != NextState::kReplied; state = nextState()) {
    if (state == NextState::kRefused) throw PeerLostError(refusedText(to));
    if (state == NextState::kGone) {
      throw PeerLostError(to + ": rank " + std::to_string(next_rank_) +
                          " went away before taking this rank's hello (it gave up or exited: "
                          "its own error says why; " +
                          next_gone_ + ")");
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) throw TimeoutError(to + ": no reply to its hello");
    pollfd one{next_.get(), POLLIN, 0};
    ::poll(&one, 1, static_cast<int>(std::min<int64_t>(left.count(), 100)));
  }
  tcp::Hello reply;
  tcp::recvAll(next_.get(), &reply, sizeof(reply), deadline, to);
  if (reply.magic != tcp::kHelloMagic || static_cast<int>(reply.rank) != next_rank_) {
    throw ProtocolError(to + ": unexpected reply to its hello");
  }
  tcp::setNonBlocking(next_.get(), true);
  tcp::setNonBlocking(prev_.get(), true);
}

RingExchange::NextState RingExchange::nextState() {
  if (!next_gone_.empty()) return NextState::kGone;
  char byte = 0;
  const ssize_t n = ::recv(next_.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return NextState::kReplied;
  if (n == 0) return NextState::kRefused;  // an orderly close: the hello read, then closed
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return NextState::kWaiting;
  next_gone_ = tcp::errnoText(errno);
  return NextState::kGone;
}

std::string RingExchange::refusedText(const std::string& what) const {
  return what + ": rank " + std::to_string(next_rank_) +
         " refused the connection (a different RAILSHARD_TOKEN or world size? its log says why)";
}

std::string RingExchange::describeStep(const std::string& what) const {
  return "rank " + std::to_string(options_.rank) + ": start-up exchange '" + what + "'";
}

std::vector<std::string> RingExchange::allGather(const std::string& mine, const std::string& what) {
  const int size = options_.size;
  std::vector<std::string> values(static_cast<size_t>(size));
  values[static_cast<size_t>(options_.rank)] = mine;
  const uint32_t call = calls_++;
  const uint64_t what_hash = Fnv1a().add(what).value();
  const Deadline deadline = deadlineAfter(options_.timeout);
  // Step s passes on the value that came in at step s - 1 (at first this rank's own).
  for (int s = 0; s + 1 < size; ++s) {
    const int out = (options_.rank - s + size) % size;
    const int in = (options_.rank - s - 1 + 2 * size) % size;
    values[static_cast<size_t>(in)] =
        step(values[static_cast<size_t>(out)], static_cast<uint32_t>(out),
             static_cast<uint32_t>(in), call, what_hash, what, deadline);
  }
  return values;
}

std::string RingExchange::step(const std::string& out, uint32_t origin_out, uint32_t origin_in,
                               uint32_t call, uint64_t what_hash, const std::string& what,
                               Deadline deadline) {
  StepHeader header;
  header.call = call;
  header.origin = origin_out;
  header.what = what_hash;
  header.bytes = out.size();
  std::vector<uint8_t> sending(sizeof(header) + out.size());
  std::memcpy(sending.data(), &header, sizeof(header));
  std::memcpy(sending.data() + sizeof(header), out.data(), out.size());
  size_t sent = 0;

  StepHeader theirs;
  size_t header_got = 0;
  std::string value;
  size_t value_got = 0;
  bool have_header = false;
  auto received = [&] { return have_header && value_got == value.size(); };

  while (sent < sending.size() || !received()) {
    if (Clock::now() >= deadline) {
      throw TimeoutError(
          describeStep(what) + ": " +
          (received() ? "rank " + std::to_string(next_rank_) + " took nothing"
                      : "nothing from rank " + std::to_string(prev_rank_)) +
          " within " +
          std::to_string(
              std::chrono::duration_cast<std::chrono::seconds>(options_.timeout).count()) +
          " s (its start-up stopped or is stuck before this point)");
    }
    pollfd fds[2] = {{next_.get(), static_cast<short>(sent < sending.size() ? POLLOUT : 0), 0},
                     {prev_.get(), static_cast<short>(received() ? 0 : POLLIN), 0}};
    const int rc = ::poll(fds, 2, millisUntil(deadline));
    if (rc < 0 && errno != EINTR)
      throw Error(describeStep(what) + ": poll: " + tcp::errnoText(errno));
    if (rc <= 0) continue;
    if (sent < sending.size() && (fds[0].revents & (POLLOUT | POLLERR | POLLHUP)) != 0) {
      const ssize_t n = ::send(next_.get(), sending.data() + sent, sending.size() - sent,
                               MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        throw PeerLostError(describeStep(what) + ": rank " + std::to_string(next_rank_) +
                            " (next in the ring) is gone: " + tcp::errnoText(errno));
      }
    }
    if (!received() && (fds[1].revents & (POLLIN | POLLERR | POLLHUP)) != 0) {
      uint8_t* into = have_header ? reinterpret_cast<uint8_t*>(value.data()) + value_got
                                  : reinterpret_cast<uint8_t*>(&theirs) + header_got;
      const size_t want = have_header ? value.size() - value_got : sizeof(theirs) - header_got;
      const ssize_t n = ::recv(prev_.get(), into, want, MSG_DONTWAIT);
      if (n == 0) {
        throw PeerLostError(describeStep(what) + ": rank " + std::to_string(prev_rank_) +
                            " (previous in the ring) closed its connection (its start-up failed)");
      }
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        throw PeerLostError(describeStep(what) + ": rank " + std::to_string(prev_rank_) +
                            " (previous in the ring) is gone: " + tcp::errnoText(errno));
      }
      if (have_header) {
        value_got += static_cast<size_t>(n);
        continue;
      }
      header_got += static_cast<size_t>(n);
      if (header_got < sizeof(theirs)) continue;
      if (theirs.magic != kStepMagic || theirs.bytes > kMaxValueBytes ||
          theirs.origin != origin_in) {
        throw ProtocolError(describeStep(what) + ": malformed message from rank " +
                            std::to_string(prev_rank_));
      }
      if (theirs.call != header.call || theirs.what != what_hash) {
        throw MismatchError(describeStep(what) + ": rank " + std::to_string(prev_rank_) +
                            " is at another start-up exchange (number " +
                            std::to_string(theirs.call) + ", this rank's is " +
                            std::to_string(header.call) +
                            "): the ranks run different railshard versions or configurations");
      }
      value.resize(theirs.bytes);
      have_header = true;
    }
  }
  return value;
}

}  // namespace railshard::transport::bootstrap
