#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "core/communicator.h"
#include "core/dispatch/collective_dispatcher.h"
#include "launcher/load_monitor.h"
#include "python/csrc/process_group.h"

namespace railshard::python {

// The PyTorch side of an elastic job (python/railshard/elastic.py wraps it): the railshard
// communicator init() made -- or, in a process railshard-launch restarted (RAILSHARD_JOIN=1),
// the one join() got -- with a c10d process group over it, and optionally the job's
// CollectiveDispatcher. torch's ProcessGroup has a fixed rank and size, so a change of
// membership does not re-form a group in place: shrink() and grow() hand the communicator
// from the current process group to Communicator::shrink()/grow() and wrap what they return
// in a new one (processGroup() then returns that). The dispatcher follows the communicator
// (recover() after a shrink, admit()/joined() across a grow), and runs its collectives on the
// process group's worker, in order with the collectives torch queued there.
class ElasticGroup {
 public:
  struct Options {
    std::chrono::milliseconds timeout{0};  // per collective; 0 = RAILSHARD_TIMEOUT's
    bool cuda = false;                     // torch 2.x: serve CUDA tensors too
    // With a dispatcher: its epoch (0 = none) and options, the same on every rank. A
    // joiner's comes from the members (CollectiveDispatcher::joined()) and must match.
    uint64_t epoch_size = 0;
    dispatch::DispatchOptions dispatch;
  };
  // A change of membership, as every rank of the new group sees it.
  struct Change {
    std::vector<int> lost;    // launch ranks that left
    std::vector<int> joined;  // launch ranks that joined
    // With a dispatcher: steps 0..committed-1 stand; this rank must restore the model from
    // before its last step (undo); the next step is the open one again (redo).
    uint64_t committed = 0;
    bool undo = false;
    bool redo = false;
    double seconds = 0;  // the re-form (and the dispatcher's part)
  };

  explicit ElasticGroup(const Options& options);
  ~ElasticGroup();
  ElasticGroup(const ElasticGroup&) = delete;
  ElasticGroup& operator=(const ElasticGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int generation() const { return generation_; }
  int launchRank() const;
  const std::vector<int>& launchRanks() const { return launch_ranks_; }
  bool joinedRunningJob() const { return joined_running_job_; }
  c10::intrusive_ptr<c10d::ProcessGroup> processGroup() const;

  // Collective over the current group: joiners waiting in join() (Communicator::joinersWaiting).
  int joinersWaiting();
  // After a collective of the group failed (a peer was lost): every survivor calls it.
  Change shrink();
  // At a step boundary, every member: admits the waiting joiners.
  Change grow();
  // Shuts the process group down (what is queued still runs). Idempotent.
  void close();

  // The dispatcher (InvalidArgument without one): CollectiveDispatcher's calls, run on the
  // worker. finishStep() adds this rank's load signals (launcher::LoadMonitor).
  std::vector<std::pair<uint64_t, uint64_t>> nextStep(size_t global_batch);
  void finishStep(double samples, double seconds);
  void commitStep();
  bool hasDispatcher() const { return dispatcher_.has_value(); }
  const dispatch::CollectiveDispatcher& dispatcher() const;

 private:
  // shrink() and grow(): takes the communicator from the process group, `form`s the next
  // generation from it, lets the dispatcher `follow` (when there is one) and wraps the result;
  // on an error the communicator it was left with is wrapped again (the caller may shrink).
  Change reform(const char* call,
                const std::function<std::unique_ptr<Communicator>(Communicator&)>& form,
                const std::function<void(Communicator&, Change&)>& follow);
  // Wraps `communicator` in a new process group and reads its numbering.
  void adopt(std::unique_ptr<Communicator> communicator);
  ProcessGroupRailshard& backend(const char* call);
  dispatch::CollectiveDispatcher& mutableDispatcher(const char* call);

  Options options_;
  Communicator::Timeout timeout_{};
  c10::intrusive_ptr<ProcessGroupRailshard> backend_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;  // torch 2.x: backend_ inside a named group
  std::optional<dispatch::CollectiveDispatcher> dispatcher_;
  // This rank's load signals (CPU quota, memory, power), sent with every finishStep().
  std::unique_ptr<launcher::LoadMonitor> monitor_;
  int rank_ = 0;
  int size_ = 1;
  int generation_ = 0;
  std::vector<int> launch_ranks_;
  bool joined_running_job_ = false;
};

}  // namespace railshard::python
