// The load signals a rank reads about itself (launcher/load_monitor.h, cgroup.h,
// power_meter.h). The cgroup and powercap files are read from fake trees built here -- the
// same files the kernel shows, with values the test chose, so each reading has an exact
// reference -- and, where this machine allows it, from the real ones: this process's own
// memory and CPU time, a real cgroup v1 CPU quota made for a child of the test, and the CPU
// time a busy loop really spends.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "base/error.h"
#include "launcher/cgroup.h"
#include "launcher/load_monitor.h"
#include "launcher/power_meter.h"
#include "launcher/rank_groups.h"
#include "test_util.h"

namespace railshard::launcher {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

// A /proc with self/cgroup and self/mountinfo as a cgroup v1 host shows them (a container
// whose memory group root is /sandbox), plus the group directories under `root`.
struct FakeHost {
  fs::path root;
  explicit FakeHost(const std::string& name) : root(test::tempPath(name)) {
    fs::remove_all(root);
    write(root / "proc/self/cgroup",
          "4:memory:/sandbox/job\n2:cpu,cpuacct:/railshard/rank1\n0::/\n");
    write(root / "proc/self/mountinfo",
          "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
          "32 31 0:29 / " +
              (root / "cpu").string() +
              " rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
              "35 31 0:32 /sandbox " +
              (root / "memory").string() + " rw,relatime - cgroup cgroup rw,memory\n");
    // cpu: the parent allows 1.5 cores, the rank's group 0.4.
    write(root / "cpu/railshard/cpu.cfs_quota_us", "150000\n");
    write(root / "cpu/railshard/cpu.cfs_period_us", "100000\n");
    write(root / "cpu/railshard/rank1/cpu.cfs_quota_us", "4000\n");
    write(root / "cpu/railshard/rank1/cpu.cfs_period_us", "10000\n");
    write(root / "cpu/railshard/rank1/cpu.stat",
          "nr_periods 100\nnr_throttled 40\nthrottled_time 250000000\n");
    // memory: the job's group 512 MiB under an unlimited sandbox.
    write(root / "memory/job/memory.limit_in_bytes", "536870912\n");
    write(root / "memory/memory.limit_in_bytes", "9223372036854771712\n");
    write(root / "proc/meminfo", "MemTotal:       24576000 kB\nMemFree: 1 kB\n");
    write(root / "proc/self/statm", "1000 2560 0 0 0 0 0\n");
    write(root / "proc/stat", "cpu  100 0 100 1000 0 0 0 0 0 0\n");
  }
};

TEST(Cgroup, LocatesV1AndV2GroupsAndReadsQuotaThrottlingAndMemory) {
  FakeHost host("cgroup_v1");
  const auto cpu = cgroup::locate("cpu", (host.root / "proc").string());
  ASSERT_TRUE(cpu.found());
  EXPECT_FALSE(cpu.v2);
  EXPECT_EQ(cpu.dir, (host.root / "cpu/railshard/rank1").string());
  EXPECT_DOUBLE_EQ(cgroup::cpuQuotaCores(cpu), 0.4);  // the smaller of 0.4 and 1.5
  EXPECT_DOUBLE_EQ(cgroup::throttledSeconds(cpu), 0.25);
  const auto memory = cgroup::locate("memory", (host.root / "proc").string());
  ASSERT_TRUE(memory.found());
  EXPECT_EQ(memory.dir, (host.root / "memory/job").string());  // relative to the mount's root
  EXPECT_DOUBLE_EQ(cgroup::memoryLimitBytes(memory), 536870912.0);
  EXPECT_FALSE(cgroup::locate("blkio", (host.root / "proc").string()).found());

  // v2: one hierarchy; cpu.max "max" is no quota; the controller must be enabled there.
  const fs::path v2 = test::tempPath("cgroup_v2");
  fs::remove_all(v2);
  write(v2 / "proc/self/cgroup", "0::/job/rank0\n");
  write(v2 / "proc/self/mountinfo",
        "40 31 0:38 / " + (v2 / "unified").string() + " rw - cgroup2 cgroup2 rw\n");
  write(v2 / "unified/job/rank0/cgroup.controllers", "cpu memory\n");
  write(v2 / "unified/job/rank0/cpu.max", "25000 100000\n");
  write(v2 / "unified/job/cpu.max", "max 100000\n");
  write(v2 / "unified/job/rank0/cpu.stat", "usage_usec 1\nthrottled_usec 1500000\n");
  write(v2 / "unified/job/rank0/memory.max", "max\n");
  write(v2 / "unified/job/memory.max", "1073741824\n");
  const auto cpu2 = cgroup::locate("cpu", (v2 / "proc").string());
  ASSERT_TRUE(cpu2.found());
  EXPECT_TRUE(cpu2.v2);
  EXPECT_DOUBLE_EQ(cgroup::cpuQuotaCores(cpu2), 0.25);
  EXPECT_DOUBLE_EQ(cgroup::throttledSeconds(cpu2), 1.5);
  EXPECT_DOUBLE_EQ(cgroup::memoryLimitBytes(cgroup::locate("memory", (v2 / "proc").string())),
                   1073741824.0);
  write(v2 / "unified/job/rank0/cgroup.controllers", "memory\n");
  EXPECT_FALSE(cgroup::locate("cpu", (v2 / "proc").string()).found());
}

TEST(LoadMonitor, ReadsTheSignalsOfItsGroupsAndTheThrottlingOfEachInterval) {
  FakeHost host("monitor_v1");
  LoadMonitor::Options options;
  options.proc = (host.root / "proc").string();
  options.powercap_root = (host.root / "no-powercap").string();
  options.memory_limit_bytes = 256.0 * (1 << 20);  // RAILSHARD_MEMORY_LIMIT: tighter still
  LoadMonitor monitor(options);
  auto first = monitor.sample();
  EXPECT_DOUBLE_EQ(first.signals.memory_bytes,
                   2560.0 * static_cast<double>(::sysconf(_SC_PAGESIZE)));
  EXPECT_DOUBLE_EQ(first.signals.memory_limit_bytes, 256.0 * (1 << 20));
  EXPECT_DOUBLE_EQ(first.signals.cpu_quota_cores, 0.4);
  EXPECT_EQ(first.signals.cpu_throttled, 0);  // no interval yet
  EXPECT_EQ(first.signals.power_watts, 0);    // no source: unknown, not invented
  EXPECT_EQ(first.energy_joules, 0);
  EXPECT_EQ(monitor.powerSource(), "none");
  // 0.1 s of throttling more in an interval of at least 0.2 s.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  write(host.root / "cpu/railshard/rank1/cpu.stat",
        "nr_periods 120\nnr_throttled 50\nthrottled_time 350000000\n");
  const auto second = monitor.sample();
  EXPECT_GT(second.signals.cpu_throttled, 0.0);
  EXPECT_LE(second.signals.cpu_throttled, 0.5);
  // Without a configured cap the cgroup's limit is the tightest.
  options.memory_limit_bytes = 0;
  EXPECT_DOUBLE_EQ(LoadMonitor(options).sample().signals.memory_limit_bytes, 536870912.0);
}

