// The dispatcher across Communicator::grow(): its state as bytes (StateCodec) and, over real
// communicators (threads over one MemoryStore, TCP on loopback, as grow_test.cc), members'
// admit() with joiners' joined(). The books are the ranges each rank itself processed and
// committed, counted per sample against [0, epoch): every sample exactly once.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/memory_store.h"
#include "core/communicator.h"
#include "core/dispatch/collective_dispatcher.h"
#include "core/dispatch/state_codec.h"
#include "tests/test_util.h"

namespace railshard::dispatch {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

// ---- the state as bytes ----

// Drives a state through a step: plan, reports at `speeds` (samples/s), commit.
void step(ElasticState& s, const std::vector<double>& speeds, size_t batch) {
  std::vector<RankReport> reports(static_cast<size_t>(s.dispatcher().worldSize()));
  if (s.dispatcher().stepOpen()) {
    const StepPlan& open = s.dispatcher().current();
    for (size_t r = 0; r < reports.size(); ++r) {
      reports[r].samples = static_cast<double>(open.samples[r]);
      reports[r].seconds = static_cast<double>(open.samples[r]) / speeds[r];
      reports[r].load.queued_samples = static_cast<double>(r);
    }
  }
  s.advance(batch, reports);
  s.commit();
}

TEST(StateCodec, ACopyHoldsEveryFieldAndPlansAlikeFromThenOn) {
  DispatchOptions options;
  options.micro_batch = 4;
  options.estimator.half_life_steps = 3;
  ElasticState original(3, 1000, options);
  const std::vector<double> speeds = {100, 200, 400, 300};
  for (int i = 0; i < 3; ++i) step(original, speeds, 120);
  original.addRank(1);  // a grown dispatcher: more ranks than options.weights would say
  step(original, speeds, 120);

  const std::vector<uint8_t> bytes = StateCodec::encode(original, {0, 1, 2, 7});
  StateCodec::Decoded decoded = StateCodec::decode(bytes);
  EXPECT_EQ(decoded.launch_ranks, (std::vector<int>{0, 1, 2, 7}));
  ElasticState& copy = decoded.state;
  EXPECT_EQ(copy.fingerprint(), original.fingerprint());
  EXPECT_EQ(copy.committed(), original.committed());
  EXPECT_EQ(copy.dispatcher().worldSize(), 4);
  EXPECT_EQ(copy.dispatcher().options().estimator.half_life_steps, 3);
  EXPECT_EQ(StateCodec::encode(copy, {0, 1, 2, 7}), bytes);  // nothing lost on the way
  // The copy goes on exactly as the original, across an epoch boundary.
  for (int i = 0; i < 8; ++i) {
    step(original, speeds, 120);
    step(copy, speeds, 120);
    ASSERT_EQ(copy.dispatcher().current().fingerprint(),
              original.dispatcher().current().fingerprint())
        << "step " << i;
    ASSERT_EQ(copy.fingerprint(), original.fingerprint());
  }
  EXPECT_EQ(copy.dispatcher().epoch(), 1u);
}

TEST(StateCodec, ShortLongOrImpossibleBytesAreProtocolErrorsNamingTheField) {
  ElasticState state(2, 100, DispatchOptions{});
  step(state, {1, 1}, 10);
  const std::vector<uint8_t> bytes = StateCodec::encode(state);
  const auto fails = [](std::vector<uint8_t> b, const std::string& says) {
    try {
      StateCodec::decode(b);
      ADD_FAILURE() << "expected ProtocolError: " << says;
    } catch (const ProtocolError& e) {
      EXPECT_THAT(e.what(), HasSubstr(says));
    }
  };
  fails(std::vector<uint8_t>(bytes.begin(), bytes.end() - 1), "truncated at launch ranks");
  fails(std::vector<uint8_t>(bytes.begin(), bytes.end() - 9), "truncated at redo");
  fails({}, "truncated at policy");
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  fails(longer, "1 bytes left over after the last field");
  // Byte 24 is the count of weights (after policy, micro_batch, min_micro_batches).
  std::vector<uint8_t> huge = bytes;
  for (size_t i = 24; i < 32; ++i) huge[i] = 0xff;
  fails(huge, "weights count 18446744073709551615 exceeds the");
  std::vector<uint8_t> policy = bytes;
  policy[0] = 9;
  fails(policy, "policy 9 is not one");
}

// ---- over real communicators ----

Config testConfig() {
  Config config;
  config.timeout = std::chrono::seconds(30);
  config.connect_timeout = std::chrono::seconds(10);
  config.token = "grow-dispatch";
  return config;
}

std::unique_ptr<Communicator> member(const std::shared_ptr<MemoryStore>& store, int rank,
                                     int size) {
  Communicator::Options options;
  options.rank = rank;
  options.size = size;
  options.config = testConfig();
  options.store = store;
  return Communicator::create(*store, options);
}

std::unique_ptr<Communicator> joiner(const std::shared_ptr<MemoryStore>& store) {
  Communicator::Options options;
  options.config = testConfig();
  options.store = store;
  return Communicator::join(options, milliseconds(30000));
}

void awaitJoiner(Communicator& comm) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (comm.joinersWaiting() == 0) {
    ASSERT_LT(std::chrono::steady_clock::now(), end) << "the joiner did not ask in time";
    std::this_thread::sleep_for(milliseconds(5));
  }
}

