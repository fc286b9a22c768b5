// Membership::grow() and Membership::join(): ranks that are not members (a restarted
// process, a new server) join a running job at a step boundary, through the store and without
// a restart of the members (docs/reliability.md, "Growing").
//
// Store keys, under the root namespace shared by every generation (beside shrink()'s):
//   joiners                 counter: the tickets handed out to joiners, 1, 2, ...
//   joiners/scanned         the highest ticket a grow() has looked at
//   joiner/<t>              ticket t's request: "<job token>\n<host it advertises>\n<graph>",
//                           graph = "graph" when the joiner can take part in extending the
//                           cluster graph (it has an extend_topology), else "store"
//   joiner/<t>/claim        counter: whoever adds the first 1 settles the ticket -- a grow()
//                           leader (admit or refuse) or the joiner itself (withdraw on its
//                           timeout) -- so a joiner is never admitted after it gave up
//   joiner/<t>/answer       "<generation> <launch rank>", or "refused: <why>"
//   gen<G>/launch_ranks     launch ranks handed out once generation G is formed
//   gen<G>/topology         "graph <m>": every rank extends the cluster graph (members are
//                           ranks 0..m-1); "store": host identities through the store
//   gen<G>/closed           counter: members of generation G that closed it healthy
//   finished                set by the last of them: the job is over, joiners are turned away
//
// A joiner gets the next unused launch rank: a number, and the lost mark that may carry it
// (lost/<launch rank>), is never reused. The round itself is shrink()'s (gen<G>/join,
// leader, members, excluded), so a member that fails during a grow is left out the same way.
#include <algorithm>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/logging.h"
#include "core/membership.h"
#include "core/membership_keys.h"
#include "core/topology/topology.h"

