#include "transport/links/ibverbs/ibverbs_factory.h"

#include <mutex>
#include <sstream>

#include "base/error.h"
#include "base/logging.h"
#include "transport/links/ibverbs/hca_discovery.h"
#include "transport/links/ibverbs/rdma_driver.h"
#include "transport/links/ibverbs/rdma_lane.h"
#include "transport/links/ibverbs/verbs_api.h"
#include "transport/links/shm/host_identity.h"

namespace railshard::transport::links::ibverbs {

namespace {

// RAILSHARD_IB_CONNECT=auto: lanes are connected at start-up to at most this many RDMA peers,
// on first use beyond (8 peers x 8 MiB of rings per rail: what eager costs is bounded).
constexpr int kEagerPeers = 8;

// Registered memory and fork(): DataLoader workers and launchers fork after the transport
// registered its rings. ibv_fork_init() (before any device is opened) makes the library mark
// registered pages MADV_DONTFORK, so the parent's pinned pages are never copied-on-write
// under the HCA. Newer kernels make this unnecessary; the call is then a cheap no-op.
void forkInitOnce(const VerbsApi& api) {
  static std::once_flag once;
  std::call_once(once, [&] {
    if (api.fork_init != nullptr && api.fork_init() != 0) {
      RS_LOG_DEBUG("ibverbs: ibv_fork_init failed; fork() after registration is unsafe");
    }
  });
}

HcaScan scan(const std::string& hca_filter, int gid_index) {
  const VerbsApi* api = VerbsApi::get();
  if (api == nullptr) {
    HcaScan none;
    none.why_none = VerbsApi::unavailableReason();
    return none;
  }
  forkInitOnce(*api);
  return scanHcas(*api, hca_filter, gid_index);
}

}  // namespace

bool compiledIn() {
  return true;
}

std::string unavailableReason(const std::string& hca_filter) {
  const HcaScan result = scan(hca_filter, -1);
  return result.ports.empty() ? result.why_none : "";
}

std::string describeRdma(const std::string& hca_filter, int gid_index) {
  std::ostringstream out;
  const VerbsApi* api = VerbsApi::get();
  if (api == nullptr) {
    out << "RDMA: unavailable: " << VerbsApi::unavailableReason() << "\n";
    return out.str();
  }
  out << "RDMA library: " << api->path << "\n";
  const HcaScan found = scan(hca_filter, gid_index);
  for (const auto& port : found.ports) {
    out << "  " << port.device << ":" << port.port << "  "
        << (port.infiniband ? "InfiniBand" : "Ethernet (RoCE)") << "  " << port.gbps
        << " Gbit/s  mtu " << (128 << port.active_mtu) << "  lid " << port.lid << "  gid "
        << port.gid_index << " (" << port.gid_reason << ")\n";
  }
  for (const auto& skipped : found.skipped) out << "  skipped " << skipped << "\n";
  if (found.ports.empty()) {
    out << "RDMA: unavailable: " << found.why_none << "\n";
  } else {
    out << "RDMA: usable, " << found.ports.size()
        << " rail(s); used between hosts with RAILSHARD_TRANSPORT=auto or ibverbs (run on "
           "Soft-RoCE, not yet on RDMA hardware: docs/rdma.md)\n";
  }
  return out.str();
}

std::unique_ptr<RdmaPlan> planRdma(bootstrap::Exchange& exchange, const FactoryOptions& options,
                                   messaging::FailureState& failure) {
  if (options.size == 1) return nullptr;
  const HcaScan found = scan(options.rdma.hca, options.rdma.gid_index);
  const bool usable = !found.ports.empty();
  for (const auto& skipped : found.skipped) {
    RS_LOG_DEBUG("rank {}: ibverbs: skipped {}", options.rank, skipped);
  }
  std::unique_ptr<RdmaDriver> driver;
  if (usable) {
    RdmaDriver::Options driver_options;
    driver_options.rank = options.rank;
    driver_options.rdma = options.rdma;
    driver_options.spin = options.spin;
    driver_options.failure = &failure;
    driver = std::make_unique<RdmaDriver>(*VerbsApi::get(), driver_options, found.ports);
  }
  // Every rank says whether it can use RDMA, where it runs and the link layer of its rails, so
  // that every pair decides the same way on both ends.
  const std::string host = links::shm::hostIdentity();
  const std::vector<std::string> published = exchange.allGather(
      (usable ? "1|" : "0|") + host + "|" + (driver ? driver->layers() : "") + "|" + found.why_none,
      "rdma availability");
  auto plan = std::make_unique<RdmaPlan>();
  plan->lanes.resize(static_cast<size_t>(options.size));
  int peers = 0;
  std::vector<std::string> layers(static_cast<size_t>(options.size));
  for (int r = 0; r < options.size; ++r) {
    const std::string& value = published[static_cast<size_t>(r)];
    const auto bar1 = value.find('|');
    const auto bar2 = value.find('|', bar1 + 1);
    const auto bar3 = value.find('|', bar2 + 1);
    const bool their_usable = value.compare(0, 1, "1") == 0;
    const std::string their_host = value.substr(bar1 + 1, bar2 - bar1 - 1);
    if (options.mode == Mode::kForced && !their_usable) {
      throw ConfigError("RAILSHARD_TRANSPORT=ibverbs, but rank " + std::to_string(r) +
                        " cannot use RDMA: " + value.substr(bar3 + 1));
    }
    if (r == options.rank) continue;
    const bool use =
        options.mode == Mode::kForced || (usable && their_usable && their_host != host);
    if (!use) continue;
    layers[static_cast<size_t>(r)] = value.substr(bar2 + 1, bar3 - bar2 - 1);
    ++peers;
  }
  if (peers == 0) {
    if (!usable) RS_LOG_DEBUG("rank {}: no RDMA: {}", options.rank, found.why_none);
    return nullptr;
  }
  for (int r = 0; r < options.size; ++r) {
    if (layers[static_cast<size_t>(r)].empty()) continue;
    for (auto& lane : driver->makeLanes(r, layers[static_cast<size_t>(r)])) {
      plan->lanes[static_cast<size_t>(r)].push_back(std::move(lane));
    }
  }
  // Eager start-up gives every lane to every RDMA peer its queue pair and two registered rings
  // (2 x slots x slot_bytes, 8 MiB by default): at 64 hosts x 8 ranks x 8 rails that is ~32 GiB
  // pinned per rank, while a ring or two-level all-reduce talks to two or three peers.
  plan->lazy = options.rdma.connect == LaneConnect::kLazy ||
               (options.rdma.connect == LaneConnect::kAuto && peers > kEagerPeers);
  // Measured in the Soft-RoCE guest (docs/rdma.md): rxe's RDMA READ is its slow verb, so a
  // rendezvous there writes; on an HCA a read saves the grant's trip. Large messages are staged
  // on software devices unless asked (the rendezvous measured slower there).
  const RendezvousVerb verb = options.rdma.rendezvous_verb;
  plan->write_rendezvous =
      verb == RendezvousVerb::kWrite || (verb == RendezvousVerb::kAuto && driver->software());
  plan->rendezvous_bytes =
      options.rdma.rendezvous_auto && driver->software() ? 0 : options.rdma.rendezvous_bytes;
  if (options.rdma.rendezvous_auto && driver->software()) {
    RS_LOG_DEBUG(
        "rank {}: ibverbs: a rail is a software device: large messages staged "
        "(RAILSHARD_IB_RENDEZVOUS=<size> moves them in place anyway)",
        options.rank);
  }
  for (const auto& port : found.ports) {
    plan->rails += (plan->rails.empty() ? "" : ", ") + port.device + ":" +
                   std::to_string(port.port) + " (" +
                   (port.infiniband ? "InfiniBand" : "RoCE, " + port.gid_reason) + ")";
  }
  RS_LOG_INFO("rank {}: RDMA over {} (run on Soft-RoCE, not yet on RDMA hardware: docs/rdma.md)",
              options.rank, plan->rails);
  plan->driver = std::move(driver);
  return plan;
}

}  // namespace railshard::transport::links::ibverbs
