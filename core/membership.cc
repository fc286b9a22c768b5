// Who is in a communicator and how it re-forms (membership.h): this generation's ranks, whether
// it can still be used, the lost marks and the close that turns joiners away.
#include "core/membership.h"

#include <algorithm>
#include <optional>
#include <thread>

#include "base/error.h"
#include "base/logging.h"
#include "core/membership_keys.h"
#include "core/topology/topology.h"

namespace railshard {

namespace {

using membership::kStoreCall;
using membership::parseRanks;
constexpr auto kPollPeriod = std::chrono::milliseconds(20);

std::optional<std::string> peekKey(Store& store, const std::string& key) {
  try {
    return store.getString(key, Duration::zero());
  } catch (const TimeoutError&) {
    return std::nullopt;
  }
}

}  // namespace

Membership::Membership(const CommunicatorOptions& options)
    : rank_(options.rank),
      size_(options.size),
      store_(options.store),
      world_ranks_(options.world_ranks),
      generation_(options.generation),
      launch_ranks_(options.launch_ranks > 0 ? options.launch_ranks : options.size),
      key_prefix_(options.key_prefix),
      key_root_(options.key_root.empty() ? options.key_prefix : options.key_root),
      advertise_host_(options.advertise_host),
      topology_(options.topology),
      extend_topology_(options.extend_topology) {
  if (world_ranks_.empty()) {
    for (int r = 0; r < size_; ++r) world_ranks_.push_back(r);
  }
}

std::string Membership::describeRank(int rank) const {
  std::string text = "rank " + std::to_string(rank);
  std::vector<std::string> notes;
  const int world = world_ranks_[static_cast<size_t>(rank)];
  if (world != rank) notes.push_back("launch rank " + std::to_string(world));
  if (topology_ != nullptr && topology_->worldSize() == size_) {
    notes.push_back("host " + topology_->rank(rank).host);
  }
  for (size_t i = 0; i < notes.size(); ++i) text += (i == 0 ? " (" : ", ") + notes[i];
  if (!notes.empty()) text += ")";
  return text;
}

void Membership::checkUsable(const char* what) const {
  if (retired_ != nullptr) {
    throw InvalidArgument(std::string(what) + ": this communicator (generation " +
                          std::to_string(generation_) + ") was " +
                          (std::string(retired_) == "shrink" ? "shrunk" : "grown") +
                          "; use the communicator " + retired_ + "() returned");
  }
  if (!aborted_.empty()) {
    throw InvalidArgument(std::string(what) +
                          ": this communicator was aborted by the application: " + aborted_);
  }
}

void Membership::retire(const char* by, const std::vector<transport::LostPeer>& lost) {
  checkUsable(by);
  if (!store_) {
    throw InvalidArgument(std::string(by) +
                          ": this communicator has no store to re-form through (Options::store "
                          "is null; railshard::init() sets it)");
  }
  retired_ = by;
  for (const auto& peer : lost) {
    const auto [key, value] = lostMarkFor(peer);
    store_->setString(key, value, kStoreCall);
  }
}

int64_t Membership::joinersAsked() const {
  if (!store_) return 0;
  return store_->add(key_root_ + "/joiners", 0, kStoreCall) -
         store_->add(key_root_ + "/joiners/scanned", 0, kStoreCall);
}

std::pair<std::string, std::string> Membership::lostMarkFor(const transport::LostPeer& lost) const {
  return {key_root_ + "/gen" + std::to_string(generation_ + 1) + "/lost/" +
              std::to_string(world_ranks_[static_cast<size_t>(lost.rank)]),
          "declared lost by launch rank " +
              std::to_string(world_ranks_[static_cast<size_t>(rank_)]) + ": " + lost.reason};
}

std::optional<std::string> Membership::lostMark(const std::string& round, int world) {
  if (auto why = peekKey(*store_, key_root_ + "/lost/" + std::to_string(world))) {
    return "its process ended (" + *why + ")";
  }
  return peekKey(*store_, round + "/lost/" + std::to_string(world));
}

std::vector<int> Membership::decideSurvivors(const std::string& round, Deadline deadline,
                                             std::string& excluded) {
  // Every member of this generation either joins the round or is marked lost; the decision
  // waits until each one is accounted for (a lost mark wins over a join: a rank that was
  // stopped and resumed has been written off by the others), or until the deadline, after
  // which ranks that never joined are left out.
  std::vector<int> members;
  std::vector<std::string> reasons;
  std::vector<int> pending = world_ranks_;
  std::vector<int> joined;
  while (true) {
    std::vector<int> still;
    for (int world : pending) {
      if (auto why = lostMark(round, world)) {
        reasons.push_back("launch rank " + std::to_string(world) + ": " + *why);
      } else if (peekKey(*store_, round + "/join/" + std::to_string(world))) {
        joined.push_back(world);
      } else {
        still.push_back(world);
      }
    }
    pending.swap(still);
    if (pending.empty()) break;
    if (Clock::now() >= deadline) {
      for (int world : pending) {
        reasons.push_back("launch rank " + std::to_string(world) +
                          ": did not join the round (shrink() or grow()) in time");
      }
      break;
    }
    std::this_thread::sleep_for(kPollPeriod);
  }
  for (int world : joined) {
    if (auto why = lostMark(round, world)) {
      reasons.push_back("launch rank " + std::to_string(world) + ": " + *why);
    } else {
      members.push_back(world);
    }
  }
  std::sort(members.begin(), members.end(), [&](int a, int b) {
    // In the order of this generation's ranks.
    return std::find(world_ranks_.begin(), world_ranks_.end(), a) <
           std::find(world_ranks_.begin(), world_ranks_.end(), b);
  });
  for (const auto& reason : reasons) excluded += (excluded.empty() ? "" : "; ") + reason;
  return members;
}

std::pair<std::vector<int>, std::string> Membership::agreeOnMembers(
    const std::string& round, Duration timeout, const std::function<void(Deadline)>& decide) {
  const Deadline deadline = Clock::now() + timeout;
  store_->setString(round + "/join/" + std::to_string(world_ranks_[static_cast<size_t>(rank_)]),
                    "1", kStoreCall);
  if (store_->add(round + "/leader", 1, kStoreCall) == 1) decide(deadline);
  // The leader may take the whole timeout deciding; give it that and the margin to answer.
  std::vector<int> members =
      parseRanks(store_->getString(round + "/members", timeout + std::chrono::seconds(10)));
  std::string excluded = store_->getString(round + "/excluded", kStoreCall);
  return {std::move(members), std::move(excluded)};
}

std::shared_ptr<const topology::Topology> Membership::renumberedTopology(
    const std::vector<int>& members) const {
  if (topology_ == nullptr || topology_->worldSize() != size_) return nullptr;
  auto graph = std::make_shared<topology::Topology>(*topology_);
  std::vector<topology::RankPlacement> placements;
  for (size_t r = 0; r < members.size(); ++r) {
    const auto old = std::find(world_ranks_.begin(), world_ranks_.end(), members[r]);
    if (old == world_ranks_.end()) return nullptr;
    topology::RankPlacement placement =
        topology_->rank(static_cast<int>(old - world_ranks_.begin()));
    placement.rank = static_cast<int>(r);
    placements.push_back(placement);
  }
  graph->setRanks(std::move(placements));
  return graph;
}

}  // namespace railshard