// The same without a collective, for a group one member stays away from: the store's count.
void awaitJoinerInStore(MemoryStore& store) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (store.add("railshard/joiners", 0, std::chrono::seconds(1)) < 1) {
    ASSERT_LT(std::chrono::steady_clock::now(), end) << "the joiner did not ask in time";
    std::this_thread::sleep_for(milliseconds(5));
  }
  store.wait({"railshard/joiner/1"}, std::chrono::seconds(10));
}

DispatchOptions options() {
  DispatchOptions o;
  o.micro_batch = 4;
  return o;
}

constexpr uint64_t kEpoch = 3000;
constexpr size_t kBatch = 280;

// What the ranks processed and committed, and the plans they ran, by step.
struct Books {
  std::mutex mutex;
  std::vector<int> count = std::vector<int>(kEpoch, 0);
  std::map<uint64_t, std::vector<uint64_t>> fingerprints;  // step -> each rank's plan
  std::map<uint64_t, std::map<int, size_t>> shares;        // step -> launch rank -> samples

  void commit(const CollectiveDispatcher& d, int launch_rank) {
    std::lock_guard lock(mutex);
    for (const Range& r : d.myRanges()) {
      for (uint64_t i = r.begin; i < r.end; ++i) ++count[i];
    }
    fingerprints[d.plan().step].push_back(d.plan().fingerprint());
    shares[d.plan().step][launch_rank] = d.mySamples();
  }
  void expectEverySampleOnce() {
    for (uint64_t i = 0; i < kEpoch; ++i) ASSERT_EQ(count[i], 1) << "sample " << i;
  }
  void expectOnePlanPerStep() {
    for (const auto& [s, f] : fingerprints) {
      for (const uint64_t x : f) ASSERT_EQ(x, f[0]) << "step " << s;
    }
  }
};

// One step on this rank at `speed` samples/s (reported, not slept); false once the epoch's
// last step is done.
bool runStep(CollectiveDispatcher& d, Communicator& comm, double speed, Books& books) {
  d.nextStep(kBatch);
  const auto samples = static_cast<double>(d.mySamples());
  d.finishStep(samples, samples / speed);
  d.commitStep();
  books.commit(d, comm.worldRank());
  return !d.epochDone();
}

