#include "transport/links/tcp/tcp_driver.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>

#include "base/error.h"
#include "base/logging.h"
#include "transport/links/tcp/hello.h"

namespace railshard::transport::links::tcp {

namespace {

constexpr uint64_t kWakeToken = ~uint64_t{0};
// The progress thread's longest sleep: closing and adopting never wait for an event longer.
constexpr int kTickMs = 100;

}  // namespace

TcpDriver::TcpDriver(Options options, std::vector<std::unique_ptr<Listener>> listeners)
    : options_(std::move(options)), listeners_(std::move(listeners)) {
  epoll_fd_ = Fd(::epoll_create1(EPOLL_CLOEXEC));
  wake_fd_ = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!epoll_fd_.valid() || !wake_fd_.valid()) {
    throw Error("tcp: epoll/eventfd: " + errnoText(errno));
  }
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = kWakeToken;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, wake_fd_.get(), &event);
  // A thread that writes into receive buffers outside every lock: the group's error waits
  // until it has seen the failure.
  quiescer_ = options_.failure->addQuiescer(
      [this] { return quiesced_.load() || !progress_.joinable() || stopping_.load(); });
}

TcpDriver::~TcpDriver() {
  stop();
}

std::unique_ptr<TcpLink> TcpDriver::makeLink(Fd fd, LinkAttributes attributes, int peer,
                                             int channel, std::string target,
                                             std::string local_address) {
  auto link = std::make_unique<TcpLink>(*this, std::move(attributes), std::move(fd), peer, channel,
                                        std::move(target), std::move(local_address));
  links_.push_back(link.get());
  return link;
}

uint64_t TcpDriver::tokenOf(const TcpLink& link) const {
  return static_cast<uint64_t>(std::find(links_.begin(), links_.end(), &link) - links_.begin());
}

void TcpDriver::start() {
  for (TcpLink* link : links_) {
    if (link->fd() < 0) continue;  // connected on first use: added when dialled (adopt)
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = tokenOf(*link);
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, link->fd(), &event);
  }
  progress_ = std::thread([this] { progressLoop(); });
  // The keeper accepts dialled links on the listeners, the dialer dials them: a side with no
  // listener needs the dialer when it dials (the NCCL plugin's sending end).
  bool dials = false;
  for (TcpLink* link : links_) dials = dials || link->attributes().redials;
  if (!listeners_.empty()) keeper_ = std::thread([this] { keeperLoop(); });
  if (dials) dialer_ = std::thread([this] { dialerLoop(); });
}

void TcpDriver::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
}

void TcpDriver::setWriteInterest(TcpLink& link, bool on) {
  epoll_event event{};
  event.events = EPOLLIN | (on ? EPOLLOUT : 0u);
  event.data.u64 = tokenOf(link);
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, link.fd(), &event);
}

