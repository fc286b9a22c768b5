// Communicator::grow() and Communicator::join() in one process: member and joiner ranks are
// threads over one MemoryStore, connected by real TCP sockets on loopback. Results are checked
// against scalar sums of what every rank contributed; errors by type and message.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/memory_store.h"
#include "core/communicator.h"
#include "tests/test_util.h"

namespace railshard {
namespace {

using std::chrono::milliseconds;

Config testConfig(const std::string& token = "job-token") {
  Config config;
  config.timeout = std::chrono::seconds(30);
  config.connect_timeout = std::chrono::seconds(10);
  config.token = token;
  return config;
}

Communicator::Options memberOptions(const std::shared_ptr<MemoryStore>& store, int rank, int size) {
  Communicator::Options options;
  options.rank = rank;
  options.size = size;
  options.config = testConfig();
  options.store = store;
  return options;
}

Communicator::Options joinerOptions(const std::shared_ptr<MemoryStore>& store,
                                    const std::string& token = "job-token") {
  Communicator::Options options;
  options.config = testConfig(token);
  options.store = store;
  return options;
}

// Waits (bounded) until `count` joiners have asked, so a grow() sees all of them.
void awaitJoiners(MemoryStore& store, int count) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (store.add("railshard/joiners", 0, std::chrono::seconds(1)) < count) {
    ASSERT_LT(std::chrono::steady_clock::now(), end) << "joiners did not ask in time";
    std::this_thread::sleep_for(milliseconds(5));
  }
  // Each request is written right after its ticket.
  for (int t = 1; t <= count; ++t) {
    store.wait({"railshard/joiner/" + std::to_string(t)}, std::chrono::seconds(10));
  }
}

// An all-reduce of 1000 floats (value world*1000 + i) and the step broadcast from rank 0,
// checked against the sum over `worlds`. Returns the step every rank got.
int64_t checkGroup(Communicator& comm, const std::vector<int>& worlds, int64_t step) {
  std::vector<float> data(1000);
  for (size_t i = 0; i < data.size(); ++i) {
    data[i] = static_cast<float>(comm.worldRank() * 1000 + static_cast<int>(i));
  }
  comm.allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
  for (size_t i = 0; i < data.size(); ++i) {
    float expected = 0;
    for (int world : worlds) expected += static_cast<float>(world * 1000 + static_cast<int>(i));
    EXPECT_EQ(data[i], expected) << "element " << i;
  }
  comm.broadcast(&step, 1, DataType::kInt64, 0);
  return step;
}

// Three members, two joiners asking one after the other: every rank gets the same group of
// five, members first in their order, joiners in the order they asked; rank 0 hands the
// joiners the current step; the old communicator refuses further use.
TEST(Grow, TwoJoinersAreAdmittedInTheOrderTheyAsked) {
  auto store = std::make_shared<MemoryStore>();
  const std::vector<int> worlds = {0, 1, 2, 3, 4};
  std::vector<std::future<void>> joiners;
  for (int j = 0; j < 2; ++j) {
    joiners.push_back(std::async(std::launch::async, [&, j] {
      auto comm = Communicator::join(joinerOptions(store), milliseconds(30000));
      EXPECT_EQ(comm->size(), 5);
      EXPECT_EQ(comm->rank(), 3 + j);
      EXPECT_EQ(comm->worldRank(), 3 + j);
      EXPECT_EQ(comm->worldRanks(), worlds);
      EXPECT_EQ(comm->generation(), 1);
      EXPECT_EQ(comm->launchRanks(), 5);
      EXPECT_EQ(checkGroup(*comm, worlds, -1), 12);  // the members' step, not its own
      EXPECT_EQ(comm->joinersWaiting(), 0);          // collective: the joiners take part
    }));
    awaitJoiners(*store, j + 1);  // the second asks after the first
  }
  auto errors = test::runRanks(3, [&](int rank) {
    auto comm = Communicator::create(*store, memberOptions(store, rank, 3));
    EXPECT_EQ(comm->joinersWaiting(), 2);
    auto grown = comm->grow(milliseconds(20000));
    EXPECT_EQ(grown->size(), 5);
    EXPECT_EQ(grown->rank(), rank);
    EXPECT_EQ(grown->generation(), 1);
    EXPECT_EQ(grown->worldRanks(), worlds);
    EXPECT_EQ(checkGroup(*grown, worlds, 12), 12);
    EXPECT_EQ(grown->joinersWaiting(), 0);
    int64_t value = 0;
    try {
      comm->allreduce(&value, 1, DataType::kInt64, ReduceOp::kSum);
      ADD_FAILURE() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("(generation 0) was grown; use the communicator "
                                           "grow() returned"),
                std::string::npos)
          << e.what();
    }
  });
  for (auto& joiner : joiners) joiner.get();
  test::rethrowFirst(errors);
}

