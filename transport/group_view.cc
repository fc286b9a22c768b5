#include "transport/group_view.h"

#include <algorithm>

namespace railshard::transport {

GroupView::GroupView(Transport& parent, std::vector<int> members)
    : parent_(parent), members_(std::move(members)) {
  for (size_t i = 0; i < members_.size(); ++i) {
    const int r = members_[i];
    if (r < 0 || r >= parent_.size()) {
      throw InvalidArgument("GroupView: member " + std::to_string(r) + " is outside [0, " +
                            std::to_string(parent_.size()) + ")");
    }
    if (std::count(members_.begin(), members_.end(), r) != 1) {
      throw InvalidArgument("GroupView: rank " + std::to_string(r) + " is listed twice");
    }
    if (r == parent_.rank()) rank_ = static_cast<int>(i);
  }
  if (rank_ < 0) {
    throw InvalidArgument("GroupView: rank " + std::to_string(parent_.rank()) +
                          " is not one of the members");
  }
}

}  // namespace railshard::transport