// Three members at 100, 200 and 400 samples/s run four steps; a joiner at 200 samples/s asks,
// the members grow() and admit() it, it takes the dispatcher with joined(). Its first share
// is the median's (rank 1's), then its own; every sample of the epoch is processed once.
TEST(DispatchGrow, AJoinerStartsAtTheMedianAndEverySampleIsProcessedOnce) {
  auto store = std::make_shared<MemoryStore>();
  Books books;
  uint64_t joined_at = 0;
  auto joining = std::async(std::launch::async, [&] {
    auto comm = joiner(store);
    CollectiveDispatcher d = CollectiveDispatcher::joined(*comm);
    EXPECT_EQ(d.myRank(), 3);
    joined_at = d.committedSteps();
    while (runStep(d, *comm, 200, books)) {
    }
  });
  auto errors = test::runRanks(3, [&](int rank) {
    auto comm = member(store, rank, 3);
    CollectiveDispatcher d(*comm, kEpoch, options());
    const double speed = 100.0 * (1 << rank);
    for (int s = 0; s < 4; ++s) runStep(d, *comm, speed, books);
    awaitJoiner(*comm);
    auto grown = comm->grow(milliseconds(20000));
    const CollectiveDispatcher::Admission admission = d.admit(*grown);
    EXPECT_EQ(admission.joined, std::vector<int>{3});
    EXPECT_FALSE(admission.recovery.has_value());
    while (runStep(d, *grown, speed, books)) {
    }
  });
  joining.get();
  test::rethrowFirst(errors);
  EXPECT_EQ(joined_at, 4u);
  books.expectEverySampleOnce();
  books.expectOnePlanPerStep();
  // Step 4: the joiner has no measurement yet and gets the median rate's share (rank 1's);
  // steps 5 on: its own rate, the same as rank 1's.
  ASSERT_GE(books.shares.size(), 7u);
  for (uint64_t s = 4; s < 7; ++s) {
    EXPECT_EQ(books.shares[s].size(), 4u) << "step " << s;
    EXPECT_GT(books.shares[s][3], 0u) << "step " << s;
    EXPECT_NEAR(static_cast<double>(books.shares[s][3]), static_cast<double>(books.shares[s][1]), 4)
        << "step " << s;
  }
  EXPECT_EQ(books.shares[3].count(3), 0u);  // nothing before it joined
}

// Shrink then grow: launch rank 2 is lost after committing step 2 (its mark in the store, as
// railshard-launch writes it); the survivors shrink() and recover(), then admit a joiner
// (launch rank 4). The lost rank's committed work stands, nothing is redone twice.
TEST(DispatchGrow, LostThenReplacedEverySampleStillOnce) {
  auto store = std::make_shared<MemoryStore>();
  Books books;
  std::atomic<int> shrunk{0};
  auto joining = std::async(std::launch::async, [&] {
    while (shrunk.load() < 3) std::this_thread::sleep_for(milliseconds(5));
    auto comm = joiner(store);
    EXPECT_EQ(comm->worldRank(), 4);
    CollectiveDispatcher d = CollectiveDispatcher::joined(*comm);
    EXPECT_EQ(d.myRank(), 4);  // the dispatcher keeps the lost rank's number too
    while (runStep(d, *comm, 100, books)) {
    }
  });
  auto errors = test::runRanks(4, [&](int rank) {
    auto comm = member(store, rank, 4);
    CollectiveDispatcher d(*comm, kEpoch, options());
    for (int s = 0; s < 3; ++s) runStep(d, *comm, 100, books);
    if (rank == 2) {
      store->setString("railshard/lost/2", "killed by the test", std::chrono::seconds(1));
      return;
    }
    auto survivors = comm->shrink(milliseconds(20000));
    const Recovery recovery = d.recover(*survivors);
    EXPECT_EQ(recovery.committed, 3u);
    EXPECT_FALSE(recovery.redo);
    ++shrunk;
    awaitJoiner(*survivors);
    auto grown = survivors->grow(milliseconds(20000));
    EXPECT_EQ(grown->worldRanks(), (std::vector<int>{0, 1, 3, 4}));
    EXPECT_EQ(d.admit(*grown).joined, std::vector<int>{4});
    while (runStep(d, *grown, 100, books)) {
    }
  });
  joining.get();
  test::rethrowFirst(errors);
  books.expectEverySampleOnce();
  books.expectOnePlanPerStep();
  // Step 2 was the lost rank's last; step 3, the first after the recovery, is the grown
  // group's (the survivors admit the joiner before running it).
  EXPECT_EQ(books.shares[2].count(2), 1u);
  EXPECT_EQ(books.shares[3].count(2), 0u);
  EXPECT_EQ(books.shares[3].count(4), 1u);
  EXPECT_EQ(books.shares[3].size(), 4u);
}

