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
#include <optional>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "base/logging.h"
#include "core/collectives/shm_engine.h"
#include "core/communicator.h"
#include "core/progress_publisher.h"
#include "core/topology/topology.h"
#include "transport/transport.h"

namespace railshard {

namespace {

constexpr auto kStoreCall = std::chrono::seconds(5);
constexpr auto kPollPeriod = std::chrono::milliseconds(20);

std::optional<std::string> peekKey(Store& store, const std::string& key) {
  try {
    return store.getString(key, Duration::zero());
  } catch (const TimeoutError&) {
    return std::nullopt;
  }
}

std::vector<int> parseRanks(const std::string& text) {
  std::vector<int> ranks;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) ranks.push_back(std::stoi(item));
  }
  return ranks;
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
                          ": did not call shrink() in time");
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

std::unique_ptr<Communicator> Communicator::shrink(Timeout timeout_arg) {
  checkUsable("shrink");
  if (!store_) {
    throw InvalidArgument(
        "shrink: this communicator has no store to re-form through (Options::store is null; "
        "railshard::init() sets it)");
  }
  const Duration timeout = timeoutFor("shrink", timeout_arg);
  const Deadline deadline = Clock::now() + timeout;
  const int me = worldRank();
  const int next = generation_ + 1;
  const std::string round = key_root_ + "/gen" + std::to_string(next);

  // The old group is finished for this rank: stop its publisher and poison its transport (a
  // no-op when a failure already did), without telling peers, who are shrinking too.
  publisher_.reset();
  shrunk_ = true;
  transport_->abort(makeError(ErrorKind::kPeerLost,
                              "rank " + std::to_string(rank_) + ": this communicator was shrunk"),
                    false);
  if (engine() != nullptr) engine()->abort(ErrorKind::kPeerLost, "the communicator was shrunk");

  for (const auto& lost : transport_->lostPeers()) {
    const auto [key, value] = lostMarkFor(lost);
    store_->setString(key, value, kStoreCall);
  }
  store_->setString(round + "/join/" + std::to_string(me), "1", kStoreCall);
  RS_LOG_INFO("rank {} (launch rank {}): shrinking generation {} of {} ranks", rank_, me,
              generation_, size_);

  if (store_->add(round + "/leader", 1, kStoreCall) == 1) {
    std::string excluded;
    const std::vector<int> members = decideSurvivors(round, deadline, excluded);
    std::string list;
    for (size_t i = 0; i < members.size(); ++i) {
      if (i > 0) list += ',';
      list += std::to_string(members[i]);
    }
    store_->setString(round + "/excluded", excluded, kStoreCall);
    store_->setString(round + "/members", list, kStoreCall);
  }
  // The leader may take the whole timeout deciding; give it that and the margin to answer.
  const std::vector<int> members =
      parseRanks(store_->getString(round + "/members", timeout + std::chrono::seconds(10)));
  const std::string excluded = store_->getString(round + "/excluded", kStoreCall);
  const auto mine = std::find(members.begin(), members.end(), me);
  if (mine == members.end()) {
    throw PeerLostError("shrink: launch rank " + std::to_string(me) +
                        " is not among the survivors of generation " + std::to_string(next) + " (" +
                        excluded + ")");
  }
  if (members.empty()) {
    throw PeerLostError("shrink: no survivors in generation " + std::to_string(next));
  }

  Options options;
  options.rank = static_cast<int>(mine - members.begin());
  options.size = static_cast<int>(members.size());
  options.config = config_;
  options.key_prefix = round;
  options.key_root = key_root_;
  options.advertise_host = advertise_host_;
  options.store = store_;
  options.world_ranks = members;
  options.generation = next;
  if (topology_ != nullptr && topology_->worldSize() == size_) {
    // The same cluster, with the survivors' placements renumbered.
    auto graph = std::make_shared<topology::Topology>(*topology_);
    std::vector<topology::RankPlacement> placements;
    for (size_t r = 0; r < members.size(); ++r) {
      const auto old_rank =
          std::find(world_ranks_.begin(), world_ranks_.end(), members[r]) - world_ranks_.begin();
      topology::RankPlacement placement = topology_->rank(static_cast<int>(old_rank));
      placement.rank = static_cast<int>(r);
      placements.push_back(placement);
    }
    graph->setRanks(std::move(placements));
    options.topology = std::move(graph);
  }
  RS_LOG_WARN("launch rank {}: generation {} formed: {} of {} ranks survive, this is rank {}{}", me,
              next, members.size(), size_, options.rank,
              excluded.empty() ? "" : " (left out: " + excluded + ")");
  auto shrunk = create(*store_, options);
  // Whatever this communicator kept alive (rank 0's store server, say) the new one needs too.
  for (const auto& resource : resources_) shrunk->keepAlive(resource);
  return shrunk;
}

}  // namespace railshard