// Burns `seconds` of this process's CPU time (not wall time: on a loaded machine a wall-time
// loop gets only part of a core, and the meter charges by CPU time).
double processCpuSeconds() {
  timespec now{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

void burn(double seconds) {
  const double start = processCpuSeconds();
  volatile double x = 1;
  while (processCpuSeconds() - start < seconds) {
    for (int i = 0; i < 10000; ++i) x = x * 1.0000001 + 1e-9;
  }
}

TEST(PowerMeter, RaplPackagesAreSharedOutByCpuTimeAndCountersWrap) {
  const fs::path root = test::tempPath("powercap");
  fs::remove_all(root);
  write(root / "intel-rapl:0/name", "package-0\n");
  write(root / "intel-rapl:0/energy_uj", "1000000\n");
  write(root / "intel-rapl:0/max_energy_range_uj", "262143328850\n");
  write(root / "intel-rapl:0:0/energy_uj", "5\n");  // a sub-zone (core): inside the package
  write(root / "intel-rapl:1/name", "package-1\n");
  write(root / "intel-rapl:1/energy_uj", "262143000000\n");  // about to wrap
  write(root / "intel-rapl:1/max_energy_range_uj", "262143328850\n");
  const fs::path proc = test::tempPath("powercap_proc");
  fs::remove_all(proc);
  const auto stat = [&](double busy_ticks) {
    write(proc / "stat", "cpu  " + std::to_string(static_cast<long long>(busy_ticks)) +
                             " 0 0 100000 0 0 0 0 0 0\n");
  };
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  stat(0);
  PowerMeter::Options options;
  options.powercap_root = root.string();
  options.proc = proc.string();
  PowerMeter meter(options);
  EXPECT_EQ(meter.source(), "RAPL package-0,package-1 (shared by CPU time)");
  EXPECT_EQ(meter.sample().joules, 0);  // the first sample only starts the interval
  // 0.2 s of this process's CPU time; the machine's CPUs were busy 0.8 s in all; the packages
  // drew 30 J + 10 J (package-1 wrapped): this process gets a quarter, 10 J.
  burn(0.2);
  write(root / "intel-rapl:0/energy_uj", "31000000\n");
  write(root / "intel-rapl:1/energy_uj", std::to_string(10000000 - 328850) + "\n");
  stat(0.8 * ticks);
  const auto reading = meter.sample();
  EXPECT_NEAR(reading.joules, 40.0 * 0.2 / 0.8, 40.0 * 0.2 / 0.8 * 0.3);  // CPU time is coarse
  EXPECT_GT(reading.watts, 0);
}

TEST(PowerMeter, TheEmulatedSourceChargesItsWattsPerBusyCoreAndSaysItIsEmulated) {
  PowerMeter::Options options;
  options.powercap_root = test::tempPath("no_powercap");
  options.emulated_watts = 20;
  PowerMeter meter(options);
  EXPECT_EQ(meter.source(), "RAILSHARD_POWER_WATTS=20 W per busy core (emulated)");
  meter.sample();
  const auto start = std::chrono::steady_clock::now();
  burn(0.3);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // idle: costs nothing
  const auto reading = meter.sample();
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NEAR(reading.joules, 20 * 0.3, 20 * 0.3 * 0.25);
  EXPECT_NEAR(reading.watts, reading.joules / wall, 1e-9 + reading.watts * 0.05);
}

TEST(RankGroups, QuotasFollowTheSpeedsAndARealGroupThrottlesItsProcess) {
  EXPECT_THAT(coresForSpeeds({1, 2, 4}, 2), ::testing::ElementsAre(0.8 / 7, 1.6 / 7, 3.2 / 7));
  EXPECT_THAT(coresForSpeeds({1, 2}, 16), ::testing::ElementsAre(0.5, 1.0));  // one core at most
  EXPECT_THROW(coresForSpeeds({1, 0}, 2), InvalidArgument);
  EXPECT_THROW(coresForSpeeds({}, 2), InvalidArgument);
  const auto cpu = cgroup::locate("cpu");
  if (!cpu.found() || ::geteuid() != 0 || ::access(cpu.dir.c_str(), W_OK) != 0) {
    GTEST_SKIP() << "no writable cgroup cpu controller here (needs root and cgroup cpu)";
  }
  std::unique_ptr<RankGroups> groups;
  try {
    groups = std::make_unique<RankGroups>("cpu", 1, [](const cgroup::Location& group, size_t) {
      cgroup::setCpuQuota(group, 0.1, RankGroups::kPeriodUs);
    });
  } catch (const ConfigError& e) {
    GTEST_SKIP() << "cannot make CPU quota groups here: " << e.what();
  }
  // A child in the 0.1-core group burns for 0.5 s of wall time: about 0.05 s of CPU.
  const pid_t child = ::fork();
  if (child == 0) {
    std::ofstream(groups->procsFile(0)) << ::getpid();
    const auto start = std::chrono::steady_clock::now();
    volatile double x = 1;
    while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(500))
      x = x * 1.0000001;
    struct rusage usage {};
    ::getrusage(RUSAGE_SELF, &usage);
    const double cpu_seconds =
        static_cast<double>(usage.ru_utime.tv_sec) + usage.ru_utime.tv_usec / 1e6;
    // Exit status: CPU time in centiseconds (well under 256).
    ::_exit(static_cast<int>(std::lround(cpu_seconds * 100)));
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  const double cpu_seconds = WEXITSTATUS(status) / 100.0;
  EXPECT_GT(cpu_seconds, 0.02);
  EXPECT_LT(cpu_seconds, 0.12);  // far below the 0.5 s it would have had unthrottled
  const cgroup::Location group{fs::path(groups->procsFile(0)).parent_path().string(), cpu.mount,
                               cpu.v2};
  EXPECT_NEAR(cgroup::cpuQuotaCores(group), 0.1, 1e-9);
  EXPECT_GT(cgroup::throttledSeconds(group), 0);
}

}  // namespace
}  // namespace railshard::launcher
