// How shared-memory waits pass the time (transport/messaging/wait_policy.h, machine_load.h):
// planWait on synthetic machines; the machine's input read from the real machine (an affinity
// mask; a real cgroup v1 quota fitted by init()); every RAILSHARD_WAIT mode exact through a
// communicator.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "base/memory_store.h"
#include "core/communicator.h"
#include "launcher/cgroup.h"
#include "tests/test_util.h"
#include "transport/messaging/machine_load.h"
#include "transport/messaging/wait_policy.h"

namespace railshard {
namespace {

using std::chrono::microseconds;
using transport::messaging::MachineState;
using transport::messaging::planWait;
using transport::messaging::WaitPlan;

const Duration kSpin = microseconds(2000);

MachineState machine(unsigned cores, unsigned ranks) {
  MachineState m;
  m.cores = cores;
  m.local_ranks = ranks;
  return m;
}

TEST(WaitPolicy, ACorePerRankPausesThenYieldsThenSleeps) {
  for (WaitMode mode : {WaitMode::kAuto, WaitMode::kSpin}) {
    const WaitPlan plan = planWait(mode, machine(2, 2), kSpin);
    EXPECT_EQ(plan.pause, microseconds(20));
    EXPECT_EQ(plan.poll, kSpin);
    EXPECT_FALSE(plan.sleeps_early);
    EXPECT_EQ(planWait(mode, machine(8, 2), kSpin).pause, microseconds(20));
  }
}

TEST(WaitPolicy, MoreRanksThanCoresYieldAtOnce) {
  for (WaitMode mode : {WaitMode::kAuto, WaitMode::kSpin}) {
    const WaitPlan plan = planWait(mode, machine(2, 4), kSpin);
    EXPECT_EQ(plan.pause, Duration(0));
    EXPECT_EQ(plan.poll, kSpin);
    // A machine that reports no cores counts as one.
    EXPECT_EQ(planWait(mode, machine(0, 2), kSpin).pause, Duration(0));
    EXPECT_EQ(planWait(mode, machine(0, 1), kSpin).pause, microseconds(20));
  }
}

TEST(WaitPolicy, AZeroSpinBudgetSleepsAtOnce) {
  // What init() leaves a rank whose CPU quota is under a core (fitWaitsToQuota, below), and
  // RAILSHARD_SPIN_US=0: no polling, oversubscribed or not.
  for (const MachineState& m : {machine(2, 2), machine(2, 4)}) {
    EXPECT_EQ(planWait(WaitMode::kAuto, m, Duration(0)).poll, Duration(0));
    EXPECT_EQ(planWait(WaitMode::kSleep, m, Duration(0)).poll, Duration(0));
  }
}

TEST(WaitPolicy, SleepGlancesThenSleepsOnAnyMachine) {
  for (const MachineState& m : {machine(2, 2), machine(2, 4), machine(64, 2)}) {
    const WaitPlan sleep = planWait(WaitMode::kSleep, m, kSpin);
    EXPECT_TRUE(sleep.sleeps_early);
    EXPECT_EQ(sleep.poll, microseconds(2));
    EXPECT_EQ(sleep.pause, Duration(0));
  }
}

// Forks a child that runs `fn` and exits with its result (0..255).
int inChild(const std::function<int()>& fn) {
  const pid_t child = ::fork();
  if (child == 0) _exit(fn());
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(MachineLoad, AllowedCoresFollowTheAffinityMask) {
  const unsigned all = transport::messaging::allowedCores();
  EXPECT_GE(all, 1u);
  EXPECT_LE(all, std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_EQ(inChild([] {
              cpu_set_t one;
              CPU_ZERO(&one);
              CPU_SET(0, &one);
              if (sched_setaffinity(0, sizeof(one), &one) != 0) return 99;
              return static_cast<int>(transport::messaging::allowedCores());
            }),
            1);
}

// A rank in a real cgroup v1 group with a quota of 0.25 cores: init()'s fitting of the waits
// (launcher/cgroup.h) reads the quota and makes its waits sleep at once.
TEST(MachineLoad, AQuotaUnderOneCoreMakesInitsWaitsSleepAtOnce) {
  const std::string group = "/sys/fs/cgroup/cpu/railshard_wait_test_" + std::to_string(::getpid());
  std::error_code error;
  if (!std::filesystem::create_directory(group, error)) {
    GTEST_SKIP() << "no writable cgroup v1 cpu hierarchy at /sys/fs/cgroup/cpu (" << error.message()
                 << ")";
  }
  std::ofstream(group + "/cpu.cfs_period_us") << 100000;
  std::ofstream(group + "/cpu.cfs_quota_us") << 25000;
  const int quarters = inChild([&] {
    std::ofstream(group + "/tasks") << ::getpid() << std::flush;
    Config config;
    launcher::cgroup::fitWaitsToQuota(config, false);
    const int quarters = static_cast<int>(
        launcher::cgroup::cpuQuotaCores(launcher::cgroup::locate("cpu")) * 100 + 0.5);
    return config.wait.spin.count() == 0 ? quarters : 100 + quarters;
  });
  std::filesystem::remove(group, error);
  // The group hangs off the hierarchy's root, so no other quota binds inside it.
  EXPECT_EQ(quarters, 25) << "0.25 cores inside the group, and waits that sleep at once "
                             "(100 + quarters: they still spin)";
}

TEST(WaitModes, EveryModeAllreducesExactly) {
  for (WaitMode mode : {WaitMode::kAuto, WaitMode::kSpin, WaitMode::kSleep}) {
    SCOPED_TRACE(std::string(name(mode)));
    MemoryStore store;
    test::rethrowFirst(test::runRanks(3, [&](int rank) {
      Communicator::Options options;
      options.rank = rank;
      options.size = 3;
      options.config.transport = TransportKind::kShm;
      options.config.wait.mode = mode;
      auto comm = Communicator::create(store, options);
      for (int i = 0; i < 200; ++i) {
        std::vector<int64_t> data(1 + i % 17, rank + i);
        comm->allreduce(data.data(), data.size(), DataType::kInt64, ReduceOp::kSum);
        for (int64_t v : data) {
          if (v != 3 * i + 3) throw std::runtime_error("wrong sum " + std::to_string(v));
        }
      }
    }));
  }
}

}  // namespace
}  // namespace railshard
