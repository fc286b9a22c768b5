#include "transport/ibverbs/ibverbs_factory.h"

#include <mutex>
#include <sstream>

#include "base/error.h"
#include "base/logging.h"
#include "transport/ibverbs/hca_discovery.h"
#include "transport/ibverbs/verbs_api.h"
#include "transport/links/shm/host_identity.h"

namespace railshard::transport::ibverbs {

namespace {

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

std::unique_ptr<Transport> wrapWithIbverbs(Store& store, const FactoryOptions& options,
                                           std::unique_ptr<Transport> control) {
  if (options.size == 1) return control;
  const Duration timeout = options.connect_timeout;
  const HcaScan found = scan(options.hca, options.gid_index);
  const bool usable = !found.ports.empty();
  for (const auto& skipped : found.skipped) {
    RS_LOG_DEBUG("rank {}: ibverbs: skipped {}", options.rank, skipped);
  }
  // Every rank says whether it can use RDMA and where it runs, so that every pair decides the
  // same way on both ends.
  const std::string host = links::shm::hostIdentity();
  const auto key = [&](int r) { return options.key_prefix + "/ib/avail/" + std::to_string(r); };
  store.setString(key(options.rank), (usable ? "1|" : "0|") + host + "|" + found.why_none, timeout);
  std::vector<bool> rdma_peers(static_cast<size_t>(options.size), false);
  bool any = false;
  for (int r = 0; r < options.size; ++r) {
    const std::string value = store.getString(key(r), timeout);
    const auto bar1 = value.find('|');
    const auto bar2 = value.find('|', bar1 + 1);
    const bool their_usable = value.compare(0, 1, "1") == 0;
    const std::string their_host = value.substr(bar1 + 1, bar2 - bar1 - 1);
    if (options.mode == Mode::kForced && !their_usable) {
      throw ConfigError("RAILSHARD_TRANSPORT=ibverbs, but rank " + std::to_string(r) +
                        " cannot use RDMA: " + value.substr(bar2 + 1));
    }
    if (r == options.rank) continue;
    const bool use =
        options.mode == Mode::kForced || (usable && their_usable && their_host != host);
    rdma_peers[static_cast<size_t>(r)] = use;
    any = any || use;
  }
  if (!any) {
    if (!usable) RS_LOG_DEBUG("rank {}: no RDMA: {}", options.rank, found.why_none);
    return control;
  }
  std::string rails;
  for (const auto& port : found.ports) {
    rails += (rails.empty() ? "" : ", ") + port.device + ":" + std::to_string(port.port) + " (" +
             (port.infiniband ? "InfiniBand" : "RoCE, " + port.gid_reason) + ")";
  }
  RS_LOG_INFO("rank {}: RDMA over {} (run on Soft-RoCE, not yet on RDMA hardware: docs/rdma.md)",
              options.rank, rails);
  // TEMPORARY (lanes move under the messenger): RDMA pairs stay on TCP.
  return control;
}

}  // namespace railshard::transport::ibverbs
