#pragma once

#include <memory>
#include <string>

#include "base/clock.h"
#include "base/config.h"
#include "base/store.h"
#include "transport/transport.h"

namespace railshard::transport::ibverbs {

// How the RDMA transport is asked for (RAILSHARD_TRANSPORT).
enum class Mode : uint8_t {
  kAuto,    // RDMA between ranks on different hosts when both have a usable port; else TCP
  kForced,  // every pair over RDMA (ibverbs); an error naming what is missing otherwise
};

struct FactoryOptions {
  int rank = 0;
  int size = 1;
  std::string key_prefix;
  Duration connect_timeout = std::chrono::seconds(60);
  Duration spin = std::chrono::microseconds(2000);
  TagFormatter formatter;
  Mode mode = Mode::kAuto;
  std::string hca;                // RAILSHARD_IB_HCA: "mlx5_0,mlx5_1:1"; empty = every device
  int gid_index = -1;             // RAILSHARD_IB_GID_INDEX; -1 = choose (gid_table.h)
  int ib_timeout = 18;            // RAILSHARD_IB_TIMEOUT (4.096 us * 2^n per retry)
  int ib_retry_cnt = 7;           // RAILSHARD_IB_RETRY_CNT
  int slots = 16;                 // RAILSHARD_IB_SLOTS: receive ring slots per lane
  size_t slot_bytes = 256 << 10;  // RAILSHARD_IB_SLOT_BYTES
  RailWeights rail_weights = RailWeights::kAdaptive;
  // RAILSHARD_IB_RENDEZVOUS: host messages of this many bytes or more are read in place by the
  // receiver (zero-copy); 0 = every message through the staging slots.
  size_t rendezvous_bytes = 512 << 10;
  // "auto": not on software devices (Soft-RoCE, soft iWARP), where it measured slower.
  bool rendezvous_auto = true;
  // RAILSHARD_IB_RENDEZVOUS_VERB: read (the receiver reads), write (the sender writes into the
  // buffer the receiver grants); auto: write when a rail is a software device, else read.
  RendezvousVerb rendezvous_verb = RendezvousVerb::kAuto;
  // RAILSHARD_STRIPE_TCP: stripe over the TCP transport's connections too (one more rail per
  // peer in the scheduler, its pieces in kPiece frames; messaging::PieceLink).
  bool stripe_tcp = false;
  // How often a failed RDMA lane is tried again (a new queue pair, exchanged through the
  // store); zero: a failed lane stays out.
  Duration readmit_interval = std::chrono::seconds(1);
  // RAILSHARD_IB_CONNECT: lanes connected at start-up, or when a pair first talks
  // (ibverbs_transport_lazy.cc); auto: lazy beyond kEagerPeers RDMA peers.
  LaneConnect connect = LaneConnect::kAuto;
};

// Whether this build contains the RDMA transport (infiniband/verbs.h was found at build time).
bool compiledIn();
// "" when this process can use RDMA now (library loads, an active port passes the filter);
// else why not, in one line.
std::string unavailableReason(const std::string& hca_filter = "");

// What the RDMA transport sees on this host, for people (railshard-topo --rdma): the library,
// each usable port (rate, link layer, MTU, LID, the GID and why), the ports left out and why,
// and whether RDMA would be used. Never throws.
std::string describeRdma(const std::string& hca_filter = "", int gid_index = -1);

// Puts the RDMA transport in front of `control` (the TCP transport, already connected to every
// peer), which keeps carrying heartbeats, failure reports and the traffic of pairs that do not
// use RDMA. Collective over all ranks (store exchanges). Returns `control` unchanged when no
// pair uses RDMA (kAuto on one host, or without devices). kForced without a usable device:
// ConfigError naming what is missing on which rank.
std::unique_ptr<Transport> wrapWithIbverbs(Store& store, const FactoryOptions& options,
                                           std::unique_ptr<Transport> control);

}  // namespace railshard::transport::ibverbs
