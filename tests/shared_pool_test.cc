// transport/links/shm/shared_pool.h: regions kept for reuse keep their serial (so the peers'
// mappings stay valid), the pool never keeps more than was live at its peak, and a forked child
// gets copy-on-write copies that it cannot offer to peers (shared_buffers.cc's fork handlers).
#include "transport/links/shm/shared_pool.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "base/error.h"
#include "transport/links/shm/shared_buffers.h"

namespace railshard::transport::links::shm {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(SharedPool, ReusesAFreedRegionWithItsSerial) {
  SharedPool pool;
  void* a = pool.take(3 * kMiB + 5);
  const SharedRef ref = findShared(a, 3 * kMiB + 5);
  ASSERT_NE(ref.serial, 0u);
  EXPECT_EQ(ref.region_bytes, 3 * kMiB + static_cast<size_t>(::sysconf(_SC_PAGESIZE)));
  std::memset(a, 7, 3 * kMiB);
  pool.give(a);
  EXPECT_FALSE(pool.owns(a));
  // A size within a quarter of the kept region's: the same region, the same serial.
  void* b = pool.take(3 * kMiB);
  EXPECT_EQ(b, a);
  EXPECT_EQ(findShared(b, 3 * kMiB).serial, ref.serial);
  EXPECT_EQ(static_cast<uint8_t*>(b)[12345], 7) << "a reused region is not cleared";
  // More than a quarter smaller: a new region.
  void* c = pool.take(kMiB);
  EXPECT_NE(c, a);
  const SharedPool::Stats stats = pool.stats();
  EXPECT_EQ(stats.taken, 3u);
  EXPECT_EQ(stats.reused, 1u);
  EXPECT_EQ(stats.live_regions, 2u);
  EXPECT_EQ(stats.live_bytes, ref.region_bytes + kMiB);
  EXPECT_EQ(stats.kept_regions, 0u);
  pool.give(b);
  pool.give(c);
  EXPECT_EQ(pool.stats().kept_bytes, ref.region_bytes + kMiB);
  pool.releaseKept();
  EXPECT_EQ(pool.stats().kept_bytes, 0u);
  EXPECT_EQ(findShared(a, 1).serial, 0u) << "released: no longer a region";
}

TEST(SharedPool, KeepsNoMoreThanThePeakOfLiveBytes) {
  SharedPool pool;
  void* a = pool.take(4 * kMiB);
  void* b = pool.take(4 * kMiB);
  pool.give(a);
  pool.give(b);                      // kept: 8 MiB, the peak
  void* big = pool.take(16 * kMiB);  // peak now 16 MiB: nothing kept fits it
  pool.give(big);                    // 8 + 16 > 16: released, not kept
  const SharedPool::Stats stats = pool.stats();
  EXPECT_EQ(stats.peak_live_bytes, 16 * kMiB);
  EXPECT_EQ(stats.kept_bytes, 8 * kMiB);
  EXPECT_EQ(stats.kept_regions, 2u);
  EXPECT_EQ(findShared(big, 1).serial, 0u);
}

TEST(SharedPool, RefusesWhatItDidNotHandOut) {
  SharedPool pool;
  int local = 0;
  try {
    pool.give(&local);
    FAIL() << "no InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("is not a region this pool handed out"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(pool.take(0), InvalidArgument);
}

TEST(SharedPool, AForkedChildWritesItsOwnCopy) {
  SharedPool pool;
  auto* data = static_cast<uint8_t*>(pool.take(2 * kMiB));
  std::memset(data, 1, 2 * kMiB);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // What the child saw at the fork, then its own writes; its regions are not offered.
    char report[3] = {static_cast<char>(data[100]), 0, 0};
    std::memset(data, 9, 2 * kMiB);
    report[1] = static_cast<char>(findShared(data, 2 * kMiB).serial == 0 ? 1 : 0);
    // A region the child makes itself is shared as usual.
    report[2] = static_cast<char>(findShared(allocateShared(4096), 4096).serial != 0 ? 1 : 0);
    (void)!::write(pipe_fds[1], report, sizeof(report));
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  char report[3] = {};
  ASSERT_EQ(::read(pipe_fds[0], report, sizeof(report)), 3);
  ::close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(report[0], 1) << "the child sees the parent's bytes";
  EXPECT_EQ(report[1], 1) << "the child's copy is not offered to peers";
  EXPECT_EQ(report[2], 1) << "the child's own regions are shared";
  for (size_t i = 0; i < 2 * kMiB; i += 4096) {
    ASSERT_EQ(data[i], 1) << "the child's write reached the parent at byte " << i;
  }
  EXPECT_NE(findShared(data, 2 * kMiB).serial, 0u);
  pool.give(data);
}

}  // namespace
}  // namespace railshard::transport::links::shm
