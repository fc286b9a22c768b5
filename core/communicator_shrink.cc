// Communicator::shrink(): the survivors of a failure agree through the store on who is left
// and form a new communicator without restarting (docs/reliability.md, "Elastic
// continuation").
//
// Store keys, under the root namespace shared by every generation:
//   lost/<launch rank>          a rank whose process ended (railshard-launch --elastic)
//   gen<G>/lost/<launch rank>   a rank of generation G-1 declared lost by one that saw it
//                               go (a closed connection, heartbeat silence). Per round: a
//                               rank that was stopped and resumed may write off ranks that
//                               merely moved on, and must not spoil later rounds.
//   gen<G>/join/<launch rank>   a rank that called shrink() into generation G
//   gen<G>/leader               counter: the first rank to add 1 decides the members
//   gen<G>/members              "0,2,3": launch ranks of generation G, in order
//   gen<G>/excluded             why each other rank of generation G-1 was left out
#include <algorithm>
#include <functional>
#include <optional>
#include <thread>

#include "base/error.h"
#include "base/logging.h"
#include "core/collectives/shm_engine.h"
#include "core/communicator.h"
#include "core/membership_keys.h"
#include "core/progress_publisher.h"
#include "core/topology/topology.h"
#include "transport/transport.h"

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

std::pair<std::string, std::string> Communicator::lostMarkFor(
    const transport::LostPeer& lost) const {
  return {key_root_ + "/gen" + std::to_string(generation_ + 1) + "/lost/" +
              std::to_string(world_ranks_[static_cast<size_t>(lost.rank)]),
          "declared lost by launch rank " + std::to_string(worldRank()) + ": " + lost.reason};
}

std::optional<std::string> Communicator::lostMark(const std::string& round, int world) {
  if (auto why = peekKey(*store_, key_root_ + "/lost/" + std::to_string(world))) {
    return "its process ended (" + *why + ")";
  }
  return peekKey(*store_, round + "/lost/" + std::to_string(world));
}

std::vector<int> Communicator::decideSurvivors(const std::string& round, Deadline deadline,
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

Duration Communicator::retire(const char* by, Timeout timeout_arg) {
  checkUsable(by);
  if (!store_) {
    throw InvalidArgument(std::string(by) +
                          ": this communicator has no store to re-form through (Options::store "
                          "is null; railshard::init() sets it)");
  }
  const Duration timeout = timeoutFor(by, timeout_arg);
  // The old group is finished for this rank: stop its publisher and poison its transport (a
  // no-op when a failure already did), without telling peers, who are re-forming too.
  publisher_.reset();
  retired_ = by;
  const std::string why = std::string("this communicator was re-formed by ") + by + "()";
  transport_->abort(makeError(ErrorKind::kPeerLost, "rank " + std::to_string(rank_) + ": " + why),
                    false);
  if (engine() != nullptr) engine()->abort(ErrorKind::kPeerLost, why);
  for (const auto& lost : transport_->lostPeers()) {
    const auto [key, value] = lostMarkFor(lost);
    store_->setString(key, value, kStoreCall);
  }
  return timeout;
}

std::pair<std::vector<int>, std::string> Communicator::agreeOnMembers(
    const std::string& round, Duration timeout, const std::function<void(Deadline)>& decide) {
  const Deadline deadline = Clock::now() + timeout;
  store_->setString(round + "/join/" + std::to_string(worldRank()), "1", kStoreCall);
  if (store_->add(round + "/leader", 1, kStoreCall) == 1) decide(deadline);
  // The leader may take the whole timeout deciding; give it that and the margin to answer.
  std::vector<int> members =
      parseRanks(store_->getString(round + "/members", timeout + std::chrono::seconds(10)));
  std::string excluded = store_->getString(round + "/excluded", kStoreCall);
  return {std::move(members), std::move(excluded)};
}

std::shared_ptr<const topology::Topology> Communicator::renumberedTopology(
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

Communicator::Options Communicator::nextOptions(const std::string& round, int next,
                                                const std::vector<int>& members, int me,
                                                int launch_ranks) const {
  Options options;
  options.rank = static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
  options.size = static_cast<int>(members.size());
  options.config = config_;
  options.key_prefix = round;
  options.key_root = key_root_;
  options.advertise_host = advertise_host_;
  options.store = store_;
  options.world_ranks = members;
  options.generation = next;
  options.launch_ranks = launch_ranks;
  options.extend_topology = extend_topology_;
  return options;
}

void Communicator::decideShrink(const std::string& round, Deadline deadline) {
  std::string excluded;
  const std::vector<int> survivors = decideSurvivors(round, deadline, excluded);
  store_->setString(round + "/excluded", excluded, kStoreCall);
  store_->setString(round + "/members", membership::formatRanks(survivors), kStoreCall);
}

std::unique_ptr<Communicator> Communicator::shrink(Timeout timeout_arg) {
  const Duration timeout = retire("shrink", timeout_arg);
  const int me = worldRank();
  const int next = generation_ + 1;
  const std::string round = key_root_ + "/gen" + std::to_string(next);
  RS_LOG_INFO("rank {} (launch rank {}): shrinking generation {} of {} ranks", rank_, me,
              generation_, size_);
  const auto [members, excluded] =
      agreeOnMembers(round, timeout, [&](Deadline deadline) { decideShrink(round, deadline); });
  if (std::find(members.begin(), members.end(), me) == members.end()) {
    throw PeerLostError("shrink: launch rank " + std::to_string(me) +
                        " is not among the survivors of generation " + std::to_string(next) + " (" +
                        excluded + ")");
  }
  Options options = nextOptions(round, next, members, me, launch_ranks_);
  options.topology = renumberedTopology(members);  // the same cluster, survivors renumbered
  RS_LOG_WARN("launch rank {}: generation {} formed: {} of {} ranks survive, this is rank {}{}", me,
              next, members.size(), size_, options.rank,
              excluded.empty() ? "" : " (left out: " + excluded + ")");
  auto shrunk = create(*store_, options);
  // Whatever this communicator kept alive (rank 0's store server, say) the new one needs too.
  for (const auto& resource : resources_) shrunk->keepAlive(resource);
  return shrunk;
}

}  // namespace railshard