// Shrink, then grow: launch rank 3 is lost (its mark in the store, as railshard-launch writes
// it), the three survivors form generation 1, and the joiner that replaces it gets launch rank
// 4 -- never the lost one's number -- in generation 2.
TEST(Grow, AfterAShrinkTheJoinerGetsAFreshLaunchRank) {
  auto store = std::make_shared<MemoryStore>();
  const std::vector<int> worlds = {0, 1, 2, 4};
  std::atomic<int> shrunk{0};
  auto joiner = std::async(std::launch::async, [&] {
    while (shrunk.load() < 3) std::this_thread::sleep_for(milliseconds(5));
    auto comm = Communicator::join(joinerOptions(store), milliseconds(30000));
    EXPECT_EQ(comm->rank(), 3);
    EXPECT_EQ(comm->worldRank(), 4);
    EXPECT_EQ(comm->generation(), 2);
    EXPECT_EQ(checkGroup(*comm, worlds, -1), 7);
  });
  auto errors = test::runRanks(4, [&](int rank) {
    auto comm = Communicator::create(*store, memberOptions(store, rank, 4));
    if (rank == 3) {
      store->setString("railshard/lost/3", "killed by the test", std::chrono::seconds(1));
      return;
    }
    auto survivors = comm->shrink(milliseconds(20000));
    EXPECT_EQ(survivors->worldRanks(), (std::vector<int>{0, 1, 2}));
    ++shrunk;
    while (survivors->joinersWaiting() == 0) std::this_thread::sleep_for(milliseconds(5));
    auto grown = survivors->grow(milliseconds(20000));
    EXPECT_EQ(grown->size(), 4);
    EXPECT_EQ(grown->generation(), 2);
    EXPECT_EQ(grown->worldRanks(), worlds);
    EXPECT_EQ(grown->launchRanks(), 5);
    EXPECT_EQ(checkGroup(*grown, worlds, 7), 7);
  });
  joiner.get();
  test::rethrowFirst(errors);
}

