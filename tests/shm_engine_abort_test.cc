// The shared-memory engine's abort when two ranks fail at the same moment (both see a
// mismatch, each with its own text): the segment ends up with one rank's message, whole, and
// both raise that one. Without the claim this failed within a few hundred rounds (the texts
// interleaved, "bbbbaaaa..."). Ranks are threads of this process, each with its own mapping
// of one real segment; two of them, as this machine has two cores to run them at once.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "core/collectives/shm_engine.h"
#include "transport/links/shm/shm_segment.h"
#include "transport/messaging/failure_state.h"

namespace railshard::collectives {
namespace {

using transport::links::shm::ShmSegment;

TEST(ShmEngineAbort, RanksThatAbortTogetherLeaveOneWholeMessage) {
  constexpr int kRanks = 2;
  constexpr int kRounds = 2000;
  for (int round = 0; round < kRounds; ++round) {
    const std::string name = ShmSegment::makeName();
    std::vector<std::unique_ptr<ShmEngine>> engines;
    {
      auto created = ShmSegment::create(name, kRanks, 4096);
      std::vector<std::unique_ptr<ShmSegment>> segments;
      segments.push_back(std::move(created));
      for (int r = 1; r < kRanks; ++r) segments.push_back(ShmSegment::attach(name, kRanks, 4096));
      segments[0]->unlink();
      for (int r = 0; r < kRanks; ++r) {
        engines.push_back(std::make_unique<ShmEngine>(std::move(segments[static_cast<size_t>(r)]),
                                                      r, kRanks, std::chrono::seconds(10),
                                                      std::chrono::microseconds(0)));
      }
    }
    // Texts of one length, differing all along, as two ranks' mismatch reports do.
    auto text = [](int r) { return std::string(2000, static_cast<char>('a' + r)); };
    std::atomic<int> ready{0};
    std::vector<std::string> raised(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r] {
        ready.fetch_add(1);
        while (ready.load() < kRanks) {
        }
        engines[static_cast<size_t>(r)]->abort(ErrorKind::kMismatch, text(r));
        try {
          engines[static_cast<size_t>(r)]->barrier(transport::MessageTag{});
        } catch (const MismatchError& e) {
          raised[static_cast<size_t>(r)] = e.what();
        } catch (const std::exception& e) {
          raised[static_cast<size_t>(r)] = std::string("wrong type: ") + e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    // Every rank raised one rank's text whole (plus "[reported by rank N]" where not its own).
    const std::string first = raised[0].substr(0, 2000);
    bool whole = false;
    for (int r = 0; r < kRanks; ++r) whole = whole || first == text(r);
    ASSERT_TRUE(whole) << "round " << round << ": " << raised[0].substr(0, 80) << "...";
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_EQ(raised[static_cast<size_t>(r)].substr(0, 2000), first)
          << "round " << round << " rank " << r;
    }
  }
}

// A rank that aborts the segment because it lost a peer says which: the host's other ranks,
// which have no connection of their own to that peer (none over TCP inside a host), record it
// lost in their group's state, so their errors name it and shrink() drops it. Group ranks 3
// and 5 here, the lost one 7. (A CI run raised, on two ranks of four, "lost a peer" with no
// name: the abort they woke to carried only the text.)
TEST(ShmEngineAbort, TheLostRankAnAbortNamesIsRecordedLostByTheHostsOtherRanks) {
  const std::string name = ShmSegment::makeName();
  auto created = ShmSegment::create(name, 2, 4096);
  auto attached = ShmSegment::attach(name, 2, 4096);
  created->unlink();
  const std::vector<int> names = {3, 5};
  ShmEngine first(std::move(created), 0, 2, std::chrono::seconds(10), std::chrono::microseconds(0),
                  names);
  ShmEngine second(std::move(attached), 1, 2, std::chrono::seconds(10),
                   std::chrono::microseconds(0), names);
  transport::messaging::FailureState first_state(3);
  transport::messaging::FailureState second_state(5);
  first.setFailure(&first_state);
  second.setFailure(&second_state);
  first.abort(ErrorKind::kPeerLost, "rank 3: lost rank 7: its process exited", 7);
  for (auto* engine : {&first, &second}) {
    try {
      engine->barrier(transport::MessageTag{});
      ADD_FAILURE() << "the barrier of an aborted segment returned";
    } catch (const PeerLostError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 3: lost rank 7: its process exited"),
                std::string::npos)
          << e.what();
    }
  }
  for (const auto* state : {&first_state, &second_state}) {
    const auto lost = state->lostPeers();
    ASSERT_EQ(lost.size(), 1u);
    EXPECT_EQ(lost[0].rank, 7);
    EXPECT_NE(lost[0].reason.find("its process exited"), std::string::npos) << lost[0].reason;
  }
  EXPECT_NE(std::string(second_state.lostPeers()[0].reason).find("[reported by rank 3]"),
            std::string::npos);
}

}  // namespace
}  // namespace railshard::collectives
