#include "python/csrc/elastic_group.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "base/clock.h"
#include "base/config.h"
#include "base/error.h"
#include "launcher/init.h"
#include "python/csrc/named_group.h"

namespace railshard::python {

ElasticGroup::ElasticGroup(const Options& options) : options_(options) {
  guardedCall([&] {
    const Config config = Config::fromEnvironment();
    // As for the backend torch makes: torch's timeout= unless RAILSHARD_TIMEOUT is set.
    timeout_ = std::getenv("RAILSHARD_TIMEOUT") == nullptr && options.timeout.count() > 0
                   ? std::chrono::duration_cast<Communicator::Timeout>(options.timeout)
                   : std::chrono::duration_cast<Communicator::Timeout>(config.timeout);
    std::unique_ptr<Communicator> communicator = init();
    joined_running_job_ = communicator->generation() > 0;
    if (options.epoch_size > 0) {
      if (joined_running_job_) {
        // The members' grow() admitted this process; their admit() is running now.
        dispatcher_.emplace(dispatch::CollectiveDispatcher::joined(*communicator));
        const uint64_t theirs = dispatcher_->state().dispatcher().epochSize();
        if (theirs != options.epoch_size) {
          throw InvalidArgument("ElasticGroup: this rank's epoch_size " +
                                std::to_string(options.epoch_size) + " but the job's is " +
                                std::to_string(theirs));
        }
      } else {
        dispatcher_.emplace(*communicator, options.epoch_size, options.dispatch);
      }
    }
    monitor_ =
        std::make_unique<launcher::LoadMonitor>(launcher::LoadMonitor::fromConfig(config, -1));
    adopt(std::move(communicator));
  });
}

ElasticGroup::~ElasticGroup() {
  close();
}

void ElasticGroup::adopt(std::unique_ptr<Communicator> communicator) {
  rank_ = communicator->rank();
  size_ = communicator->size();
  generation_ = communicator->generation();
  launch_ranks_ = communicator->worldRanks();
  // The dispatcher keeps a pointer to the communicator; moving the owner does not move it.
  backend_ = c10::make_intrusive<ProcessGroupRailshard>(std::move(communicator), nullptr, timeout_);
#if TORCH_VERSION_MAJOR >= 2
  group_ = nameGroup(backend_, c10::make_intrusive<c10d::HashStore>(), options_.cuda);
#else
  group_ = backend_;
#endif
}

int ElasticGroup::launchRank() const {
  return launch_ranks_[static_cast<size_t>(rank_)];
}

c10::intrusive_ptr<c10d::ProcessGroup> ElasticGroup::processGroup() const {
  if (!group_) throw InvalidArgument("ElasticGroup: closed");
  return group_;
}

ProcessGroupRailshard& ElasticGroup::backend(const char* call) {
  if (!backend_) {
    throw InvalidArgument(std::string("ElasticGroup.") + call + ": the group is closed");
  }
  return *backend_;
}

dispatch::CollectiveDispatcher& ElasticGroup::mutableDispatcher(const char* call) {
  if (!dispatcher_) {
    throw InvalidArgument(std::string("ElasticGroup.") + call +
                          ": the group has no dispatcher (pass dataset_size)");
  }
  return *dispatcher_;
}

const dispatch::CollectiveDispatcher& ElasticGroup::dispatcher() const {
  if (!dispatcher_) {
    throw InvalidArgument("ElasticGroup: the group has no dispatcher (pass dataset_size)");
  }
  return *dispatcher_;
}

int ElasticGroup::joinersWaiting() {
  return guardedCall([&] {
    int waiting = 0;
    backend("joiners_waiting").runOnWorker([&](Communicator& c) {
      waiting = c.joinersWaiting(timeout_);
    });
    return waiting;
  });
}

ElasticGroup::Change ElasticGroup::reform(
    const char* call, const std::function<std::unique_ptr<Communicator>(Communicator&)>& form,
    const std::function<void(Communicator&, Change&)>& follow) {
  return guardedCall([&] {
    const auto start = Clock::now();
    std::unique_ptr<Communicator> old = backend(call).release();
    backend_.reset();
    group_.reset();
    if (!old) throw InvalidArgument(std::string("ElasticGroup.") + call + ": the group is closed");
    const std::vector<int> before = old->worldRanks();
    std::unique_ptr<Communicator> next;
    try {
      next = form(*old);
    } catch (...) {
      // Retired by the failed shrink()/grow(): every later call says so, none waits or hangs.
      adopt(std::move(old));
      throw;
    }
    Change change;
    if (dispatcher_) {
      try {
        follow(*next, change);
      } catch (...) {
        // Another peer lost while the dispatcher followed: the caller shrinks again.
        adopt(std::move(next));
        throw;
      }
    }
    adopt(std::move(next));
    old.reset();
    for (const int r : before) {
      if (std::find(launch_ranks_.begin(), launch_ranks_.end(), r) == launch_ranks_.end()) {
        change.lost.push_back(r);
      }
    }
    for (const int r : launch_ranks_) {
      if (std::find(before.begin(), before.end(), r) == before.end()) change.joined.push_back(r);
    }
    change.seconds = secondsSince(start);
    return change;
  });
}

namespace {
void takeRecovery(const dispatch::Recovery& recovery, ElasticGroup::Change& change) {
  change.committed = recovery.committed;
  change.undo = recovery.undo_last_step;
  change.redo = recovery.redo;
}
}  // namespace

ElasticGroup::Change ElasticGroup::shrink() {
  return reform(
      "shrink", [&](Communicator& c) { return c.shrink(timeout_); },
      [&](Communicator& survivors, Change& change) {
        takeRecovery(dispatcher_->recover(survivors), change);
      });
}

ElasticGroup::Change ElasticGroup::grow() {
  return reform(
      "grow", [&](Communicator& c) { return c.grow(timeout_); },
      [&](Communicator& grown, Change& change) {
        const auto admission = dispatcher_->admit(grown);
        if (admission.recovery) {
          takeRecovery(*admission.recovery, change);
        } else {
          change.committed = dispatcher_->committedSteps();
        }
      });
}

void ElasticGroup::close() {
  if (backend_) backend_->shutdown();
}

std::vector<std::pair<uint64_t, uint64_t>> ElasticGroup::nextStep(size_t global_batch) {
  return guardedCall([&] {
    auto& d = mutableDispatcher("next_step");
    std::vector<std::pair<uint64_t, uint64_t>> out;
    backend("next_step").runOnWorker([&](Communicator&) {
      for (const auto& range : d.nextStep(global_batch)) out.emplace_back(range.begin, range.end);
    });
    return out;
  });
}

void ElasticGroup::finishStep(double samples, double seconds) {
  guardedCall([&] {
    auto& dispatcher = mutableDispatcher("finish_step");
    const launcher::LoadMonitor::Sample load = monitor_->sample();
    dispatcher.finishStep(samples, seconds, load.signals, load.energy_joules);
  });
}

void ElasticGroup::commitStep() {
  guardedCall([&] { mutableDispatcher("commit_step").commitStep(); });
}

}  // namespace railshard::python
