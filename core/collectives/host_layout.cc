#include "core/collectives/host_layout.h"

#include <algorithm>
#include <map>

#include "base/error.h"

namespace railshard::collectives {

HostLayout HostLayout::fromKeys(const std::vector<std::string>& keys) {
  if (keys.empty()) throw InvalidArgument("HostLayout: no ranks");
  HostLayout layout;
  std::map<std::string, int> index;
  layout.host_of.resize(keys.size());
  layout.local_rank_of.resize(keys.size());
  for (size_t r = 0; r < keys.size(); ++r) {
    if (keys[r].empty()) {
      throw InvalidArgument("HostLayout: rank " + std::to_string(r) + " has no host key");
    }
    auto [it, added] = index.emplace(keys[r], layout.hostCount());
    if (added) layout.hosts.emplace_back();
    auto& ranks = layout.hosts[static_cast<size_t>(it->second)];
    layout.host_of[r] = it->second;
    layout.local_rank_of[r] = static_cast<int>(ranks.size());
    ranks.push_back(static_cast<int>(r));
  }
  return layout;
}

int HostLayout::localSize(int rank) const {
  return static_cast<int>(hosts[static_cast<size_t>(host_of.at(static_cast<size_t>(rank)))].size());
}

int HostLayout::maxLocal() const {
  size_t most = 0;
  for (const auto& ranks : hosts) most = std::max(most, ranks.size());
  return static_cast<int>(most);
}

std::string HostLayout::describe() const {
  const std::string count = std::to_string(hostCount()) + (hostCount() == 1 ? " host" : " hosts");
  bool equal = true;
  for (const auto& ranks : hosts) equal = equal && ranks.size() == hosts.front().size();
  if (equal) {
    return count + " x " + std::to_string(hosts.front().size()) +
           (hosts.front().size() == 1 ? " rank" : " ranks");
  }
  std::string sizes;
  for (const auto& ranks : hosts) {
    if (!sizes.empty()) sizes += ',';
    sizes += std::to_string(ranks.size());
  }
  return count + " (" + sizes + " ranks)";
}

std::vector<size_t> hostBlocks(size_t count, int local_size) {
  const size_t n = static_cast<size_t>(std::max(1, local_size));
  std::vector<size_t> begin(n + 1);
  // Balanced: block lengths differ by at most one element.
  for (size_t l = 0; l <= n; ++l) begin[l] = count / n * l + std::min(l, count % n);
  return begin;
}

std::vector<CrossRange> crossRanges(const HostLayout& layout, size_t count) {
  // Every host's block boundaries; between two consecutive cuts each host has one owner.
  std::vector<std::vector<size_t>> blocks;
  std::vector<size_t> cuts;
  for (const auto& ranks : layout.hosts) {
    blocks.push_back(hostBlocks(count, static_cast<int>(ranks.size())));
    cuts.insert(cuts.end(), blocks.back().begin(), blocks.back().end());
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<CrossRange> ranges;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const size_t begin = cuts[i];
    const size_t end = cuts[i + 1];
    if (begin == end) continue;
    CrossRange range{begin, end, {}};
    for (size_t h = 0; h < layout.hosts.size(); ++h) {
      const auto& b = blocks[h];
      // The owner: the last block that starts at or before `begin` and is not empty.
      const size_t l =
          static_cast<size_t>(std::upper_bound(b.begin(), b.end() - 1, begin) - b.begin()) - 1;
      range.members.push_back(layout.hosts[h][l]);
    }
    if (!ranges.empty() && ranges.back().members == range.members && ranges.back().end == begin) {
      ranges.back().end = end;
    } else {
      ranges.push_back(std::move(range));
    }
  }
  return ranges;
}

std::vector<std::vector<int>> directGroups(const HostLayout& layout) {
  std::vector<std::vector<int>> groups(static_cast<size_t>(layout.maxLocal()));
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& ranks : layout.hosts) groups[g].push_back(ranks[g % ranks.size()]);
  }
  return groups;
}

int blockHandler(const HostLayout& layout, int host, int block) {
  const auto& ranks = layout.hosts[static_cast<size_t>(host)];
  const auto local = static_cast<size_t>(layout.local_rank_of[static_cast<size_t>(block)]);
  return ranks[local % ranks.size()];
}

std::vector<std::vector<int>> handledBlocks(const HostLayout& layout, int host) {
  std::vector<std::vector<int>> handled(layout.hosts[static_cast<size_t>(host)].size());
  for (int block = 0; block < layout.worldSize(); ++block) {
    const int handler = blockHandler(layout, host, block);
    handled[static_cast<size_t>(layout.local_rank_of[static_cast<size_t>(handler)])].push_back(
        block);
  }
  return handled;
}

}  // namespace railshard::collectives
