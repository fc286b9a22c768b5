#include "transport/messaging/mesh.h"

#include <sstream>

#include "base/logging.h"

namespace railshard::transport::messaging {

namespace {

// How long a closing group waits for its goodbyes to go out and its peers to close theirs, so
// that no link is reset while a peer may still read from it.
constexpr auto kLinger = std::chrono::seconds(2);

}  // namespace

Mesh::Mesh(int rank, int size, TagFormatter formatter)
    : rank_(rank),
      size_(size),
      formatter_(std::move(formatter)),
      failure_(rank),
      current_(rank, &formatter_),
      messengers_(static_cast<size_t>(size)) {
  failure_.setWake(&wake_);
  // Before the failure is published: every messenger detaches user memory and tells its peer.
  messengers_hook_ = failure_.addHook(
      [this](ErrorKind kind, const std::string& message, int lost_rank, bool tell_peers) {
        for (auto& messenger : messengers_) {
          if (messenger) messenger->groupFailed(kind, message, lost_rank, tell_peers);
        }
      });
}

Mesh::~Mesh() {
  {
    std::lock_guard<std::mutex> lock(tick_mutex_);
    stopping_ = true;
  }
  tick_wake_.notify_all();
  if (ticker_.joinable()) ticker_.join();
  // A peer leaving from now on is expected.
  failure_.setClosing();
  const Deadline until = deadlineAfter(kLinger);
  if (!failure_.failed()) {
    for (auto& messenger : messengers_) {
      if (messenger) messenger->sayGoodbye();
    }
    auto drained = [&] {
      for (auto& messenger : messengers_) {
        if (messenger && !messenger->drained()) return false;
      }
      return true;
    };
    // Polled links (shared-memory channels) move only when polled: the peer frees their
    // entries, this rank must look.
    while (Clock::now() < until && !drained()) {
      if (!polled_.empty()) pollAll();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  for (auto& driver : drivers_) driver->linger(until);
  for (auto& driver : drivers_) driver->stop();
  failure_.removeHook(messengers_hook_);
  if (listener_hook_ != 0) failure_.removeHook(listener_hook_);
  drivers_.clear();
  messengers_.clear();
}

Group Mesh::group() {
  Group group;
  group.rank = rank_;
  group.formatter = &formatter_;
  group.failure = &failure_;
  group.wake = &wake_;
  group.current = &current_;
  group.trace_rank = &trace_rank_;
  return group;
}

void Mesh::addMessenger(std::unique_ptr<Messenger> messenger) {
  const int peer = messenger->peer();
  if (peer < 0 || peer >= size_ || peer == rank_) {
    throw InvalidArgument("mesh: a messenger for rank " + std::to_string(peer) + " in a group of " +
                          std::to_string(size_));
  }
  if (messenger->polled()) polled_.push_back(messenger.get());
  messengers_[static_cast<size_t>(peer)] = std::move(messenger);
}

Messenger* Mesh::messenger(int peer) const {
  if (peer < 0 || peer >= size_) return nullptr;
  return messengers_[static_cast<size_t>(peer)].get();
}

void Mesh::addDriver(std::unique_ptr<links::Driver> driver) {
  drivers_.push_back(std::move(driver));
}

void Mesh::start(Duration period) {
  if (ticker_.joinable()) return;
  ticker_ = std::thread([this, period] { tickLoop(period); });
}

void Mesh::tickLoop(Duration period) {
  std::unique_lock<std::mutex> lock(tick_mutex_);
  while (!stopping_) {
    tick_wake_.wait_for(lock, period, [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    for (auto& messenger : messengers_) {
      if (messenger) messenger->tick();
    }
    lock.lock();
  }
}

Messenger& Mesh::at(int peer, const char* what) const {
  if (peer < 0 || peer >= size_ || peer == rank_ || !messengers_[static_cast<size_t>(peer)]) {
    throw InvalidArgument(std::string(what) + ": bad peer rank " + std::to_string(peer));
  }
  return *messengers_[static_cast<size_t>(peer)];
}

RequestPtr Mesh::isend(int peer, const void* data, size_t bytes, const MessageTag& tag) {
  Messenger& messenger = at(peer, "isend");
  failure_.check();
  return messenger.isend(data, bytes, tag);
}

RequestPtr Mesh::irecv(int peer, void* data, size_t bytes, const MessageTag& tag) {
  Messenger& messenger = at(peer, "irecv");
  failure_.check();
  return messenger.irecv(data, bytes, tag);
}

void Mesh::pollAll() {
  for (Messenger* messenger : polled_) messenger->poll();
}

bool Mesh::waitUntil(const std::function<bool()>& ready, Deadline deadline) {
  const bool polled = !polled_.empty();
  const bool done = waiter_.wait(
      [&] {
        if (polled) pollAll();
        return ready() || failure_.failed();
      },
      wake_.word(), wake_.sleepers(), deadline, [] {});
  failure_.check();
  return done;
}

void Mesh::wait(const RequestPtr& request, Deadline deadline) {
  if (request->done()) return;
  Messenger& messenger = at(request->peer(), "wait");
  messenger.waited(request);
  const bool polled = !polled_.empty();
  waiter_.wait(
      [&] {
        if (polled) pollAll();
        return request->done() || failure_.failed();
      },
      wake_.word(), wake_.sleepers(), deadline, [] {});
  // Complete means every byte arrived before any failure: a piece is never counted after the
  // group failed.
  if (request->done()) return;
  if (failure_.failed()) failure_.rethrow();
  std::ostringstream message;
  const bool is_send = request->kind() == Request::Kind::kSend;
  const std::string what = formatter_.describe
                               ? formatter_.describe(request->tag())
                               : "message #" + std::to_string(request->tag().sequence);
  message << "rank " << rank_ << ": " << what << " timed out waiting "
          << (is_send ? "to send to " : "to receive from ") << "rank " << request->peer()
          << " (RAILSHARD_TIMEOUT)";
  if (timeout_explainer_) {
    const std::string explained = timeout_explainer_(request->tag());
    if (!explained.empty()) message << ": " << explained;
  }
  message << " [" << messenger.stateSummary() << "]";
  // Raises whichever failure came first: this timeout, or one another thread (a peer's abort,
  // a lost link) was publishing meanwhile. Never returns: the request is not done.
  failure_.fail(makeError(ErrorKind::kTimeout, message.str()), true);
  failure_.rethrow();
}

void Mesh::abort(std::exception_ptr error, bool tell_peers) {
  failure_.fail(std::move(error), tell_peers);
}

std::vector<RailStatus> Mesh::rails() const {
  std::vector<RailStatus> result;
  for (const auto& messenger : messengers_) {
    if (!messenger) continue;
    for (auto& status : messenger->rails()) result.push_back(std::move(status));
  }
  return result;
}

std::vector<RailStatus> Mesh::links() const {
  std::vector<RailStatus> result;
  for (const auto& messenger : messengers_) {
    if (!messenger) continue;
    for (auto& status : messenger->rails(true)) result.push_back(std::move(status));
  }
  return result;
}

// A receive from any source looks ahead in the peers' books: the first listed peer whose next
// message has begun to arrive with a tag `accept` takes; woken by each early message.
int Mesh::awaitArrival(const std::vector<int>& peers,
                       const std::function<bool(const MessageTag&)>& accept, Deadline deadline) {
  std::vector<Messenger*> candidates;
  for (int peer : peers) candidates.push_back(&at(peer, "awaitArrival"));
  // Awaited while this waits: a peer that hangs meanwhile is found by its heartbeat.
  struct Expecting {
    std::vector<Messenger*>& of;
    explicit Expecting(std::vector<Messenger*>& m) : of(m) {
      for (Messenger* messenger : of) messenger->expectArrival(true);
    }
    ~Expecting() {
      for (Messenger* messenger : of) messenger->expectArrival(false);
    }
    Expecting(const Expecting&) = delete;
    Expecting& operator=(const Expecting&) = delete;
  } expecting(candidates);
  const bool polled = !polled_.empty();
  int found = -1;
  waiter_.wait(
      [&] {
        if (polled) pollAll();
        if (failure_.failed()) return true;
        for (Messenger* messenger : candidates) {
          if (messenger->nextArrived(accept)) {
            found = messenger->peer();
            return true;
          }
        }
        return false;
      },
      wake_.word(), wake_.sleepers(), deadline, [] {});
  failure_.check();
  return found;
}

void Mesh::enterCollective(const MessageTag& tag) {
  failure_.check();
  current_.enter(tag);
  // What arrived before this rank got here.
  for (auto& messenger : messengers_) {
    if (!messenger) continue;
    if (auto mismatch = messenger->checkStaged()) {
      failure_.fail(makeError(ErrorKind::kMismatch, *mismatch), true);
      break;
    }
  }
  failure_.check();
}

void Mesh::setFailureListener(std::function<void(ErrorKind, const std::string&)> listener) {
  if (listener_hook_ != 0) {
    failure_.removeHook(listener_hook_);
    listener_hook_ = 0;
  }
  if (!listener) return;
  listener_hook_ =
      failure_.addHook([listener = std::move(listener)](ErrorKind kind, const std::string& message,
                                                        int, bool) { listener(kind, message); });
}

}  // namespace railshard::transport::messaging