// A joiner with another job's token is refused (InvalidArgument at the joiner, naming the
// token) while one with the right token asking in the same round is admitted.
TEST(Grow, AJoinerWithAWrongTokenIsRefusedAndTheOthersGoOn) {
  auto store = std::make_shared<MemoryStore>();
  auto wrong = std::async(std::launch::async, [&] {
    try {
      Communicator::join(joinerOptions(store, "other-job"), milliseconds(30000));
      ADD_FAILURE() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "join: the members of 'railshard' refused ticket 1: its job token "
                    "(RAILSHARD_TOKEN) does not match the job's"),
                std::string::npos)
          << e.what();
      EXPECT_EQ(std::string(e.what()).find("other-job"), std::string::npos) << e.what();
    }
  });
  awaitJoiners(*store, 1);
  auto right = std::async(std::launch::async, [&] {
    auto comm = Communicator::join(joinerOptions(store), milliseconds(30000));
    EXPECT_EQ(comm->worldRanks(), (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(checkGroup(*comm, {0, 1, 2}, -1), 3);
  });
  awaitJoiners(*store, 2);
  auto errors = test::runRanks(2, [&](int rank) {
    auto comm = Communicator::create(*store, memberOptions(store, rank, 2));
    auto grown = comm->grow(milliseconds(20000));
    EXPECT_EQ(grown->worldRanks(), (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(checkGroup(*grown, {0, 1, 2}, 3), 3);
  });
  wrong.get();
  right.get();
  test::rethrowFirst(errors);
}

// A joiner nobody grows for times out and withdraws: the grow() after it neither waits for
// nor admits it, and spends no launch rank on it.
TEST(Grow, AJoinerThatTimedOutIsNotAdmittedLater) {
  auto store = std::make_shared<MemoryStore>();
  try {
    Communicator::join(joinerOptions(store), milliseconds(300));
    ADD_FAILURE() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("join: no grow() of the job 'railshard' admitted this "
                                         "joiner within 300 ms (ticket 1; withdrawn)"),
              std::string::npos)
        << e.what();
  }
  auto errors = test::runRanks(2, [&](int rank) {
    auto comm = Communicator::create(*store, memberOptions(store, rank, 2));
    EXPECT_EQ(comm->joinersWaiting(), 1);  // counted until a grow() looks
    auto grown = comm->grow(milliseconds(20000));
    EXPECT_EQ(grown->worldRanks(), (std::vector<int>{0, 1}));
    EXPECT_EQ(grown->launchRanks(), 2);
    EXPECT_EQ(grown->joinersWaiting(), 0);
    EXPECT_EQ(checkGroup(*grown, {0, 1}, 5), 5);
  });
  test::rethrowFirst(errors);
}

// A job whose members all closed their communicators is over: a joiner waiting for it is
// turned away when the last member closes, and one that asks afterwards at once -- each well
// before its timeout -- instead of waiting out RAILSHARD_TIMEOUT (a rank the launcher
// restarted just as the job ended). Only with a store that outlives the ranks
// (store_external): no other store can have joiners.
TEST(Grow, JoinersAreTurnedAwayOnceEveryMemberClosed) {
  auto store = std::make_shared<MemoryStore>();
  const auto refusedFast = [&](const std::string& why) {
    const auto start = std::chrono::steady_clock::now();
    try {
      Communicator::join(joinerOptions(store), milliseconds(60000));
      ADD_FAILURE() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  };
  auto waiting = std::async(std::launch::async, [&] {
    refusedFast(
        "join: the members of 'railshard' refused ticket 1: the job finished (every member of "
        "generation 0 closed) before it was admitted");
  });
  awaitJoiners(*store, 1);
  std::atomic<bool> first_closed{false};
  auto errors = test::runRanks(2, [&](int rank) {
    Communicator::Options options = memberOptions(store, rank, 2);
    options.config.store_external = true;
    auto comm = Communicator::create(*store, options);
    EXPECT_EQ(checkGroup(*comm, {0, 1}, 7), 7);
    if (rank == 0) {
      comm.reset();
      first_closed = true;
      return;
    }
    while (!first_closed) std::this_thread::sleep_for(milliseconds(1));
    // One member closing is not the end of the job.
    EXPECT_EQ(store->add("railshard/finished", 0, std::chrono::seconds(1)), 0);
  });
  test::rethrowFirst(errors);
  waiting.get();
  refusedFast(
      "join: the members of 'railshard' refused ticket 2: the job finished before it was "
      "admitted");
  // With a store the ranks host, nothing is marked at all.
  auto other = std::make_shared<MemoryStore>();
  test::rethrowFirst(test::runRanks(2, [&](int rank) {
    auto comm = Communicator::create(*other, memberOptions(other, rank, 2));
  }));
  EXPECT_EQ(other->add("railshard/finished", 0, std::chrono::seconds(1)), 0);
}

// A joiner that dies after asking (its request is in the store, the process is gone: here it
// never existed) is admitted, and the new generation cannot connect to it; the members then
// re-form among themselves in the next generation and go on, on every member, within the
// connect timeout and the round's deadline.
TEST(Grow, AJoinerThatDiesAfterAskingLeavesTheMembersInTheNextGeneration) {
  auto store = std::make_shared<MemoryStore>();
  const int64_t ticket = store->add("railshard/joiners", 1, std::chrono::seconds(1));
  store->setString("railshard/joiner/" + std::to_string(ticket), "job-token\nvanished-host",
                   std::chrono::seconds(1));
  auto errors = test::runRanks(3, [&](int rank) {
    auto options = memberOptions(store, rank, 3);
    options.config.connect_timeout = std::chrono::seconds(2);
    auto comm = Communicator::create(*store, options);
    const auto start = std::chrono::steady_clock::now();
    auto grown = comm->grow(milliseconds(10000));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
    EXPECT_EQ(grown->generation(), 2);
    EXPECT_EQ(grown->worldRanks(), (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(grown->launchRanks(), 4);  // launch rank 3 was spent on the dead joiner
    EXPECT_EQ(checkGroup(*grown, {0, 1, 2}, 9), 9);
  });
  test::rethrowFirst(errors);
}

// A member that never calls grow() (it hangs, or died unseen) is left out by the round's
// deadline, as shrink() leaves it out; the others and the joiner form the new generation.
TEST(Grow, AMemberThatDoesNotComeIsLeftOutAndTheJoinerStillJoins) {
  auto store = std::make_shared<MemoryStore>();
  auto joiner = std::async(std::launch::async, [&] {
    auto comm = Communicator::join(joinerOptions(store), milliseconds(30000));
    EXPECT_EQ(comm->worldRanks(), (std::vector<int>{0, 2, 3}));
    EXPECT_EQ(checkGroup(*comm, {0, 2, 3}, -1), 4);
  });
  awaitJoiners(*store, 1);
  std::promise<void> done;
  auto released = done.get_future().share();
  auto errors = test::runRanks(3, [&](int rank) {
    auto comm = Communicator::create(*store, memberOptions(store, rank, 3));
    if (rank == 1) {  // stays away until the others are through
      released.wait();
      return;
    }
    auto grown = comm->grow(milliseconds(1500));
    EXPECT_EQ(grown->worldRanks(), (std::vector<int>{0, 2, 3}));
    EXPECT_EQ(checkGroup(*grown, {0, 2, 3}, 4), 4);
    if (rank == 0) done.set_value();
  });
  joiner.get();
  test::rethrowFirst(errors);
}

// This process's resident set (/proc/self/statm, in pages).
size_t residentBytes() {
  std::ifstream statm("/proc/self/statm");
  size_t size = 0;
  size_t resident = 0;
  statm >> size >> resident;
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

size_t entriesIn(const char* dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

// Twenty cycles of grow (a joiner comes) and shrink (it leaves, marked lost): every
// generation's sums exact, and the process's open descriptors and /dev/shm entries the same
// after the last cycle as after the first (old generations' sockets and segments released),
// its resident memory within allocator slack of what it was.
TEST(Grow, TwentyGrowShrinkCyclesLeaveNoDescriptorsOrSegmentsBehind) {
  auto store = std::make_shared<MemoryStore>();
  constexpr int kCycles = 20;
  size_t fds_after_first = 0;
  size_t shm_after_first = 0;
  std::atomic<int> done{0};      // member cycles finished
  std::atomic<int> released{0};  // joiner communicators destroyed
  auto joiners = std::async(std::launch::async, [&] {
    for (int cycle = 0; cycle < kCycles; ++cycle) {
      {
        auto comm = Communicator::join(joinerOptions(store), milliseconds(30000));
        const std::vector<int> worlds = {0, 1, 2, 3 + cycle};
        EXPECT_EQ(comm->worldRanks(), worlds);
        EXPECT_EQ(checkGroup(*comm, worlds, -1), cycle);
        store->setString("railshard/lost/" + std::to_string(comm->worldRank()), "left the test",
                         std::chrono::seconds(1));
        while (done.load() < 3 * (cycle + 1)) std::this_thread::sleep_for(milliseconds(1));
      }
      ++released;
    }
  });
  // Rank 0, once the joiner of `cycle` is gone: what the process holds open, and its
  // resident memory then.
  size_t rss_after_first = 0;
  size_t rss_after_last = 0;
  const auto settled = [&](int cycle) {
    while (released.load() < cycle + 1) std::this_thread::sleep_for(milliseconds(1));
    (cycle == 0 ? rss_after_first : rss_after_last) = residentBytes();
    return std::make_pair(entriesIn("/proc/self/fd"), entriesIn("/dev/shm"));
  };
  auto errors = test::runRanks(3, [&](int rank) {
    auto comm = Communicator::create(*store, memberOptions(store, rank, 3));
    for (int cycle = 0; cycle < kCycles; ++cycle) {
      while (comm->joinersWaiting() == 0) std::this_thread::sleep_for(milliseconds(1));
      comm = comm->grow(milliseconds(20000));
      ASSERT_EQ(comm->size(), 4);
      EXPECT_EQ(checkGroup(*comm, {0, 1, 2, 3 + cycle}, cycle), cycle);
      comm = comm->shrink(milliseconds(20000));
      ASSERT_EQ(comm->worldRanks(), (std::vector<int>{0, 1, 2}));
      EXPECT_EQ(checkGroup(*comm, {0, 1, 2}, cycle), cycle);
      ++done;
      if (rank == 0 && cycle == 0) std::tie(fds_after_first, shm_after_first) = settled(0);
      comm->barrier();  // the others wait for the count: it sees the same ranks' files
    }
    EXPECT_EQ(comm->generation(), 2 * kCycles);
    EXPECT_EQ(comm->launchRanks(), 3 + kCycles);
    if (rank == 0) {
      EXPECT_EQ(settled(kCycles - 1), std::make_pair(fds_after_first, shm_after_first));
    }
    comm->barrier();
  });
  joiners.get();
  test::rethrowFirst(errors);
  // Flat, up to allocator slack: one generation's buffers and threads kept alive per cycle
  // would be tens of MiB over twenty cycles.
  std::printf("resident memory after cycle 1: %.1f MiB, after cycle %d: %.1f MiB\n",
              static_cast<double>(rss_after_first) / (1 << 20), kCycles,
              static_cast<double>(rss_after_last) / (1 << 20));
  if (!test::kSanitized) {
    EXPECT_LT(rss_after_last, rss_after_first + (size_t{8} << 20));
  }
}

TEST(Grow, BadArgumentsAreInvalidArgument) {
  Communicator::Options options;
  try {
    Communicator::join(options, milliseconds(100));
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("join: Options::store is null"), std::string::npos)
        << e.what();
  }
  options.store = std::make_shared<MemoryStore>();
  try {
    Communicator::join(options, milliseconds(0));
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("join: timeout must be positive, got 0 ms"),
              std::string::npos)
        << e.what();
  }
  MemoryStore store;
  auto errors = test::runRanks(2, [&](int rank) {
    Communicator::Options member;
    member.rank = rank;
    member.size = 2;
    member.config = testConfig();
    auto comm = Communicator::create(store, member);  // no Options::store
    try {
      comm->grow();
      ADD_FAILURE() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("grow: this communicator has no store"),
                std::string::npos)
          << e.what();
    }
  });
  test::rethrowFirst(errors);
}

}  // namespace
}  // namespace railshard
