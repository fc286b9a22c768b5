#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/config.h"
#include "transport/bootstrap/exchange.h"
#include "transport/links/driver.h"
#include "transport/links/link.h"
#include "transport/messaging/failure_state.h"
#include "transport/transport.h"

namespace railshard::transport::links::ibverbs {

// How the RDMA transport is asked for (RAILSHARD_TRANSPORT).
enum class Mode : uint8_t {
  kAuto,    // RDMA between ranks on different hosts when both have a usable port; else TCP
  kForced,  // every pair over RDMA (ibverbs); an error naming what is missing otherwise
};

struct FactoryOptions {
  int rank = 0;
  int size = 1;
  Duration connect_timeout = std::chrono::seconds(60);
  Mode mode = Mode::kAuto;
  // The devices, slots, rendezvous and re-admission. rendezvous_auto: not on software devices
  // (Soft-RoCE, soft iWARP), where it measured slower; rendezvous_verb auto: write when a rail
  // is a software device, else read; connect auto: on first use beyond kEagerPeers RDMA peers.
  RdmaConfig rdma;
  Duration spin = std::chrono::microseconds(100);  // the driver's polling (RdmaDriver::Options)
};

// Which peers this rank reaches over RDMA: the lanes to each (one per rail the pair shares,
// not yet connected: their messengers connect them by records) and the driver that owns them.
struct RdmaPlan {
  std::unique_ptr<Driver> driver;
  std::vector<std::vector<std::unique_ptr<Link>>> lanes;  // by rank; empty: not over RDMA
  bool lazy = false;                                      // connected on first use, not at start-up
  size_t rendezvous_bytes = 0;  // messages from this size move in place (0: none)
  bool write_rendezvous = false;
  std::string rails;  // "mlx5_0:1 (RoCE, ...), ...", for the log
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

// Decides, with every rank (one start-up exchange), which pairs use RDMA: kAuto between ranks on
// different hosts that both have a usable port, kForced every pair (ConfigError naming what is
// missing on which rank otherwise). Null when no pair of this rank's does. `failure`: the
// group's, which the driver's thread reports into.
std::unique_ptr<RdmaPlan> planRdma(bootstrap::Exchange& exchange, const FactoryOptions& options,
                                   messaging::FailureState& failure);

}  // namespace railshard::transport::links::ibverbs
