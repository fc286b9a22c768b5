// CollectiveDispatcher::admit() and joined(): the dispatcher side of Communicator::grow().

#include <algorithm>
#include <string>

#include "base/clock.h"
#include "base/error.h"
#include "base/logging.h"
#include "core/communicator.h"
#include "core/dispatch/collective_dispatcher.h"
#include "core/dispatch/state_codec.h"

namespace railshard::dispatch {

namespace {

// What each rank of the grown communicator says first: whether it was a member, and where
// it stands (members only).
struct WireArrival {
  uint64_t member;
  uint64_t committed;
  uint64_t completed;
  uint64_t open;
};
static_assert(sizeof(WireArrival) == 32);

double medianOf(std::vector<double> values) {
  if (values.empty()) return 1;
  std::nth_element(values.begin(), values.begin() + static_cast<long>(values.size() / 2),
                   values.end());
  return values[values.size() / 2];
}

}  // namespace

CollectiveDispatcher::CollectiveDispatcher(Communicator& grown)
    : comm_(&grown), state_(1, 1, DispatchOptions{}) {
  log_every_ = grown.config().dispatch_log_every;
}

CollectiveDispatcher::Admission CollectiveDispatcher::admit(Communicator& grown) {
  return adopt(grown, true);
}

CollectiveDispatcher CollectiveDispatcher::joined(Communicator& grown) {
  CollectiveDispatcher d(grown);
  d.adopt(grown, false);
  return d;
}

CollectiveDispatcher::Admission CollectiveDispatcher::adopt(Communicator& grown, bool member) {
  const auto start = Clock::now();
  // As in nextStep(): a member calling this is past the open step's gradient all-reduce, so
  // the step is applied (unless it is a step still to be redone after a recovery).
  if (member && state_.dispatcher().stepOpen() && !state_.openStepCommitted() &&
      !state_.redoPending()) {
    state_.commit();
  }
  const Position position = state_.position();
  const WireArrival wire{member ? 1u : 0u, position.committed, position.completed,
                         position.open ? 1u : 0u};
  std::vector<WireArrival> all(static_cast<size_t>(grown.size()));
  grown.allgather(&wire, all.data(), sizeof(WireArrival), DataType::kUInt8);
  if (all[0].member == 0) {
    // grow() puts the members first; a joiner at rank 0 means the two sides called
    // different things (joined() on a member, or admit() on a joiner).
    throw InvalidArgument(
        "CollectiveDispatcher: rank 0 of the grown communicator is not a member "
        "(admit() is for the members, joined() for the joiners)");
  }
  const std::vector<int>& launch = grown.worldRanks();

  // Members must stand at one step boundary: the same position everywhere. Every rank checks (the
  // joiners see the members' positions too), so that all raise the same error rather than some
  // waiting for a broadcast that never comes.
  std::vector<Position> positions;
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].member == 0) continue;
    positions.push_back({all[r].committed, all[r].completed, all[r].open != 0});
    if (all[r].committed != all[0].committed || all[r].completed != all[0].completed ||
        all[r].open != all[0].open) {
      throw InvalidArgument("CollectiveDispatcher::admit: rank " + std::to_string(r) +
                            " has committed " + std::to_string(all[r].committed) +
                            " steps, rank 0 " + std::to_string(all[0].committed) +
                            " (grow() and admit() go between two steps, on every member)");
    }
  }
  Admission admission;
  if (member) {
    // Members grow() left out: gone, as after a shrink().
    std::vector<bool> survives(static_cast<size_t>(state_.dispatcher().worldSize()), false);
    bool lost = false;
    for (size_t d = 0; d < members_.size(); ++d) {
      const auto it = std::find(launch.begin(), launch.end(), members_[d]);
      survives[d] = it != launch.end() && all[static_cast<size_t>(it - launch.begin())].member;
      lost = lost || (!survives[d] && state_.dispatcher().alive(static_cast<int>(d)));
    }
    if (lost) {
      admission.recovery = state_.recover(positions, survives);
      mine_ = RankReport{};
    }
  }

  // The first member's state, to everyone: joiners adopt it; members hold the same already.
  std::vector<uint8_t> bytes;
  int64_t length = 0;
  if (grown.rank() == 0) {
    bytes = StateCodec::encode(state_, members_);
    length = static_cast<int64_t>(bytes.size());
  }
  grown.broadcast(&length, 1, DataType::kInt64, 0);
  if (grown.rank() != 0) bytes.resize(static_cast<size_t>(length));
  grown.broadcast(bytes.data(), bytes.size(), DataType::kUInt8, 0);
  if (!member) {
    StateCodec::Decoded decoded = StateCodec::decode(bytes);
    if (decoded.launch_ranks.size() !=
        static_cast<size_t>(decoded.state.dispatcher().worldSize())) {
      throw ProtocolError("dispatcher hand-over: " + std::to_string(decoded.launch_ranks.size()) +
                          " launch ranks for " +
                          std::to_string(decoded.state.dispatcher().worldSize()) +
                          " dispatcher ranks");
    }
    state_ = std::move(decoded.state);
    members_ = std::move(decoded.launch_ranks);
  }

  // Joiners take the next numbers, in the grown communicator's order.
  std::vector<double> weights;
  const Dispatcher& d = state_.dispatcher();
  const auto& options = d.options();
  for (int r = 0; r < d.worldSize(); ++r) {
    if (d.alive(r)) {
      weights.push_back(options.weights.empty() ? 1.0 : options.weights[static_cast<size_t>(r)]);
    }
  }
  const double weight = medianOf(weights);
  ranks_.assign(launch.size(), 0);
  for (size_t r = 0; r < launch.size(); ++r) {
    const auto it = std::find(members_.begin(), members_.end(), launch[r]);
    if (all[r].member != 0) {
      if (it == members_.end()) {
        throw InvalidArgument("CollectiveDispatcher::admit: launch rank " +
                              std::to_string(launch[r]) +
                              " calls admit() but was not in this dispatcher's group");
      }
      ranks_[r] = static_cast<int>(it - members_.begin());
      continue;
    }
    if (it != members_.end()) {
      throw InvalidArgument("CollectiveDispatcher::joined: launch rank " +
                            std::to_string(launch[r]) + " is a member of the group already");
    }
    ranks_[r] = state_.addRank(weight);
    members_.push_back(launch[r]);
    admission.joined.push_back(ranks_[r]);
  }
  my_rank_ = ranks_[static_cast<size_t>(grown.rank())];

  // Same state everywhere, or the next plans would differ (a joiner built from another
  // binary, a member that diverged).
  checkSameState(grown, ranks_, "dispatcher hand-over");
  comm_ = &grown;
  if (!member) mine_ = RankReport{};
  admit_seconds_ = secondsSince(start);
  if (grown.rank() == 0) {
    std::string joined;
    for (const int r : admission.joined) {
      if (!joined.empty()) joined += ',';
      joined += std::to_string(r);
    }
    RS_LOG_INFO("dispatch: {} ranks after admitting [{}] ({:.1f} ms, {} bytes of state)",
                grown.size(), joined, admit_seconds_ * 1e3, length);
  }
  return admission;
}

}  // namespace railshard::dispatch
