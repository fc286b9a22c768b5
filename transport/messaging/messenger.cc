// The messenger's set-up, its user-facing calls and the peer's state (messenger.h).
#include <cstring>

#include "base/logging.h"
#include "base/trace.h"
#include "transport/cuda_driver.h"
#include "transport/messaging/messenger_internal.h"
#include "transport/messaging/rendezvous.h"

namespace railshard::transport::messaging {

Messenger::Messenger(const Group& group, MessengerOptions options)
    : group_(group),
      options_(std::move(options)),
      book_(group.rank, options_.peer, group.formatter) {}

Messenger::~Messenger() {
  std::lock_guard<std::mutex> lock(mutex_);
  dropRegistrationsLocked();
}

int Messenger::linkCount() const {
  return static_cast<int>(links_.size());
}

links::Link& Messenger::link(int index) const {
  return *links_.at(static_cast<size_t>(index))->link;
}

int Messenger::addLink(std::unique_ptr<links::Link> link, bool data, bool up) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto state = std::make_unique<LinkState>();
  state->index = static_cast<int>(links_.size());
  link->attach(this, state->index);
  state->link = std::move(link);
  state->state = up ? State::kUp : State::kConnecting;
  state->ever_up = up;
  state->quiesced = !up;
  if (!up) state->down_reason = "not connected yet (connected when the pair first talks)";
  state->last_progress = state->last_heard = now();
  polled_ = polled_ || state->attributes().polled;
  if (data) {
    state->rail = data_links_++;
    link_of_rail_.push_back(state->index);
  }
  links_.push_back(std::move(state));
  // Equal weights are NCCL's choice; otherwise the links' own figures, then measurements.
  std::vector<std::string> names;
  std::vector<double> gbps;
  for (const auto& l : links_) {
    if (!l->data()) continue;
    names.push_back(l->attributes().name);
    gbps.push_back(options_.links.weights == RailWeights::kEqual ? 1.0 : l->attributes().gbps);
  }
  if (names.empty()) return links_.back()->index;
  scheduler_ = std::make_unique<rails::RailScheduler>(names, gbps);
  for (const auto& l : links_) {
    if (l->data() && !l->up()) scheduler_->markDown(l->rail, l->down_reason);
  }
  return links_.back()->index;
}

void Messenger::connect() {
  Guard guard(*this);
  connect_asked_ = true;
  if (!options_.initiator) return;
  for (auto& l : links_) {
    if (l->state == State::kConnecting && !l->attributes().redials &&
        l->connect == Connect::kIdle) {
      startConnectLocked(*l);
    }
  }
}

bool Messenger::connected() const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& l : links_) {
    if (l->state == State::kConnecting) return false;
  }
  return true;
}

std::string Messenger::peerName() const {
  return "rank " + std::to_string(options_.peer) +
         (options_.peer_address.empty() ? "" : " (" + options_.peer_address + ")");
}

std::string Messenger::describe(const MessageTag& tag) const {
  if (group_.formatter != nullptr && group_.formatter->describe) {
    return group_.formatter->describe(tag);
  }
  return "message #" + std::to_string(tag.sequence) + " step " + std::to_string(tag.step);
}

bool Messenger::failed() const {
  return group_.failure->failed();
}

void Messenger::failLocked(ErrorKind kind, std::string message, bool tell_peers) {
  pending_.push_back(Pending{kind, std::move(message), tell_peers});
}

void Messenger::raisePending() {
  std::vector<Pending> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending.swap(pending_);
  }
  // The first one wins; the group's state keeps it.
  if (!pending.empty()) {
    group_.failure->fail(makeError(pending.front().kind, pending.front().message),
                         pending.front().tell_peers);
  }
}

void Messenger::peerLostLocked(const std::string& reason, const std::string& message) {
  lost_ = true;
  lost_why_ = reason;
  group_.failure->recordLost(options_.peer, reason);
  failLocked(ErrorKind::kPeerLost, message);
}

bool Messenger::lost() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lost_;
}

bool Messenger::busyLocked() const {
  if (expecting_ > 0 || !deferred_.empty() || book_.awaitsAny() || !moves_.empty() ||
      !offered_.empty() || !granted_.empty()) {
    return true;
  }
  for (const auto& l : links_) {
    if (!l->queue.empty() || !l->posted.empty() || !l->unacked.empty()) return true;
  }
  return false;
}

