#include "core/hierarchy_plan.h"

#include <algorithm>
#include <map>

#include "base/error.h"

namespace railshard {

namespace {

// "node-a: 4, node-b: 2" (at most a few hosts, so the reason stays one readable line).
std::string describeCounts(const std::vector<std::string>& node_hosts,
                           const std::vector<int>& counts) {
  constexpr size_t kShown = 4;
  std::string text;
  for (size_t n = 0; n < node_hosts.size() && n < kShown; ++n) {
    text += (n == 0 ? "" : ", ") + node_hosts[n] + ": " + std::to_string(counts[n]);
  }
  if (node_hosts.size() > kShown) text += ", ...";
  return text;
}

}  // namespace

HierarchyPlan HierarchyPlan::make(const std::vector<std::string>& hosts, int rank) {
  if (hosts.empty()) throw InvalidArgument("hierarchy plan: no hosts given");
  if (rank < 0 || static_cast<size_t>(rank) >= hosts.size()) {
    throw InvalidArgument("hierarchy plan: rank " + std::to_string(rank) + " outside the " +
                          std::to_string(hosts.size()) + " ranks");
  }
  HierarchyPlan plan;
  plan.rank = rank;
  std::map<std::string, int> index;
  std::vector<std::vector<int>> members;  // ranks of each node, in rank order
  for (size_t r = 0; r < hosts.size(); ++r) {
    auto [it, inserted] = index.try_emplace(hosts[r], static_cast<int>(plan.node_hosts.size()));
    if (inserted) {
      plan.node_hosts.push_back(hosts[r]);
      members.emplace_back();
    }
    plan.node_of_rank.push_back(it->second);
    members[static_cast<size_t>(it->second)].push_back(static_cast<int>(r));
  }
  plan.node = plan.node_of_rank[static_cast<size_t>(rank)];
  plan.local_ranks = members[static_cast<size_t>(plan.node)];
  plan.local_rank = static_cast<int>(
      std::find(plan.local_ranks.begin(), plan.local_ranks.end(), rank) - plan.local_ranks.begin());

  std::vector<int> counts;
  for (const auto& m : members) counts.push_back(static_cast<int>(m.size()));
  const bool equal =
      std::all_of(counts.begin(), counts.end(), [&](int c) { return c == counts.front(); });
  if (!equal) {
    // Shard r would have no owner on the smaller hosts.
    plan.reason = "hosts have different numbers of ranks (" +
                  describeCounts(plan.node_hosts, counts) +
                  "): the two-level plan needs the same number on every host; the staging "
                  "path runs the all-reduce";
    return plan;
  }
  for (const auto& m : members) plan.cross_ranks.push_back(m[static_cast<size_t>(plan.local_rank)]);
  if (plan.numNodes() == 1 && plan.localSize() == 1) {
    plan.reason = "a single rank: nothing to all-reduce";
    return plan;
  }
  if (plan.localSize() == 1) {
    plan.reason = "one rank per host (" + std::to_string(plan.numNodes()) +
                  " hosts): nothing to reduce inside a node, no NCCL needed; the staging path "
                  "runs the all-reduce between hosts";
    return plan;
  }
  plan.usable = true;
  return plan;
}

collectives::SegmentLayout HierarchyPlan::shards(size_t count) const {
  return collectives::SegmentLayout::balanced(count, std::max(1, localSize()));
}

}  // namespace railshard
