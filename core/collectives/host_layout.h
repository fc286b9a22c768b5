#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace railshard::collectives {

// Which ranks share a host, as the two-level collectives see it, and how they split a buffer.
// Pure logic (no I/O): built from one key per rank, tested on synthetic layouts.
struct HostLayout {
  // Ranks of each host, ascending; hosts in the order of their lowest rank.
  std::vector<std::vector<int>> hosts;
  std::vector<int> host_of;        // host index of each rank
  std::vector<int> local_rank_of;  // index of each rank among its host's ranks

  // Ranks with equal keys share a host. InvalidArgument when `keys` is empty or a key is "".
  static HostLayout fromKeys(const std::vector<std::string>& keys);

  int worldSize() const { return static_cast<int>(host_of.size()); }
  int hostCount() const { return static_cast<int>(hosts.size()); }
  int localSize(int rank) const;
  // The most ranks any host has.
  int maxLocal() const;
  // Several hosts, and at least one of them with several ranks: where two levels pay.
  bool twoLevel() const { return hostCount() > 1 && maxLocal() > 1; }
  // "2 hosts x 2 ranks", "3 hosts (1,2,3 ranks)".
  std::string describe() const;
};

// Element offsets of the blocks a host of `local_size` ranks cuts `count` elements into, for
// its reduce-scatter: local rank l owns [begin[l], begin[l+1]); local_size + 1 entries.
std::vector<size_t> hostBlocks(size_t count, int local_size);

// A part of the buffer that one rank of every host all-reduces across hosts, after the hosts'
// reduce-scatters: on every host exactly one rank owns all of [begin, end). Members are world
// ranks in host order.
struct CrossRange {
  size_t begin = 0;
  size_t end = 0;
  std::vector<int> members;
  bool operator==(const CrossRange&) const = default;
};

// The cross-host ranges of a `count`-element all-reduce: ascending, non-empty, covering
// [0, count), neighbours with the same members merged. With L ranks on every host these are
// the L blocks, each across the ranks of one local index; with unequal hosts the blocks of
// all hosts are cut where any host's blocks begin, and a rank of a host with fewer ranks takes
// part in several ranges, one after another.
std::vector<CrossRange> crossRanges(const HostLayout& layout, size_t count);

// For small messages, where every rank of a host holds the host's whole sum: group g
// (0 <= g < maxLocal()) is local rank g mod L_h of every host h, so every rank is in at least
// one group and every group spans every host. Members in host order.
std::vector<std::vector<int>> directGroups(const HostLayout& layout);

// Two-level reduce-scatter and all-gather, where block d of the buffer belongs to rank d: the
// rank of `host` that handles block d there, i.e. reduces the host's share of it (and sends it
// to d) or receives it from d (and shares it in the host). That is local rank
// (local rank of d) mod (ranks of the host), so on d's own host it is d itself: blocks move
// only between hosts, and with L ranks on every host each rank handles one block per host.
int blockHandler(const HostLayout& layout, int host, int block);
// The blocks each local rank of `host` handles, ascending: entry l lists local rank l's.
std::vector<std::vector<int>> handledBlocks(const HostLayout& layout, int host);

}  // namespace railshard::collectives