namespace railshard {

namespace {

using membership::kStoreCall;
// A ticket whose request is not there this long after it was handed out belongs to a joiner
// that died between the two store calls.
constexpr auto kRequestGrace = std::chrono::seconds(2);

// One joiner's request, as join() writes it.
struct JoinRequest {
  std::string token;
  std::string host = "?";
  bool graph = false;  // it can take part in extending the cluster graph
};

JoinRequest parseRequest(const std::string& text) {
  JoinRequest request;
  std::istringstream in(text);
  std::getline(in, request.token);
  std::string line;
  if (std::getline(in, line)) request.host = line;
  if (std::getline(in, line)) request.graph = line == "graph";
  return request;
}

// Settles ticket `key` (the first claim wins) with `answer`; false when it was settled before.
bool settleTicket(Store& store, const std::string& key, const std::string& answer) {
  if (store.add(key + "/claim", 1, kStoreCall) != 1) return false;
  store.setString(key + "/answer", answer, kStoreCall);
  return true;
}

// Generation `round`'s graph round for the rank `next` describes, when its leader wrote that
// every rank takes part ("graph <members>" in round/topology); nullopt when the generation
// compares hosts through the store.
std::optional<GraphRound> graphRound(Store& store, const std::string& round,
                                     const CommunicatorOptions& next) {
  const std::string value = store.getString(round + "/topology", kStoreCall);
  if (value.rfind("graph ", 0) != 0) return std::nullopt;
  GraphRound graph_round;
  graph_round.key_prefix = next.key_prefix;
  graph_round.rank = next.rank;
  graph_round.size = next.size;
  graph_round.members = std::stoi(value.substr(6));
  return graph_round;
}

}  // namespace

CommunicatorOptions Membership::nextOptions(const Config& config, const std::string& round,
                                            int next, const std::vector<int>& members, int me,
                                            int launch_ranks) const {
  CommunicatorOptions options;
  options.rank = static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
  options.size = static_cast<int>(members.size());
  options.config = config;
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

CommunicatorOptions Membership::shrink(const Config& config, Duration timeout) {
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
  CommunicatorOptions options = nextOptions(config, round, next, members, me, launch_ranks_);
  options.topology = renumberedTopology(members);  // the same cluster, survivors renumbered
  RS_LOG_WARN("launch rank {}: generation {} formed: {} of {} ranks survive, this is rank {}{}", me,
              next, members.size(), size_, options.rank,
              excluded.empty() ? "" : " (left out: " + excluded + ")");
  return options;
}

Membership::Growth Membership::grow(const Config& config, Duration timeout) {
  const int me = worldRank();
  const int next = generation_ + 1;
  const std::string round = key_root_ + "/gen" + std::to_string(next);
  const auto [members, excluded] = agreeOnMembers(
      round, timeout, [&](Deadline deadline) { decideGrowth(config, round, next, deadline); });
  if (std::find(members.begin(), members.end(), me) == members.end()) {
    throw PeerLostError("grow: launch rank " + std::to_string(me) +
                        " is not among the members of generation " + std::to_string(next) + " (" +
                        excluded + ")");
  }
  const int launch_ranks = std::stoi(store_->getString(round + "/launch_ranks", kStoreCall));
  Growth growth;
  growth.options = nextOptions(config, round, next, members, me, launch_ranks);
  growth.joined = static_cast<size_t>(std::count_if(
      members.begin(), members.end(), [&](int world) { return world >= launch_ranks_; }));
  RS_LOG_WARN("launch rank {}: generation {} formed: {} ranks ({} joined), this is rank {}{}", me,
              next, members.size(), growth.joined, growth.options.rank,
              excluded.empty() ? "" : " (left out: " + excluded + ")");
  // A joiner that died before it took part fails the graph's exchange as it fails create().
  growth.options.topology = grownTopology(round, growth.options, members);
  return growth;
}

CommunicatorOptions Membership::withoutJoiners(const Config& config, Duration timeout,
                                               const Growth& growth, const std::string& why) {
  // A joiner that died after it asked (or a member that died after the agreement) leaves the
  // new generation unable to connect, on every rank that waits for it. The members fall back
  // to themselves, in the next round, as shrink() does: the joiners' launch ranks are spent, a
  // dead member is left out by its deadline.
  const int me = worldRank();
  const int next = growth.options.generation;
  const int again = next + 1;
  const std::string retry = key_root_ + "/gen" + std::to_string(again);
  RS_LOG_WARN(
      "launch rank {}: generation {} did not come up ({}); re-forming without its joiners as "
      "generation {}",
      me, next, why, again);
  const auto [survivors, left_out] =
      agreeOnMembers(retry, timeout, [&](Deadline deadline) { decideShrink(retry, deadline); });
  if (std::find(survivors.begin(), survivors.end(), me) == survivors.end()) {
    throw PeerLostError("grow: generation " + std::to_string(next) + " did not come up (" + why +
                        "), and launch rank " + std::to_string(me) +
                        " is not among the members of generation " + std::to_string(again) + " (" +
                        left_out + ")");
  }
  CommunicatorOptions options =
      nextOptions(config, retry, again, survivors, me, growth.options.launch_ranks);
  options.topology = renumberedTopology(survivors);
  return options;
}

void Membership::decideShrink(const std::string& round, Deadline deadline) {
  std::string excluded;
  const std::vector<int> survivors = decideSurvivors(round, deadline, excluded);
  store_->setString(round + "/excluded", excluded, kStoreCall);
  store_->setString(round + "/members", membership::formatRanks(survivors), kStoreCall);
}

void Membership::decideGrowth(const Config& config, const std::string& round, int next,
                              Deadline deadline) {
  std::string excluded;
  std::vector<int> members = decideSurvivors(round, deadline, excluded);
  const size_t before = members.size();
  bool graph = extend_topology_ != nullptr && topology_ != nullptr;
  int issued = launch_ranks_;
  const int64_t tickets = store_->add(key_root_ + "/joiners", 0, kStoreCall);
  const int64_t scanned = store_->add(key_root_ + "/joiners/scanned", 0, kStoreCall);
  std::vector<std::pair<std::string, std::string>> answers;
  for (int64_t t = scanned + 1; t <= tickets; ++t) {
    const std::string key = key_root_ + "/joiner/" + std::to_string(t);
    std::string request;
    try {
      request = store_->getString(key, kRequestGrace);
    } catch (const TimeoutError&) {
      request.clear();  // settled below as refused, should its joiner still be there
    }
    if (store_->add(key + "/claim", 1, kStoreCall) != 1) continue;  // withdrawn by the joiner
    const auto [token, host, joiner_graph] = parseRequest(request);
    if (request.empty()) {
      answers.emplace_back(key, "refused: its request did not reach the store");
    } else if (token != config.token) {
      // Never the tokens themselves in a log or an error.
      RS_LOG_WARN(
          "grow into generation {}: refused joiner ticket {} (host {}): its job token "
          "does not match this job's",
          next, t, host);
      answers.emplace_back(key,
                           "refused: its job token (RAILSHARD_TOKEN) does not match the job's");
    } else {
      RS_LOG_INFO("grow into generation {}: admitting joiner ticket {} (host {}) as launch rank {}",
                  next, t, host, issued);
      members.push_back(issued);
      answers.emplace_back(key, std::to_string(next) + " " + std::to_string(issued));
      ++issued;
      graph = graph && joiner_graph;
    }
  }
  // A later leader starts after these; tickets settled since (withdrawn) are skipped by claim.
  store_->add(key_root_ + "/joiners/scanned", tickets - scanned, kStoreCall);
  store_->setString(round + "/launch_ranks", std::to_string(issued), kStoreCall);
  store_->setString(round + "/topology", graph ? "graph " + std::to_string(before) : "store",
                    kStoreCall);
  store_->setString(round + "/excluded", excluded, kStoreCall);
  store_->setString(round + "/members", membership::formatRanks(members), kStoreCall);
  for (const auto& [key, answer] : answers) store_->setString(key + "/answer", answer, kStoreCall);
}

std::shared_ptr<const topology::Topology> Membership::grownTopology(
    const std::string& round, const CommunicatorOptions& next,
    const std::vector<int>& members) const {
  // Members come first (launch ranks below launch_ranks_), joiners after them.
  const auto first_joiner = std::find_if(members.begin(), members.end(),
                                         [&](int world) { return world >= launch_ranks_; });
  // Without joiners the cluster graph still describes everyone.
  if (first_joiner == members.end()) return renumberedTopology(members);
  std::optional<GraphRound> graph_round = graphRound(*store_, round, next);
  if (!graph_round) return nullptr;
  graph_round->known = renumberedTopology(std::vector<int>(members.begin(), first_joiner));
  return extend_topology_(*store_, *graph_round);
}

CommunicatorOptions Membership::join(const CommunicatorOptions& options_in, Duration timeout) {
  if (!options_in.store) {
    throw InvalidArgument("join: Options::store is null: a joiner finds the job through its store");
  }
  const auto timeout_ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count();
  Store& store = *options_in.store;
  const std::string root =
      options_in.key_root.empty() ? options_in.key_prefix : options_in.key_root;
  const int64_t ticket = store.add(root + "/joiners", 1, kStoreCall);
  const std::string key = root + "/joiner/" + std::to_string(ticket);
  const std::string host =
      options_in.advertise_host.empty() ? "loopback" : options_in.advertise_host;
  store.setString(key,
                  options_in.config.token + "\n" + host + "\n" +
                      (options_in.extend_topology ? "graph" : "store"),
                  kStoreCall);
  RS_LOG_INFO("join: waiting for the members of '{}' to grow (ticket {})", root, ticket);
  std::string answer;
  try {
    // A job that finished before the ticket was taken never answers it (markClosed()).
    if (store.add(root + "/finished", 0, kStoreCall) > 0 &&
        settleTicket(store, key, "refused: the job finished before it was admitted")) {
      RS_LOG_DEBUG("join: '{}' has finished", root);
    }
    answer = store.getString(key + "/answer", timeout);
  } catch (const TimeoutError&) {
    if (store.add(key + "/claim", 1, kStoreCall) == 1) {
      throw TimeoutError("join: no grow() of the job '" + root + "' admitted this joiner within " +
                         std::to_string(timeout_ms) + " ms (ticket " + std::to_string(ticket) +
                         "; withdrawn): its members call Communicator::grow() at a step boundary");
    }
    // A leader settled the ticket first: its answer follows at once.
    answer = store.getString(key + "/answer", kStoreCall);
  }
  if (answer.rfind("refused", 0) == 0) {
    throw InvalidArgument("join: the members of '" + root + "' " + answer.substr(0, 7) +
                          " ticket " + std::to_string(ticket) + answer.substr(7));
  }
  int next = 0;
  int me = 0;
  std::istringstream(answer) >> next >> me;
  const std::string round = root + "/gen" + std::to_string(next);
  const std::vector<int> members =
      membership::parseRanks(store.getString(round + "/members", kStoreCall));
  CommunicatorOptions options = options_in;
  options.rank = static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
  options.size = static_cast<int>(members.size());
  options.key_prefix = round;
  options.key_root = root;
  options.world_ranks = members;
  options.generation = next;
  options.launch_ranks = std::stoi(store.getString(round + "/launch_ranks", kStoreCall));
  RS_LOG_WARN("join: launch rank {} is rank {} of {} in generation {}", me, options.rank,
              options.size, next);
  // A joiner knows no graph; with none extended, hosts are compared through the store.
  const std::optional<GraphRound> graph_round = graphRound(store, round, options);
  options.topology = graph_round ? options.extend_topology(store, *graph_round) : nullptr;
  return options;
}

void Membership::markClosed(const Config& config) noexcept {
  // Only a store that outlives the ranks can have joiners (RAILSHARD_JOIN needs one); any
  // other may already be gone with the rank that hosted it.
  if (!store_ || !config.store_external || retired_ != nullptr || !aborted_.empty()) return;
  constexpr auto kCall = std::chrono::seconds(2);
  try {
    if (store_->add(key_prefix_ + "/closed", 1, kCall) < size_) return;
    store_->add(key_root_ + "/finished", 1, kCall);
    // Joiners that asked before the mark are turned away here; later ones see the mark.
    const int64_t tickets = store_->add(key_root_ + "/joiners", 0, kCall);
    const int64_t scanned = store_->add(key_root_ + "/joiners/scanned", 0, kCall);
    for (int64_t t = scanned + 1; t <= tickets; ++t) {
      settleTicket(*store_, key_root_ + "/joiner/" + std::to_string(t),
                   "refused: the job finished (every member of generation " +
                       std::to_string(generation_) + " closed) before it was admitted");
    }
  } catch (const std::exception& e) {
    RS_LOG_DEBUG("rank {}: could not mark generation {} closed in the store: {}", rank_,
                 generation_, e.what());
  }
}

}  // namespace railshard
