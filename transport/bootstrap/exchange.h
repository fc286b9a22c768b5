#pragma once

#include <string>
#include <vector>

namespace railshard::transport::bootstrap {

// What the ranks of a group tell each other while it forms: every rank's value of one thing
// (its listening address, where it runs, whether it can use RDMA), gathered onto every rank.
// Start-up asks this, not the store, so that the store answers O(N) requests per start-up
// and not one per pair of ranks (issue #46; docs/scaling.md).
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank's `mine`, in rank order. Every rank of the group makes the same calls in the
  // same order; `what` names the call in errors ("tcp listeners", "host identity") and is
  // checked to be the same on every rank (MismatchError).
  virtual std::vector<std::string> allGather(const std::string& mine, const std::string& what) = 0;
};

}  // namespace railshard::transport::bootstrap
