// HierarchyPlan: the two-level layout of the hierarchical all-reduce (NCCL inside a host,
// railshard between hosts), computed from the host of every rank; and the collective choice
// HierarchicalAllreduce::create makes from it (every rank the same answer).
#include "core/hierarchy_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/memory_store.h"
#include "core/hierarchical_allreduce.h"
#include "kernels/cuda/device_runtime.h"
#include "tests/test_util.h"

namespace railshard {
namespace {

std::vector<std::string> twoHostsOfFour() {
  return {"a", "a", "a", "a", "b", "b", "b", "b"};
}

TEST(HierarchyPlan, TwoHostsOfFourRanks) {
  const auto hosts = twoHostsOfFour();
  for (int rank = 0; rank < 8; ++rank) {
    const HierarchyPlan plan = HierarchyPlan::make(hosts, rank);
    EXPECT_TRUE(plan.usable) << plan.reason;
    EXPECT_EQ(plan.rank, rank);
    EXPECT_EQ(plan.node_hosts, (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(plan.node_of_rank, (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
    EXPECT_EQ(plan.node, rank / 4);
    EXPECT_EQ(plan.local_rank, rank % 4);
    EXPECT_EQ(plan.localSize(), 4);
    EXPECT_EQ(plan.numNodes(), 2);
    const std::vector<int> local =
        rank < 4 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{4, 5, 6, 7};
    EXPECT_EQ(plan.local_ranks, local);
    EXPECT_EQ(plan.cross_ranks, (std::vector<int>{rank % 4, rank % 4 + 4}));
  }
}

TEST(HierarchyPlan, InterleavedPlacementKeepsRankOrderInsideHosts) {
  // Round-robin placement (mpirun --map-by node): ranks alternate between hosts, and the
  // host seen first (rank 0's) is node 0 even when it is not first alphabetically.
  const std::vector<std::string> hosts = {"zeta", "alpha", "zeta", "alpha", "zeta", "alpha"};
  const HierarchyPlan plan = HierarchyPlan::make(hosts, 3);
  EXPECT_TRUE(plan.usable) << plan.reason;
  EXPECT_EQ(plan.node_hosts, (std::vector<std::string>{"zeta", "alpha"}));
  EXPECT_EQ(plan.node_of_rank, (std::vector<int>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(plan.node, 1);
  EXPECT_EQ(plan.local_ranks, (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(plan.local_rank, 1);
  EXPECT_EQ(plan.cross_ranks, (std::vector<int>{2, 3}));  // local rank 1 on zeta, on alpha

  const HierarchyPlan first = HierarchyPlan::make(hosts, 4);
  EXPECT_EQ(first.local_ranks, (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(first.local_rank, 2);
  EXPECT_EQ(first.cross_ranks, (std::vector<int>{4, 5}));
}

TEST(HierarchyPlan, CrossGroupsPartitionTheRanks) {
  // Every rank is in exactly one cross-node group, at its node's index; the groups of all
  // local ranks together are the whole world.
  const std::vector<std::string> hosts = {"x", "y", "z", "x", "y", "z", "x", "y", "z"};
  std::vector<int> seen(hosts.size(), 0);
  for (int rank = 0; rank < static_cast<int>(hosts.size()); ++rank) {
    const HierarchyPlan plan = HierarchyPlan::make(hosts, rank);
    ASSERT_TRUE(plan.usable) << plan.reason;
    ASSERT_EQ(plan.cross_ranks.size(), 3u);
    EXPECT_EQ(plan.cross_ranks[static_cast<size_t>(plan.node)], rank);
    if (plan.node == 0) {
      for (int member : plan.cross_ranks) ++seen[static_cast<size_t>(member)];
    }
  }
  for (int count : seen) EXPECT_EQ(count, 1);
}

TEST(HierarchyPlan, UnequalHostsAreUnusableWithTheCounts) {
  const std::vector<std::string> hosts = {"a", "a", "a", "b", "b"};
  const HierarchyPlan plan = HierarchyPlan::make(hosts, 4);
  EXPECT_FALSE(plan.usable);
  EXPECT_NE(plan.reason.find("different numbers of ranks"), std::string::npos) << plan.reason;
  EXPECT_NE(plan.reason.find("a: 3, b: 2"), std::string::npos) << plan.reason;
  EXPECT_NE(plan.reason.find("staging path"), std::string::npos) << plan.reason;
  // The local view is still there (for logs); the cross group is not.
  EXPECT_EQ(plan.local_ranks, (std::vector<int>{3, 4}));
  EXPECT_EQ(plan.local_rank, 1);
  EXPECT_TRUE(plan.cross_ranks.empty());
}

TEST(HierarchyPlan, OneHostIsNcclAlone) {
  // Several ranks on one host: usable, NCCL runs the whole all-reduce (no cross level).
  const HierarchyPlan plan = HierarchyPlan::make({"solo", "solo", "solo", "solo"}, 2);
  EXPECT_TRUE(plan.usable) << plan.reason;
  EXPECT_EQ(plan.local_rank, 2);
  EXPECT_EQ(plan.localSize(), 4);
  EXPECT_EQ(plan.numNodes(), 1);
  EXPECT_EQ(plan.cross_ranks, (std::vector<int>{2}));

  const HierarchyPlan single = HierarchyPlan::make({"solo"}, 0);
  EXPECT_FALSE(single.usable);
  EXPECT_FALSE(single.reason.empty());
}

TEST(HierarchyPlan, OneRankPerHostNeedsNoNccl) {
  const HierarchyPlan plan = HierarchyPlan::make({"a", "b", "c"}, 1);
  EXPECT_FALSE(plan.usable);
  EXPECT_NE(plan.reason.find("one rank per host"), std::string::npos) << plan.reason;
  EXPECT_NE(plan.reason.find("no NCCL needed"), std::string::npos) << plan.reason;
  EXPECT_EQ(plan.node, 1);
  EXPECT_EQ(plan.cross_ranks, (std::vector<int>{0, 1, 2}));
}

TEST(HierarchyPlan, BadInputIsInvalidArgument) {
  EXPECT_THROW(HierarchyPlan::make({}, 0), InvalidArgument);
  EXPECT_THROW(HierarchyPlan::make({"a", "a"}, 2), InvalidArgument);
  EXPECT_THROW(HierarchyPlan::make({"a", "a"}, -1), InvalidArgument);
}

TEST(HierarchyPlan, ShardsCoverEveryElementOnce) {
  for (int local = 1; local <= 8; ++local) {
    std::vector<std::string> hosts;
    for (int h = 0; h < 2; ++h) {
      for (int r = 0; r < local; ++r) hosts.push_back(h == 0 ? "a" : "b");
    }
    const HierarchyPlan plan = HierarchyPlan::make(hosts, 0);
    for (size_t count = 0; count <= 33; ++count) {
      const collectives::SegmentLayout shards = plan.shards(count);
      ASSERT_EQ(shards.offset.size(), static_cast<size_t>(local));
      ASSERT_EQ(shards.length.size(), static_cast<size_t>(local));
      std::vector<int> covered(count, 0);
      size_t smallest = count;
      size_t largest = 0;
      for (int r = 0; r < local; ++r) {
        const size_t begin = shards.offset[static_cast<size_t>(r)];
        const size_t length = shards.length[static_cast<size_t>(r)];
        ASSERT_LE(begin + length, count) << "local " << local << " count " << count;
        for (size_t i = begin; i < begin + length; ++i) ++covered[i];
        smallest = std::min(smallest, length);
        largest = std::max(largest, length);
      }
      for (size_t i = 0; i < count; ++i) {
        EXPECT_EQ(covered[i], 1) << "element " << i << " local " << local << " count " << count;
      }
      EXPECT_LE(largest - std::min(smallest, largest), 1u)
          << "balanced: local " << local << " count " << count;
    }
  }
}

TEST(HierarchicalAllreduce, WhyNotPassesThePlansReasonOn) {
  const std::string why = HierarchicalAllreduce::whyNot({"a", "b"}, 0);
  EXPECT_NE(why.find("one rank per host"), std::string::npos) << why;
  // One host fits the plan; here it is refused for lack of a GPU, not for the layout.
  const std::string one_host = HierarchicalAllreduce::whyNot({"a", "a"}, 1);
  EXPECT_EQ(one_host.find("one host"), std::string::npos) << one_host;
  EXPECT_FALSE(one_host.empty());
}

TEST(HierarchicalAllreduce, EveryRankGetsTheSameRefusal) {
  // 2 hosts x 2 ranks fits the plan; without a GPU every rank refuses, and all of them must
  // return null with the same reason (none may go on into NCCL alone).
  if (kernels::cuda::available()) GTEST_SKIP() << "a GPU is present: nothing refuses here";
  const std::vector<std::string> hosts = {"a", "a", "b", "b"};
  EXPECT_EQ(HierarchicalAllreduce::whyNot(hosts, 0), kernels::cuda::unavailableReason());
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::string> reasons(hosts.size());
  test::rethrowFirst(test::runRanks(static_cast<int>(hosts.size()), [&](int rank) {
    HierarchicalAllreduce::Params params;
    params.store = store;
    params.key_prefix = "test";
    params.rank = rank;
    params.size = static_cast<int>(hosts.size());
    params.hosts = hosts;
    params.config.connect_timeout = std::chrono::seconds(10);
    std::string why;
    EXPECT_EQ(HierarchicalAllreduce::create(params, why), nullptr);
    reasons[static_cast<size_t>(rank)] = why;
  }));
  for (const std::string& why : reasons) {
    EXPECT_EQ(why, reasons.front());
    EXPECT_NE(why.find(kernels::cuda::unavailableReason()), std::string::npos) << why;
    EXPECT_NE(why.find("and 3 more ranks cannot"), std::string::npos) << why;
  }
}

}  // namespace
}  // namespace railshard