// A member that never comes to the grow (hung, or died unseen at the step boundary) is left
// out by grow(); admit() marks it failed as recover() would. Its committed steps stand.
TEST(DispatchGrow, AMemberLeftOutOfTheGrowIsMarkedFailedAndNothingIsLost) {
  auto store = std::make_shared<MemoryStore>();
  Books books;
  std::promise<void> done;
  auto released = done.get_future().share();
  auto joining = std::async(std::launch::async, [&] {
    auto comm = joiner(store);
    CollectiveDispatcher d = CollectiveDispatcher::joined(*comm);
    EXPECT_EQ(d.myRank(), 3);
    EXPECT_FALSE(d.dispatcher().alive(1));
    while (runStep(d, *comm, 100, books)) {
    }
  });
  auto errors = test::runRanks(3, [&](int rank) {
    auto comm = member(store, rank, 3);
    CollectiveDispatcher d(*comm, kEpoch, options());
    for (int s = 0; s < 2; ++s) runStep(d, *comm, 100, books);
    if (rank == 1) {  // stays away until the others are through
      released.wait();
      return;
    }
    awaitJoinerInStore(*store);
    auto grown = comm->grow(milliseconds(1500));
    const CollectiveDispatcher::Admission admission = d.admit(*grown);
    ASSERT_TRUE(admission.recovery.has_value());
    EXPECT_EQ(admission.recovery->failed, std::vector<int>{1});
    EXPECT_EQ(admission.recovery->committed, 2u);
    EXPECT_EQ(admission.joined, std::vector<int>{3});
    while (runStep(d, *grown, 100, books)) {
    }
    if (rank == 0) done.set_value();
  });
  joining.get();
  test::rethrowFirst(errors);
  books.expectEverySampleOnce();
  books.expectOnePlanPerStep();
}

// admit() between two steps on one member but not on another (here: a dispatcher that never
// ran a step) is refused on every rank, the joiner included, instead of leaving it waiting.
TEST(DispatchGrow, MembersAtDifferentStepsAreRefusedOnEveryRank) {
  auto store = std::make_shared<MemoryStore>();
  const auto refused = [](const std::function<void()>& f) {
    try {
      f();
      ADD_FAILURE() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("rank 1 has committed 0 steps, rank 0 2 (grow() and "
                                      "admit() go between two steps"));
    }
  };
  auto joining = std::async(std::launch::async, [&] {
    auto comm = joiner(store);
    refused([&] { CollectiveDispatcher::joined(*comm); });
  });
  auto errors = test::runRanks(2, [&](int rank) {
    auto comm = member(store, rank, 2);
    Books books;
    CollectiveDispatcher d(*comm, kEpoch, options());
    for (int s = 0; s < 2; ++s) runStep(d, *comm, 100, books);
    awaitJoiner(*comm);
    auto grown = comm->grow(milliseconds(20000));
    CollectiveDispatcher fresh(*comm, kEpoch, options());
    refused([&] { (rank == 1 ? fresh : d).admit(*grown); });
  });
  joining.get();
  test::rethrowFirst(errors);
}

}  // namespace
}  // namespace railshard::dispatch