void TcpDriver::linger(Deadline until) {
  if (!progress_.joinable()) return;
  // What is queued goes out first; then each connection is half-closed, and kept until the
  // peer closes its end too: closing a socket with unread data would reset the connection and
  // could destroy what the peer has not read yet.
  auto allDone = [&](auto predicate) {
    for (TcpLink* link : links_) {
      auto guard = link->messenger().guard();
      if (!predicate(*link)) return false;
    }
    return true;
  };
  while (Clock::now() < until && !allDone([](TcpLink& l) {
           return l.fd() < 0 || l.wantsClose() || !l.brokenLocked().empty() || l.sendsEmptyLocked();
         })) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (TcpLink* link : links_) {
    auto guard = link->messenger().guard();
    link->halfCloseLocked();
  }
  while (Clock::now() < until &&
         !allDone([](TcpLink& l) { return l.fd() < 0 || l.readClosed(); })) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void TcpDriver::stop() {
  if (stopping_.exchange(true)) return;
  wake();
  {
    std::lock_guard<std::mutex> lock(keeper_mutex_);
    dials_changed_.notify_all();
  }
  if (dialer_.joinable()) dialer_.join();
  if (keeper_.joinable()) keeper_.join();
  if (progress_.joinable()) progress_.join();
  options_.failure->removeQuiescer(quiescer_);
  for (TcpLink* link : links_) {
    auto guard = link->messenger().guard();
    link->closeLocked();
  }
}

void TcpDriver::pauseForTesting(bool paused) {
  paused_.store(paused);
  wake();
  while (paused && !parked_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

std::vector<std::string> TcpDriver::listening() const {
  std::vector<std::string> addresses;
  for (const auto& listener : listeners_) {
    addresses.push_back(localAddress(listener->fd.get()).toString());
  }
  return addresses;
}

void TcpDriver::breakForTesting(int peer, int channel) {
  for (TcpLink* link : links_) {
    if (link->peer() != peer || link->channel() != channel) continue;
    auto guard = link->messenger().guard();
    link->breakForTesting();
  }
}

void TcpDriver::progressLoop() {
  epoll_event events[64];
  while (!stopping_.load()) {
    if (paused_.load()) {
      parked_.store(true);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    parked_.store(false);
    if (options_.failure->failed()) quiesced_.store(true);
    const int n = ::epoll_wait(epoll_fd_.get(), events, 64, kTickMs);
    if (n < 0 && errno != EINTR) {
      options_.failure->fail(makeError(ErrorKind::kGeneric, "tcp: epoll_wait: " + errnoText(errno)),
                             true);
      return;
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t token = events[i].data.u64;
      if (token == kWakeToken) {
        uint64_t value;
        [[maybe_unused]] ssize_t r = ::read(wake_fd_.get(), &value, sizeof(value));
        continue;
      }
      if (token >= links_.size()) continue;
      TcpLink& link = *links_[token];
      if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) link.readable();
      if (events[i].events & EPOLLOUT) {
        auto guard = link.messenger().guard();
        const int completed = link.flushLocked();
        if (completed > 0) link.messenger().completedLocked(link.index(), completed);
        link.messenger().roomLocked(link.index());
      }
    }
    reportBroken();
    closeShut();
    adopt();
  }
}

void TcpDriver::reportBroken() {
  // A send that failed (on any thread) marked its link broken; report it with its context even
  // if the socket never becomes readable. What the peer sent before may still wait in the
  // receive queue (above all an abort frame saying why it left): read that first, or such a
  // peer would be reported as lost instead.
  for (TcpLink* link : links_) {
    std::string why;
    {
      auto guard = link->messenger().guard();
      if (link->fd() < 0 || link->wantsClose() || link->brokenLocked().empty()) continue;
      why = link->brokenLocked();
    }
    link->readable(true);
    auto guard = link->messenger().guard();
    if (link->fd() >= 0 && !link->wantsClose()) {
      link->messenger().linkFailedLocked(link->index(), why, true);
      link->shutdown();  // closed on this turn, whatever the messenger made of it
    }
  }
}

void TcpDriver::closeShut() {
  // Links the messenger shut down (taken out, or failed): closed here, where nothing reads
  // them, and reported quiet so that the messenger can say how much of them it took.
  for (TcpLink* link : links_) {
    if (!link->wantsClose()) continue;
    auto guard = link->messenger().guard();
    const int fd = link->fd();
    if (fd < 0) continue;
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, fd, nullptr);
    link->closeLocked();
    link->messenger().quiescedLocked(link->index());
  }
}

void TcpDriver::redial(TcpLink& link, uint32_t generation) {
  {
    std::lock_guard<std::mutex> lock(keeper_mutex_);
    for (const Dial& dial : dials_) {
      if (dial.link == &link) return;  // one attempt at a time
    }
    dials_.push_back(Dial{&link, generation});
  }
  dials_changed_.notify_one();
}

void TcpDriver::adopt() {
  std::vector<Adopted> ready;
  {
    std::lock_guard<std::mutex> lock(keeper_mutex_);
    ready.swap(adopted_);
  }
  for (Adopted& a : ready) {
    TcpLink& link = *a.link;
    auto guard = link.messenger().guard();
    if (link.fd() >= 0) continue;  // still the old one (not yet closed): dialled too early
    link.adoptLocked(std::move(a.fd));
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = tokenOf(link);
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, link.fd(), &event);
    link.messenger().linkUpLocked(link.index(), a.generation);
  }
}

// Re-admission of a link that was taken out. Once both ranks are through its failover, the
// rank that opened the connection at start-up dials it again when the messenger says so,
// binding its rail address; the other rank's keeper accepts only a connection the messenger
// wants (failover complete, the next generation). A link connected on first use is the same
// exchange at generation 1, dialled by whichever rank uses the pair first (or both). The progress
// thread adopts the new connection: a fresh stream, and the messenger's previous estimate of the
// link, which measurement then corrects.
void TcpDriver::keeperLoop() {
  std::vector<pollfd> polled;
  for (const auto& l : listeners_) polled.push_back({l->fd.get(), POLLIN, 0});
  while (!stopping_.load()) {
    for (auto& p : polled) p.revents = 0;
    const int n = ::poll(polled.data(), polled.size(), 100);
    if (stopping_.load()) break;
    for (auto& p : polled) {
      if (n > 0 && (p.revents & POLLIN)) acceptRejoin(p.fd);
    }
  }
}

void TcpDriver::dialerLoop() {
  // Apart from the keeper: a dial waits up to a second for the peer's answer, and the peer may
  // be dialling this rank at the same moment (links connected on first use).
  while (!stopping_.load()) {
    std::vector<Dial> dials;
    {
      std::unique_lock<std::mutex> lock(keeper_mutex_);
      dials_changed_.wait(lock, [&] { return stopping_.load() || !dials_.empty(); });
      dials.swap(dials_);
    }
    for (const Dial& dial : dials) {
      if (stopping_.load()) break;
      dialAgain(dial);
    }
  }
}

void TcpDriver::acceptRejoin(int listen_fd) {
  const int raw = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (raw < 0) return;
  Fd fd(raw);
  setNoDelay(fd.get());  // as at start-up
  std::string from = "?";
  try {
    from = peerAddress(fd.get()).toString();
  } catch (const Error&) {
    return;
  }
  // As at start-up (tcp_connect.cc): the fixed part is checked (magic, version, token length)
  // before the token is read, every refusal is logged with its reason, and a connection that
  // is silent or slow holds the keeper for at most a second.
  auto refuse = [&](const std::string& reason) {
    RS_LOG_WARN("rank {}: refused a rail rejoin connection from {}: {}", options_.rank, from,
                reason);
  };
  const std::string token = options_.token.substr(0, kMaxToken);
  const Deadline deadline = deadlineAfter(std::chrono::seconds(1));
  try {
    std::vector<uint8_t> bytes(sizeof(Hello));
    recvAll(fd.get(), bytes.data(), bytes.size(), deadline, "rejoin hello");
    bytes.resize(helloSize(bytes));
    recvAll(fd.get(), bytes.data() + sizeof(Hello), bytes.size() - sizeof(Hello), deadline,
            "rejoin hello");
    const ReceivedHello received = parseHello(bytes);
    const Hello& hello = received.hello;
    // -1: a rank of either side may dial (a link connected on first use); this rank has no
    // link to itself, so its own rank finds no link below.
    if (auto reason = checkHello(hello, received.token, token, -1, options_.size);
        !reason.empty()) {
      refuse(reason);
      return;
    }
    if (!(hello.flags & kHelloRejoin)) {
      refuse("not a rejoin (start-up is over)");
      return;
    }
    TcpLink* link = nullptr;
    int channels = 0;
    for (TcpLink* l : links_) {
      if (l->peer() != static_cast<int>(hello.rank)) continue;
      ++channels;
      if (l->channel() == hello.channel) link = l;
    }
    if (link == nullptr || hello.channels != channels) {
      refuse("rank " + std::to_string(hello.rank) + " announces " + std::to_string(hello.channels) +
             " connection(s), this rank has " + std::to_string(channels));
      return;
    }
    {
      auto guard = link->messenger().guard();
      if (!link->messenger().redialWantedLocked(link->index(), hello.generation)) {
        // Also a normal race (a retry after the link was re-made): no warning.
        RS_LOG_DEBUG("rank {}: rejoin of connection {} from rank {} (generation {}) not wanted now",
                     options_.rank, hello.channel, hello.rank, hello.generation);
        return;
      }
      link->messenger().dialAcceptedLocked(link->index());
    }
    Hello ack;
    ack.rank = static_cast<uint32_t>(options_.rank);
    ack.world_size = static_cast<uint32_t>(options_.size);
    ack.channel = hello.channel;
    ack.channels = hello.channels;
    ack.flags = kHelloRejoin;
    ack.generation = hello.generation;
    sendAll(fd.get(), &ack, sizeof(ack), deadline, "rejoin reply");
    std::lock_guard<std::mutex> lock(keeper_mutex_);
    adopted_.push_back(Adopted{link, hello.generation, std::move(fd)});
  } catch (const Error& e) {
    refuse(e.what());
    return;
  }
  wake();
}

void TcpDriver::dialAgain(const Dial& dial) {
  TcpLink& link = *dial.link;
  const std::string what = "rank " + std::to_string(options_.rank) + " dialling " +
                           link.attributes().name + " to rank " + std::to_string(link.peer());
  const std::string token = options_.token.substr(0, kMaxToken);
  int channels = 0;
  for (TcpLink* l : links_) channels += l->peer() == link.peer() ? 1 : 0;
  try {
    const Deadline deadline = deadlineAfter(std::chrono::seconds(1));
    // A rail binds its local address; the default connection (first use) lets the kernel pick.
    std::optional<SockAddr> source;
    if (!link.localAddress().empty()) {
      source = resolve(joinHostPort(link.localAddress(), 0), "rail address");
    }
    Fd fd =
        connectWithRetry(resolve(link.target(), what), deadline, what, source ? &*source : nullptr);
    Hello hello;
    hello.rank = static_cast<uint32_t>(options_.rank);
    hello.world_size = static_cast<uint32_t>(options_.size);
    hello.token_bytes = static_cast<uint16_t>(token.size());
    hello.channel = static_cast<uint16_t>(link.channel());
    hello.channels = static_cast<uint16_t>(channels);
    hello.flags = kHelloRejoin;
    hello.generation = static_cast<uint16_t>(dial.generation);
    sendAll(fd.get(), &hello, sizeof(hello), deadline, what);
    sendAll(fd.get(), token.data(), token.size(), deadline, what);
    Hello ack;
    recvAll(fd.get(), &ack, sizeof(ack), deadline, what);
    if (ack.magic != kHelloMagic || !(ack.flags & kHelloRejoin)) return;
    {
      std::lock_guard<std::mutex> lock(keeper_mutex_);
      adopted_.push_back(Adopted{&link, dial.generation, std::move(fd)});
    }
    wake();
  } catch (const Error& e) {
    RS_LOG_DEBUG("{}: {}", what, e.what());
  }
}

}  // namespace railshard::transport::links::tcp
