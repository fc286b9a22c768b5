// The two-level collectives' pure logic: which ranks share a host, how a buffer is cut into
// host blocks and cross-host ranges (checked against a brute-force owner search), the
// small-message groups, and the pipeline's second thread.
#include <gtest/gtest.h>

#include <algorithm>

#include <string>
#include <vector>

#include "base/error.h"
#include "core/collectives/host_layout.h"
#include "core/collectives/pipeline_worker.h"

namespace railshard {
namespace {

using collectives::CrossRange;
using collectives::HostLayout;

// ---- the plan ----

HostLayout layoutOf(const std::vector<int>& per_host) {
  std::vector<std::string> keys;
  for (size_t h = 0; h < per_host.size(); ++h) {
    for (int i = 0; i < per_host[h]; ++i) keys.push_back("host" + std::to_string(h));
  }
  return HostLayout::fromKeys(keys);
}

TEST(HostLayout, GroupsRanksByKeyInOrderOfTheirLowestRank) {
  const HostLayout layout = HostLayout::fromKeys({"b", "a", "b", "c", "a"});
  ASSERT_EQ(layout.hostCount(), 3);
  EXPECT_EQ(layout.hosts[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(layout.hosts[1], (std::vector<int>{1, 4}));
  EXPECT_EQ(layout.hosts[2], (std::vector<int>{3}));
  EXPECT_EQ(layout.host_of, (std::vector<int>{0, 1, 0, 2, 1}));
  EXPECT_EQ(layout.local_rank_of, (std::vector<int>{0, 0, 1, 0, 1}));
  EXPECT_EQ(layout.maxLocal(), 2);
  EXPECT_TRUE(layout.twoLevel());
  EXPECT_EQ(layout.describe(), "3 hosts (2,2,1 ranks)");
  EXPECT_EQ(layoutOf({2, 2}).describe(), "2 hosts x 2 ranks");
  EXPECT_FALSE(layoutOf({1, 1, 1}).twoLevel());
  EXPECT_FALSE(layoutOf({4}).twoLevel());
  EXPECT_THROW(HostLayout::fromKeys({}), InvalidArgument);
  try {
    HostLayout::fromKeys({"a", ""});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
}

TEST(HostLayout, HostBlocksAreBalancedAndCoverTheBuffer) {
  for (size_t count : {0, 1, 2, 3, 7, 1000, 1001}) {
    for (int l = 1; l <= 5; ++l) {
      const auto b = collectives::hostBlocks(count, l);
      ASSERT_EQ(b.size(), static_cast<size_t>(l) + 1);
      EXPECT_EQ(b.front(), 0u);
      EXPECT_EQ(b.back(), count);
      for (int i = 0; i < l; ++i) {
        const size_t length = b[static_cast<size_t>(i) + 1] - b[static_cast<size_t>(i)];
        EXPECT_TRUE(length == count / static_cast<size_t>(l) ||
                    length == count / static_cast<size_t>(l) + 1)
            << count << " " << l;
      }
    }
  }
}

// Every element must be all-reduced exactly once, by the rank that owns it on every host.
TEST(HostLayout, CrossRangesGiveEveryElementItsOwnerOnEveryHost) {
  for (const auto& per_host : std::vector<std::vector<int>>{
           {2, 2}, {4, 4}, {2, 2, 2}, {1, 2, 3}, {3, 1}, {1, 1}, {5, 2, 3, 1}}) {
    const HostLayout layout = layoutOf(per_host);
    for (size_t count : {0, 1, 2, 5, 6, 7, 30, 1001}) {
      const auto ranges = collectives::crossRanges(layout, count);
      size_t next = 0;
      for (const CrossRange& range : ranges) {
        ASSERT_EQ(range.begin, next);
        ASSERT_LT(range.begin, range.end);
        next = range.end;
        for (size_t i = range.begin; i < range.end; ++i) {
          std::vector<int> owners;  // brute force: scan each host's blocks
          for (size_t h = 0; h < layout.hosts.size(); ++h) {
            const auto& ranks = layout.hosts[h];
            const auto b = collectives::hostBlocks(count, static_cast<int>(ranks.size()));
            for (size_t l = 0; l < ranks.size(); ++l) {
              if (b[l] <= i && i < b[l + 1]) owners.push_back(ranks[l]);
            }
          }
          ASSERT_EQ(range.members, owners) << "element " << i << " of " << count;
        }
      }
      EXPECT_EQ(next, count);
      for (size_t k = 1; k < ranges.size(); ++k) {
        EXPECT_NE(ranges[k].members, ranges[k - 1].members) << "unmerged neighbours";
      }
    }
  }
  // Equal hosts: one range per local index, across the ranks of that index.
  const auto even = collectives::crossRanges(layoutOf({2, 2}), 10);
  ASSERT_EQ(even.size(), 2u);
  EXPECT_EQ(even[0], (CrossRange{0, 5, {0, 2}}));
  EXPECT_EQ(even[1], (CrossRange{5, 10, {1, 3}}));
}

TEST(HostLayout, DirectGroupsSpanEveryHostAndCoverEveryRank) {
  const HostLayout layout = layoutOf({1, 2, 3});
  const auto groups = collectives::directGroups(layout);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0], (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(groups[1], (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(groups[2], (std::vector<int>{0, 1, 5}));
}

// Every block has exactly one handler on every host, the block's owner on its own host (so no
// block moves between ranks of one host), and on interleaved hosts too.
TEST(HostLayout, EveryBlockHasOneHandlerPerHostAndItsOwnerAtHome) {
  for (const HostLayout& layout : {layoutOf({2, 2}), layoutOf({1, 2, 3}), layoutOf({3, 1}),
                                   HostLayout::fromKeys({"a", "b", "a", "b", "c", "b"})}) {
    for (int h = 0; h < layout.hostCount(); ++h) {
      const auto handled = collectives::handledBlocks(layout, h);
      ASSERT_EQ(handled.size(), layout.hosts[static_cast<size_t>(h)].size());
      std::vector<int> seen(static_cast<size_t>(layout.worldSize()), 0);
      for (size_t l = 0; l < handled.size(); ++l) {
        EXPECT_TRUE(std::is_sorted(handled[l].begin(), handled[l].end()));
        for (int block : handled[l]) {
          ++seen[static_cast<size_t>(block)];
          EXPECT_EQ(collectives::blockHandler(layout, h, block),
                    layout.hosts[static_cast<size_t>(h)][l]);
          if (layout.host_of[static_cast<size_t>(block)] == h) {
            EXPECT_EQ(layout.hosts[static_cast<size_t>(h)][l], block) << layout.describe();
          }
        }
      }
      EXPECT_EQ(seen, std::vector<int>(seen.size(), 1)) << layout.describe() << " host " << h;
    }
  }
  // 1,2,3 ranks: on the 3-rank host (3, 4, 5) the blocks of local rank 0 (ranks 0, 1, 3) go to
  // rank 3, of local rank 1 (2, 4) to rank 4, of local rank 2 (5) to rank 5; the 1-rank host
  // handles every block.
  const HostLayout uneven = layoutOf({1, 2, 3});
  EXPECT_EQ(collectives::handledBlocks(uneven, 2),
            (std::vector<std::vector<int>>{{0, 1, 3}, {2, 4}, {5}}));
  EXPECT_EQ(collectives::handledBlocks(uneven, 0),
            (std::vector<std::vector<int>>{{0, 1, 2, 3, 4, 5}}));
  EXPECT_EQ(collectives::handledBlocks(uneven, 1),
            (std::vector<std::vector<int>>{{0, 1, 3, 5}, {2, 4}}));
}

// ---- the pipeline's second thread ----

TEST(PipelineWorker, RunsJobsInOrderAndStopsAtTheFirstError) {
  std::vector<size_t> ran;
  {
    collectives::PipelineWorker worker(
        [&](size_t i) {
          if (i == 2) throw TimeoutError("job 2 timed out");
          ran.push_back(i);
        },
        -1);
    for (int i = 0; i < 4; ++i) worker.submit();
    worker.waitFor(0);
    worker.waitFor(1);
    for (size_t i : {2, 3}) {
      try {
        worker.waitFor(i);
        FAIL() << "job " << i << " did not raise";
      } catch (const TimeoutError& e) {
        EXPECT_STREQ(e.what(), "job 2 timed out");
      }
    }
  }  // joins without running job 3
  EXPECT_EQ(ran, (std::vector<size_t>{0, 1}));
}

}  // namespace
}  // namespace railshard
