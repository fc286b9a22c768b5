#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/store.h"
#include "base/trace.h"
#include "core/collectives/host_layout.h"
#include "core/collectives/link_probe.h"
#include "core/collectives/tuner.h"
#include "transport/bootstrap/exchange.h"
#include "transport/links/tcp/tcp_connect.h"
#include "transport/messaging/mesh.h"

namespace railshard {

namespace topology {
class Topology;
}
namespace collectives {
class ShmEngine;
}

// How this rank reaches every other: one messenger per peer over the links chosen for the pair
// from the cluster graph and what each host has (NCCL's selectTransport loop) — a shared-memory
// channel between ranks of one host, TCP connections on every rail between hosts (or one to
// the peer's advertised address), RDMA lanes where both hosts have usable ports (the TCP
// connections then carry control only, or stripe with the lanes: RAILSHARD_STRIPE_TCP) — and
// the host's shared-memory segment with the engine the one-host collectives run on, and what
// start-up measured. Built collectively at start-up: what every rank must know of every other
// travels over a start-up ring (transport/bootstrap), the store is asked O(1) per rank.
class Channels {
 public:
  struct Options {
    int rank = 0;
    int size = 1;
    std::string key_prefix;
    std::string advertise_host;
    const Config* config = nullptr;
    // The cluster graph: which ranks share a host, the rails between hosts. May be null.
    const topology::Topology* topology = nullptr;
  };
  static std::unique_ptr<Channels> connect(Store& store, const Options& options);
  // The messengers say goodbye before the segment is left.
  ~Channels();
  Channels(const Channels&) = delete;
  Channels& operator=(const Channels&) = delete;

  transport::messaging::Mesh& mesh() const { return *mesh_; }
  transport::messaging::FailureState& failure() const { return mesh_->failure(); }
  // Which ranks share a host; null for one rank.
  const collectives::HostLayout* layout() const { return layout_.get(); }
  // This host's ranks' segment (every rank's when all are on this host); null when this rank
  // is alone on its host or its host could not map one.
  collectives::ShmEngine* engine() const { return engine_.get(); }
  // Every rank on this host, with a segment: collectives run through it.
  bool oneHost() const { return engine_ != nullptr && layout_->hostCount() == 1; }
  // Several hosts, and every host with several ranks has its segment: two-level collectives.
  bool twoLevel() const { return two_level_; }
  // The smallest of those segments' slots (two levels), else this host's.
  size_t hostSlotBytes() const;
  // Between hosts, as the tuner models the link: the slowest host pair's rails together.
  const collectives::LinkModel& network() const { return network_; }
  // Shared memory's hand-off and copy rate and the reduction kernel's rate, measured at
  // start-up on every host with several ranks (the slowest host's); zeros when none has.
  const collectives::MeasuredLinks& measured() const { return measured_; }
  // The start-up probe of how to read ordinary buffers (RAILSHARD_SHM_CROSS_READ=auto), as a
  // trace phase for Diagnostics to record once tracing is on; empty when it did not run.
  const std::optional<trace::Event>& readProbeEvent() const { return read_probe_event_; }

 private:
  explicit Channels(const Options& options);
  // channels_host.cc: groups the ranks by host and maps one segment per host with several
  // ranks, measured; then the ranks of a pair check whether they may read each other's memory.
  void setUpHost(Store& store, transport::bootstrap::Exchange& exchange);
  // The leader's record of its host's segment ("slot alpha beta reduce") for the others; empty
  // on the other ranks and when the host has none.
  std::string mapHostSegment(Store& store, const std::vector<int>& mine);
  std::string measureHost(int leader);
  // RAILSHARD_SHM_CROSS_READ=auto: the host's ranks time the single copy read across against
  // the staged path and all take what was faster (collectives::probeCrossRead).
  void chooseReadPath(int local_rank);
  void agreeOnMeasuredLinks(const std::vector<std::string>& segments,
                            const std::vector<std::string>& identities);
  // channels.cc: how the sockets to every peer are made (connect()), the messengers and their
  // links; the segment's and the group's errors as one.
  transport::links::tcp::ConnectOptions connectOptions() const;
  // Whether the pair talks through this host's segment (a shared-memory channel, no socket):
  // both ranks decide alike from what setUpHost agreed.
  bool throughSegment(int peer) const;
  // Whether the TCP connections between hosts are made on first use (RAILSHARD_TCP_CONNECT;
  // the same on every rank).
  bool tcpLazy() const;
  void connectLinks(transport::bootstrap::Exchange& exchange,
                    transport::links::tcp::Connections connections);
  void joinErrorStates();

  Options options_;
  std::unique_ptr<transport::messaging::Mesh> mesh_;  // before the engine: its error state
  std::unique_ptr<collectives::HostLayout> layout_;
  std::unique_ptr<collectives::ShmEngine> engine_;
  bool two_level_ = false;
  size_t host_slot_bytes_ = 0;
  collectives::LinkModel network_{0, 0};
  collectives::MeasuredLinks measured_;
  std::optional<trace::Event> read_probe_event_;
  int failure_hook_ = 0;
};

}  // namespace railshard
