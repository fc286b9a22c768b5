#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "base/clock.h"
#include "transport/messaging/futex_word.h"
#include "transport/messaging/wait_policy.h"

namespace railshard::transport::messaging {

// The one wait loop of the library: a request of a messenger, a shared-memory step of the
// one-host engine, a point-to-point message through a host's segment all pass the time here,
// as the wait policy says (wait_policy.h): poll with `pause` while the awaited rank is likely
// running on another core, then poll yielding the core (it may need ours), then sleep in the
// kernel on a futex word that whoever makes progress bumps.
class Waiter {
 public:
  // How often a sleeping wait wakes to run its checks (a peer's process gone, the group failed
  // elsewhere) even when nobody bumps its word.
  static constexpr auto kCheckPeriod = std::chrono::milliseconds(100);

  explicit Waiter(WaitPlan plan = {}) : plan_(plan) {}
  const WaitPlan& plan() const { return plan_; }
  void setPlan(const WaitPlan& plan) { plan_ = plan; }

  // Returns true once `ready()` is; false at `deadline`. `ready` may throw to end the wait (an
  // abort it sees); it is called often, so it must be cheap. Once the plan's polling is spent,
  // sleeps on `word` while it still holds the value it had before `ready()` last said no, and
  // runs `check()` (which may throw: a peer lost) when the sleep begins, after every wake that
  // did not find `ready()`, and at least every kCheckPeriod: a wake may be the news itself (an
  // abort bumps the word), and `ready()` is kept cheap enough to skip such news while polling.
  template <typename Ready, typename Check>
  bool wait(Ready&& ready, FutexWord& word, std::atomic<uint32_t>& sleepers, Deadline deadline,
            Check&& check) const {
    return run(
        ready, word, sleepers, [deadline](Clock::time_point) { return deadline; }, check);
  }
  // As wait(), the deadline `timeout` after the wait began (`started`, when not null, says
  // when): the clock read that starts the polling starts the timeout too, one read fewer on
  // the way of every short wait (a clock read was measurable on an 8-byte all-reduce).
  template <typename Ready, typename Check>
  bool waitFor(Ready&& ready, FutexWord& word, std::atomic<uint32_t>& sleepers, Duration timeout,
               Check&& check, Clock::time_point* started = nullptr) const {
    return run(
        ready, word, sleepers,
        [timeout, started](Clock::time_point start) {
          if (started != nullptr) *started = start;
          return start + timeout;
        },
        check);
  }

 private:
  template <typename Ready, typename DeadlineOf, typename Check>
  bool run(Ready& ready, FutexWord& word, std::atomic<uint32_t>& sleepers, DeadlineOf deadline_of,
           Check& check) const {
    if (ready()) return true;
    const Clock::time_point start = Clock::now();
    const Deadline deadline = deadline_of(start);
    if (plan_.poll > Duration(0)) {
      bool yielding = plan_.pause == Duration(0);
      for (uint32_t i = 1;; ++i) {
        if (yielding) {
          sched_yield();
        } else {
          relax();
        }
        if (ready()) return true;
        if ((i & 63u) == 0 || yielding) {
          const auto spent = Clock::now() - start;
          if (spent >= plan_.poll) break;
          yielding = yielding || spent >= plan_.pause;
        }
      }
    }
    while (true) {
      const uint32_t seen = word.load();
      if (ready()) return true;
      check();
      const Clock::time_point now = Clock::now();
      if (now >= deadline) return false;
      word.sleepWhile(seen, std::min<Duration>(kCheckPeriod, deadline - now), sleepers);
    }
  }

  static void relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }

  WaitPlan plan_;
};

// What a group's waiters sleep on and whoever completes their requests bumps: a word of this
// process, or, once the rank has a host segment, its doorbell there (then the host's other
// ranks wake it too, when they post it a message through shared memory).
class Wake {
 public:
  Wake() : current_(&own_) {}
  Wake(const Wake&) = delete;
  Wake& operator=(const Wake&) = delete;

  // From now on sleep on and bump `word` (a segment's doorbell; it must outlive this Wake's
  // use). Called at set-up, before anyone waits.
  void use(FutexWord& word, std::atomic<uint32_t>& sleepers) {
    shared_ = Target{&word, &sleepers};
    current_.store(&shared_, std::memory_order_release);
  }
  FutexWord& word() const { return *current_.load(std::memory_order_acquire)->word; }
  std::atomic<uint32_t>& sleepers() const {
    return *current_.load(std::memory_order_acquire)->sleepers;
  }
  // Wakes every sleeper (cheap when none sleeps: an add and a load).
  void bump() {
    const Target* target = current_.load(std::memory_order_acquire);
    target->word->bump(*target->sleepers);
  }

 private:
  struct Target {
    FutexWord* word = nullptr;
    std::atomic<uint32_t>* sleepers = nullptr;
  };
  FutexWord own_word_;
  std::atomic<uint32_t> own_sleepers_{0};
  Target own_{&own_word_, &own_sleepers_};
  Target shared_;
  std::atomic<const Target*> current_;
};

}  // namespace railshard::transport::messaging
