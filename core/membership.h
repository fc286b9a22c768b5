#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "core/communicator_options.h"
#include "transport/transport.h"

namespace railshard {

// Who is in a communicator and how it re-forms (docs/reliability.md): this generation's ranks
// by launch rank, its store namespaces, whether it can still be used, and the rounds through
// the store in which survivors shrink, members admit joiners (grow) and joiners ask in. It
// decides the next generation's options; the Communicator makes it.
class Membership {
 public:
  explicit Membership(const CommunicatorOptions& options);

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::vector<int>& worldRanks() const { return world_ranks_; }
  int worldRank() const { return world_ranks_[static_cast<size_t>(rank_)]; }
  int generation() const { return generation_; }
  int launchRanks() const { return launch_ranks_; }
  const std::shared_ptr<Store>& store() const { return store_; }
  const std::string& keyPrefix() const { return key_prefix_; }
  const std::string& advertiseHost() const { return advertise_host_; }
  // The cluster graph this generation was built with; null when none was given.
  const topology::Topology* topology() const { return topology_.get(); }
  // "rank 3 (launch rank 5, host node-b)": what an error says about a rank.
  std::string describeRank(int rank) const;

  // InvalidArgument naming `what` once the communicator was shrunk, grown or aborted.
  void checkUsable(const char* what) const;
  void markAborted(const std::string& reason) { aborted_ = reason; }
  bool aborted() const { return !aborted_.empty(); }

  // --- re-forming (membership_rounds.cc) ---
  // shrink() or grow() (`by`) retires this generation for this rank: InvalidArgument without
  // a store; the lost peers it knows are marked for the round.
  void retire(const char* by, const std::vector<transport::LostPeer>& lost);
  // The survivors agree on who is left: the new generation's options for this rank
  // (PeerLostError when the others left it out).
  CommunicatorOptions shrink(const Config& config, Duration timeout);
  // The members admit the joiners waiting: the new generation's options for this rank, and
  // how many joined.
  struct Growth {
    CommunicatorOptions options;
    size_t joined = 0;
  };
  Growth grow(const Config& config, Duration timeout);
  // A grown generation did not come up (`why`: a joiner died): the members re-form without
  // its joiners, in the next round.
  CommunicatorOptions withoutJoiners(const Config& config, Duration timeout, const Growth& growth,
                                     const std::string& why);
  // The joiner's side of grow(): the options of the generation that admitted it.
  static CommunicatorOptions join(const CommunicatorOptions& options, Duration timeout);
  // Joiners that asked since the last grow() looked (rank 0 reads the store).
  int64_t joinersAsked() const;
  // Store key and value saying `lost` is gone, for the next round.
  std::pair<std::string, std::string> lostMarkFor(const transport::LostPeer& lost) const;
  // A member that closes a healthy communicator counts itself closed; the last of the
  // generation marks the job finished and turns away the joiners still waiting.
  void markClosed(const Config& config) noexcept;

 private:
  std::optional<std::string> lostMark(const std::string& round, int world);
  std::vector<int> decideSurvivors(const std::string& round, Deadline deadline,
                                   std::string& excluded);
  std::pair<std::vector<int>, std::string> agreeOnMembers(
      const std::string& round, Duration timeout, const std::function<void(Deadline)>& decide);
  void decideShrink(const std::string& round, Deadline deadline);
  void decideGrowth(const Config& config, const std::string& round, int next, Deadline deadline);
  CommunicatorOptions nextOptions(const Config& config, const std::string& round, int next,
                                  const std::vector<int>& members, int me, int launch_ranks) const;
  std::shared_ptr<const topology::Topology> renumberedTopology(
      const std::vector<int>& members) const;
  std::shared_ptr<const topology::Topology> grownTopology(const std::string& round,
                                                          const CommunicatorOptions& next,
                                                          const std::vector<int>& members) const;

  int rank_;
  int size_;
  std::shared_ptr<Store> store_;
  std::vector<int> world_ranks_;
  int generation_;
  int launch_ranks_;
  std::string key_prefix_;
  std::string key_root_;
  std::string advertise_host_;
  std::shared_ptr<const topology::Topology> topology_;
  GraphExtender extend_topology_;
  const char* retired_ = nullptr;  // "shrink" or "grow": use the communicator it returned
  std::string aborted_;            // the reason abort() was given
};

}  // namespace railshard
