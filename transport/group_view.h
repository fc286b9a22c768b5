#pragma once

#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace railshard::transport {

// Some of a transport's ranks seen as a transport of their own: rank i of the view is rank
// members[i] of the parent. Two-level collectives run an ordinary algorithm (a ring, recursive
// doubling) over the ranks of one local index across hosts this way. Messages travel on the
// parent's connections in the parent's per-pair order, so a pair's messages of every view
// and of the parent itself stay matched; failures, deadlines and tag checks are the parent's.
// A view owns nothing and must not outlive its parent.
class GroupView final : public Transport {
 public:
  // InvalidArgument unless `members` are distinct ranks of `parent` that include its own.
  GroupView(Transport& parent, std::vector<int> members);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  std::string name() const override { return parent_.name(); }
  // The parent's rank of view rank `rank`.
  int parentRank(int rank) const { return members_.at(static_cast<size_t>(rank)); }

  RequestPtr isend(int peer, const void* data, size_t bytes, const MessageTag& tag) override {
    return parent_.isend(parentRank(peer), data, bytes, tag);
  }
  RequestPtr irecv(int peer, void* data, size_t bytes, const MessageTag& tag) override {
    return parent_.irecv(parentRank(peer), data, bytes, tag);
  }
  void wait(const RequestPtr& request, Deadline deadline) override {
    parent_.wait(request, deadline);
  }
  void abort(std::exception_ptr error, bool tell_peers) override {
    parent_.abort(std::move(error), tell_peers);
  }
  void checkHealthy() const override { parent_.checkHealthy(); }

 private:
  Transport& parent_;
  std::vector<int> members_;
  int rank_ = -1;
};

}  // namespace railshard::transport
