#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/links/driver.h"
#include "transport/messaging/current_collective.h"
#include "transport/messaging/failure_state.h"
#include "transport/messaging/messenger.h"
#include "transport/messaging/waiter.h"
#include "transport/transport.h"

namespace railshard::transport::messaging {

// The messengers of one group of ranks, one per peer, as the Transport the collective
// algorithms talk to: requests go to the peer's messenger, every wait is the one Waiter, and
// every failure is the group's one FailureState. It knows nothing of how the links were made
// (core/channels chooses them per pair; the drivers own their I/O).
class Mesh final : public Transport {
 public:
  Mesh(int rank, int size, TagFormatter formatter);
  ~Mesh() override;
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  // --- set-up ---
  // What a messenger of this group shares with the others.
  Group group();
  void addMessenger(std::unique_ptr<Messenger> messenger);
  Messenger* messenger(int peer) const;
  // Stopped before the messengers go (they own the links its threads use).
  void addDriver(std::unique_ptr<links::Driver> driver);
  const std::vector<std::unique_ptr<links::Driver>>& drivers() const { return drivers_; }
  // How waits pass the time (wait_policy.h).
  void setWaitPlan(const WaitPlan& plan) { waiter_.setPlan(plan); }
  // The group's timer (heartbeats, stalled links, re-admission) every `period`.
  void start(Duration period);
  FailureState& failure() { return failure_; }
  Wake& wake() { return wake_; }
  const Waiter& waiter() const { return waiter_; }
  // "tcp", "ibverbs+tcp": the kinds of links that carry data to the peers.
  void setName(std::string name) { name_ = std::move(name); }

  // --- Transport ---
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  RequestPtr isend(int peer, const void* data, size_t bytes, const MessageTag& tag) override;
  RequestPtr irecv(int peer, void* data, size_t bytes, const MessageTag& tag) override;
  void wait(const RequestPtr& request, Deadline deadline) override;
  // Waits, as every wait does, until `ready()` (cheap: called often) or `deadline` (false);
  // raises the group's failure. For set-up waits on the messengers (links connecting).
  bool waitUntil(const std::function<bool()>& ready, Deadline deadline);
  void abort(std::exception_ptr error, bool tell_peers) override;
  void checkHealthy() const override { failure_.check(); }
  std::vector<RailStatus> rails() const override;
  // rails() and every same-host channel: the bytes each data link carried (metrics).
  std::vector<RailStatus> links() const;
  std::vector<LostPeer> lostPeers() const override { return failure_.lostPeers(); }
  int awaitArrival(const std::vector<int>& peers,
                   const std::function<bool(const MessageTag&)>& accept,
                   Deadline deadline) override;
  void enterCollective(const MessageTag& tag) override;
  void setTimeoutExplainer(std::function<std::string(const MessageTag&)> explain) override {
    timeout_explainer_ = std::move(explain);
  }
  void setFailureListener(std::function<void(ErrorKind, const std::string&)> listener) override;
  void setTraceRank(int world_rank) override { trace_rank_.store(world_rank); }

 private:
  Messenger& at(int peer, const char* what) const;
  void pollAll();
  void tickLoop(Duration period);

  int rank_;
  int size_;
  std::string name_ = "tcp";
  TagFormatter formatter_;
  FailureState failure_;
  Wake wake_;
  Waiter waiter_;
  CurrentCollective current_;
  std::atomic<int> trace_rank_{-1};
  std::vector<std::unique_ptr<Messenger>> messengers_;  // by rank; null for self
  std::vector<Messenger*> polled_;                      // those with polled links
  std::vector<std::unique_ptr<links::Driver>> drivers_;
  std::function<std::string(const MessageTag&)> timeout_explainer_;  // set before first use
  int messengers_hook_ = 0;
  int listener_hook_ = 0;
  std::mutex tick_mutex_;
  std::condition_variable tick_wake_;
  bool stopping_ = false;  // guarded by tick_mutex_
  std::thread ticker_;
};

}  // namespace railshard::transport::messaging