RequestPtr Messenger::isend(const void* data, size_t bytes, const MessageTag& tag) {
  std::shared_ptr<SendOp> op;
  {
    Guard guard(*this);
    if (failed()) {
      // raised below
    } else if (lost_ || bye_received_ || !unreachable_.empty()) {
      if (!unreachable_.empty()) {
        failLocked(ErrorKind::kPeerLost, unreachable_);
      } else {
        failLocked(ErrorKind::kPeerLost, "rank " + std::to_string(group_.rank) + ": cannot send " +
                                             describe(tag) + " to " + peerName() + ": " +
                                             (lost_ ? "the connection is gone (" + lost_why_ + ")"
                                                    : "it closed its communicator"));
      }
    } else {
      op = std::make_shared<SendOp>(options_.peer, data, bytes, tag, book_.numberSend());
      op->device = group_.cuda != nullptr && bytes > 0 && group_.cuda->isDeviceMemory(data);
      if (dataLinkUpLocked()) {
        planLocked(op);
      } else if (dataLinkComingLocked()) {
        // Links connected on first use: planned once one is up, in message order.
        deferred_.push_back(op);
        wantLocked();
      } else {
        failLocked(ErrorKind::kPeerLost, "rank " + std::to_string(group_.rank) + ": cannot send " +
                                             describe(tag) + " to " + peerName() +
                                             ": every link is down (" + linksSummaryLocked() + ")");
      }
    }
  }
  group_.failure->check();
  return op;
}

RequestPtr Messenger::irecv(void* data, size_t bytes, const MessageTag& tag) {
  auto op = std::make_shared<RecvOp>(options_.peer, bytes, tag);
  op->device = group_.cuda != nullptr && bytes > 0 && group_.cuda->isDeviceMemory(data);
  return postReceive(
      op, tag, [&](const RequestPtr& request) { return book_.post(request, data, bytes, tag); });
}

RequestPtr Messenger::irecvChosen(size_t capacity, bool device, Chooser choose) {
  auto op = std::make_shared<RecvOp>(options_.peer, capacity, MessageTag{});
  op->device = device && group_.cuda != nullptr && capacity > 0;
  return postReceive(op, MessageTag{}, [&](const RequestPtr& request) {
    return book_.postChosen(request, std::move(choose));
  });
}

RequestPtr Messenger::postReceive(const RequestPtr& op, const MessageTag& tag,
                                  FunctionRef<MessageBook::Posted(const RequestPtr&)> post) {
  {
    Guard guard(*this);
    if (failed()) {
      // raised below
    } else if (!book_.nextArrived() && (lost_ || !unreachable_.empty() ||
                                        (bye_received_ && book_.received() >= bye_messages_))) {
      if (!unreachable_.empty()) {
        failLocked(ErrorKind::kPeerLost, unreachable_);
      } else {
        failLocked(ErrorKind::kPeerLost, "rank " + std::to_string(group_.rank) +
                                             ": cannot receive " + describe(tag) + " from " +
                                             peerName() + ": " +
                                             (lost_ ? "the connection is gone (" + lost_why_ + ")"
                                                    : "it closed its communicator"));
      }
    } else {
      MessageBook::Posted posted = post(op);
      if (posted.problem) {
        failLocked(posted.problem->kind, std::move(posted.problem->text));
      } else if (posted.complete) {
        // It had arrived whole before this receive: one copy out of the staging buffer.
        completeIncomingLocked(*posted.complete, posted.complete->staged.data());
      }
      if (!dataLinkUpLocked() && dataLinkComingLocked()) wantLocked();
    }
  }
  group_.failure->check();
  return op;
}

void Messenger::waited(const RequestPtr& request) {
  if (request->kind() != Request::Kind::kSend || !retains()) return;
  auto& op = static_cast<SendOp&>(*request);
  std::lock_guard<std::mutex> lock(mutex_);
  op.waited = true;
  if (op.unwritten == 0 && !op.done()) releaseByCopyLocked(op);
}

bool Messenger::nextArrived(const std::function<bool(const MessageTag&)>& accept) {
  std::lock_guard<std::mutex> lock(mutex_);
  const MessageTag* tag = book_.nextArrivedTag();
  return tag != nullptr && accept(*tag);
}

std::optional<std::string> Messenger::checkStaged() {
  if (group_.current == nullptr) return std::nullopt;
  std::lock_guard<std::mutex> lock(mutex_);
  return book_.checkStaged(
      [&](const MessageTag& theirs) { return group_.current->unsolicited(options_.peer, theirs); });
}

void Messenger::expectArrival(bool on) {
  std::lock_guard<std::mutex> lock(mutex_);
  expecting_ += on ? 1 : -1;
}

void Messenger::poll() {
  if (!polled_) return;
  Guard guard(*this);
  for (auto& l : links_) {
    if (l->attributes().polled) l->link->poll();
  }
}

void Messenger::tick() {
  Guard guard(*this);
  if (failed() || lost_) return;
  // Polled links move along at least this often, whoever waits (a peer's heartbeat, an abort,
  // its process's end are seen even by a rank that computes).
  if (polled_) {
    for (auto& l : links_) {
      if (l->attributes().polled) l->link->poll();
    }
  }
  const Clock::time_point t = now();
  heartbeatLocked(t);
  if (lost_) return;
  if (data_links_ > 1) checkStallsLocked(t);
  dialFirstLocked(t);
  rejoinLocked(t);
}

void Messenger::sayGoodbye() {
  Guard guard(*this);
  if (bye_sent_ || failed()) return;
  bye_sent_ = true;
  // On every link, behind its data: the peer learns from the first one to arrive how many
  // messages were sent, and each link can then be closed without a reset.
  for (auto& l : links_) {
    if (!l->up() || l->closed) continue;
    auto bye = std::make_shared<OutFrame>();
    bye->header.kind = static_cast<uint8_t>(FrameKind::kBye);
    bye->header.message = book_.sent();
    l->queue.push_back(std::move(bye));
    pumpLocked(*l);
  }
}

bool Messenger::drained() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failed()) return true;
  // A rendezvous in progress either way needs this rank's memory or links until it ends: an
  // offer the peer has yet to read (or be granted for), a move of its own.
  if (!moves_.empty() || !offered_.empty()) return false;
  for (const auto& l : links_) {
    if (l->up() && !l->closed && (!l->queue.empty() || !l->posted.empty())) return false;
  }
  return true;
}

std::vector<RailStatus> Messenger::rails(bool channels) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<RailStatus> result;
  for (const auto& l : links_) {
    // A same-host channel is memory, not a network rail (what the rails carry is what crossed
    // a network); metrics list it too, as the link the pair's bytes took.
    if (!l->data() || (!channels && l->attributes().kind == links::LinkKind::kShm)) continue;
    const links::LinkAttributes& a = l->attributes();
    RailStatus status;
    status.peer = options_.peer;
    status.name = a.name;
    status.local = a.local;
    status.remote = a.remote;
    status.up = l->up();
    status.gbps = data_links_ > 1 ? scheduler_->gbps(l->rail) : 0;
    status.fraction = data_links_ > 1 ? scheduler_->fraction(l->rail) : (status.up ? 1.0 : 0.0);
    status.bytes_sent = l->bytes_sent;
    status.bytes_in_place = l->bytes_in_place;
    status.down_reason = l->down_reason;
    status.outages = l->outages;
    result.push_back(status);
  }
  return result;
}

std::string Messenger::stateSummary() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stateSummaryLocked();
}

std::string Messenger::stateSummaryLocked() const {
  std::string text = "with rank " + std::to_string(options_.peer) + ": " +
                     std::to_string(book_.sent()) + " messages sent, " +
                     std::to_string(book_.received()) + " received;";
  for (const auto& l : links_) {
    text += " " + l->attributes().name + " " + linkStateLocked(*l) + ", generation " +
            std::to_string(l->generation) + " (" + std::to_string(l->queue.size()) +
            " frames queued, " + std::to_string(l->posted.size()) + " posted, " +
            std::to_string(l->unacked.size()) + " kept, " + std::to_string(l->landed) + " landed);";
  }
  text += " " + std::to_string(moves_.size()) + " rendezvous moving, " +
          std::to_string(offered_.size()) + " offered, " + std::to_string(granted_.size()) +
          " granted";
  return text;
}

uint64_t Messenger::bytesSent(int link) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return links_.at(static_cast<size_t>(link))->bytes_sent;
}

void Messenger::groupFailed(ErrorKind kind, const std::string& message, int lost_rank,
                            bool tell_peers) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (busyLocked()) {
    RS_LOG_DEBUG("rank {}: the group failed; in progress {}", group_.rank, stateSummaryLocked());
  }
  // Before anyone learns of the failure (and may free the buffers of the collective that
  // failed), stop using user memory: queued frames are dropped, a half-written one finishes
  // from a copy, nothing more lands in a receive, every registration for one-sided moves goes.
  for (auto& l : links_) {
    l->link->detach();
    for (auto* frames : {&l->queue, &l->posted, &l->unacked}) {
      for (auto& frame : *frames) frame->op.reset();
    }
    l->queue.clear();
    l->unacked.clear();
  }
  deferred_.clear();
  book_.clear();
  dropRegistrationsLocked();
  if (!tell_peers) return;
  // On every link up (the first to arrive wins); to a peer this rank calls lost too: one whose
  // data links all failed may still hear it on its control connection, and learns why.
  FrameHeader abort;
  abort.kind = static_cast<uint8_t>(FrameKind::kAbort);
  abort.error_kind = static_cast<uint8_t>(kind);
  abort.message = static_cast<uint64_t>(lost_rank + 1);  // 0: nobody was lost
  const std::string text = message.substr(0, kMaxControlPayload);
  abort.length = text.size();
  for (auto& l : links_) {
    if (l->up()) l->link->postControl(abort, text);
  }
}

}  // namespace railshard::transport::messaging
