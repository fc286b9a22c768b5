// Which ranks share a host, the shared-memory segment each host's ranks map, and what start-up
// measures there (docs/architecture.md, "One host: shared memory").
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "base/error.h"
#include "base/logging.h"
#include "base/trace.h"
#include "core/channels.h"
#include "core/collective_tag.h"
#include "core/collectives/shm_engine.h"
#include "core/topology/topology.h"
#include "transport/links/shm/host_identity.h"
#include "transport/links/shm/shm_channel.h"
#include "transport/links/shm/shm_segment.h"
#include "transport/messaging/machine_load.h"

namespace railshard {

namespace {

// The link between this rank's host and the slowest-connected other host, as the tuner
// models it: all rails between the two together (probed figures when RAILSHARD_PROBE measured
// them, else the NICs' nominal speed), α the slowest rail's probed latency or TCP's default.
// Zero β when the graph does not know (the tuner then uses tcpModel()).
collectives::LinkModel networkBetweenHosts(const topology::Topology* graph,
                                           const collectives::HostLayout& layout, int rank) {
  collectives::LinkModel model{collectives::tcpModel().alpha_us, 0};
  if (graph == nullptr || graph->worldSize() != layout.worldSize() || layout.hostCount() < 2) {
    return model;
  }
  const std::string& mine = graph->rank(rank).host;
  double slowest = std::numeric_limits<double>::infinity();
  for (const auto& ranks : layout.hosts) {
    const std::string& theirs = graph->rank(ranks.front()).host;
    if (theirs == mine) continue;
    double gbps = 0;
    for (const auto& rail : graph->rails(mine, theirs)) {
      gbps += rail.gbps();
      if (rail.latency_us > 0) model.alpha_us = std::max(model.alpha_us, rail.latency_us);
    }
    if (gbps <= 0) return {model.alpha_us, 0};  // one host pair unknown: no figure at all
    slowest = std::min(slowest, gbps);
  }
  if (std::isfinite(slowest)) model.beta_gbps = slowest / 8;  // Gbit/s -> GB/s
  return model;
}

// The store key of one rank's shared-memory set-up record ("host", "name", "attached").
std::string shmKey(const std::string& prefix, const std::string& what, int rank) {
  return prefix + "/shm/" + what + "/" + std::to_string(rank);
}

// Set-up's own steps on the segment: no collective has this number.
transport::MessageTag setUpTag() {
  transport::MessageTag tag;
  tag.collective = static_cast<uint8_t>(CollectiveKind::kBarrier);
  tag.sequence = ~uint64_t{0};
  return tag;
}

// Enough hand-offs for a stable median, few enough to cost well under a millisecond; and
// copies larger than the per-core caches, as collectives' data is.
constexpr int kHandOffRounds = 32;
constexpr size_t kProbeBytes = size_t{2} << 20;

}  // namespace

size_t Channels::hostSlotBytes() const {
  if (two_level_) return host_slot_bytes_;
  return engine_ ? engine_->slotBytes() : 0;
}

void Channels::setUpHost(Store& store, transport::bootstrap::Exchange& exchange) {
  const Config& config = *options_.config;
  const int rank = options_.rank;
  const int size = options_.size;
  // A host is what the cluster graph says (ranks in separate network/UTS namespaces, or a
  // topology file that says so, are different hosts even when they could map the same
  // memory: the graph is the authority on what the user wants treated as a host), split
  // further by what can really share memory (boot id + /dev/shm).
  const std::vector<std::string> identities =
      exchange.allGather(transport::links::shm::hostIdentity(), "host identity");
  const topology::Topology* graph = options_.topology;
  const bool graphed = graph != nullptr && graph->worldSize() == size;
  std::vector<std::string> keys(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    keys[static_cast<size_t>(r)] =
        (graphed ? graph->rank(r).host + "|" : std::string()) + identities[static_cast<size_t>(r)];
  }
  layout_ = std::make_unique<collectives::HostLayout>(collectives::HostLayout::fromKeys(keys));
  network_ = networkBetweenHosts(graph, *layout_, rank);
  RS_LOG_DEBUG("rank {}: {}", rank, layout_->describe());
  if (config.transport == TransportKind::kTcp || config.transport == TransportKind::kIbverbs) {
    return;
  }
  if (layout_->hostCount() > 1 && config.transport == TransportKind::kShm) {
    throw ConfigError(
        "RAILSHARD_TRANSPORT=shm, but the ranks are not all on one host (or do "
        "not share /dev/shm): " +
        layout_->describe());
  }
  const auto& mine =
      layout_->hosts[static_cast<size_t>(layout_->host_of[static_cast<size_t>(rank)])];
  const std::vector<std::string> segments = exchange.allGather(
      mine.size() > 1 ? mapHostSegment(store, mine) : std::string(), "host segments");
  agreeOnMeasuredLinks(segments, identities);
  if (layout_->hostCount() == 1 || !layout_->twoLevel()) return;
  // Two levels only if every host with several ranks has its segment: each host's leader
  // told every rank its segment's slot (nothing when it could not make one), so all of them
  // agree on the algorithms. The smallest host's slot bounds the
  // direct variant everywhere, so that every rank makes the same choice for a message size.
  two_level_ = true;
  host_slot_bytes_ = std::numeric_limits<size_t>::max();
  for (const auto& ranks : layout_->hosts) {
    if (ranks.size() < 2) continue;
    const std::string& published = segments[static_cast<size_t>(ranks.front())];
    if (published.empty()) {
      two_level_ = false;
      continue;
    }
    host_slot_bytes_ = std::min<size_t>(host_slot_bytes_, std::stoull(published));
  }
  if (!two_level_) {
    engine_.reset();
    RS_LOG_WARN("rank {}: a host could not map shared memory; all-reduces run flat between hosts",
                rank);
  }
}

std::string Channels::mapHostSegment(Store& store, const std::vector<int>& mine) {
  const Config& config = *options_.config;
  const int rank = options_.rank;
  const Duration timeout = std::chrono::duration_cast<Duration>(config.connect_timeout);
  auto key = [&](const std::string& what, int r) { return shmKey(options_.key_prefix, what, r); };
  const int local_rank = layout_->local_rank_of[static_cast<size_t>(rank)];
  const int local_size = static_cast<int>(mine.size());
  const int leader = mine.front();
  // The host's lowest rank sizes and creates the segment, and unlinks its name once the
  // host's ranks have it mapped, so a killed job leaves nothing behind in /dev/shm. When it
  // cannot (no room in /dev/shm), it publishes an empty name and the host's ranks stay on TCP.
  std::unique_ptr<transport::links::shm::ShmSegment> segment;
  if (rank == leader) {
    std::string published;
    try {
      const size_t slot = transport::links::shm::chooseSlotBytes(config.shm.slot_bytes, local_size);
      const std::string name = transport::links::shm::ShmSegment::makeName();
      segment = transport::links::shm::ShmSegment::create(name, local_size, slot);
      published = name + "|" + std::to_string(slot);
    } catch (const Error& e) {
      if (config.transport == TransportKind::kShm) throw;
      RS_LOG_WARN("shared memory unavailable, using tcp: {}", e.what());
    }
    store.setString(key("name", leader), published, timeout);
  } else {
    const std::string published = store.getString(key("name", leader), timeout);
    if (!published.empty()) {
      const auto bar = published.find('|');
      const size_t slot = std::stoull(published.substr(bar + 1));
      segment =
          transport::links::shm::ShmSegment::attach(published.substr(0, bar), local_size, slot);
    } else if (config.transport == TransportKind::kShm) {
      throw ConfigError("RAILSHARD_TRANSPORT=shm, but rank " + std::to_string(leader) +
                        " could not create the shared memory segment (see its log)");
    }
    store.setString(key("attached", rank), "1", timeout);
  }
  if (rank == leader && segment) {
    std::vector<std::string> attached;
    for (size_t i = 1; i < mine.size(); ++i) attached.push_back(key("attached", mine[i]));
    store.wait(attached, timeout);
    segment->unlink();
  }
  // Whether the leader's segment exists decides for the whole host: every rank of it either
  // maps it or (empty name) none does, so all agree on the algorithms.
  if (!segment) return std::string();
  RS_LOG_DEBUG("rank {}: shared memory segment {} ({} ranks, {} bytes per slot)", rank,
               segment->name(), local_size, segment->slotBytes());
  engine_ = std::make_unique<collectives::ShmEngine>(
      std::move(segment), local_rank, local_size,
      std::chrono::duration_cast<Duration>(config.timeout),
      std::chrono::duration_cast<Duration>(config.wait.spin), mine, config.wait.mode);
  engine_->setFailure(&mesh_->failure());
  engine_->setAwaitHook([mesh = mesh_.get()](int peer, bool on) {
    transport::messaging::Messenger* messenger = mesh->messenger(peer);
    if (messenger == nullptr) return false;
    messenger->expectArrival(on);
    return true;
  });
  const std::string figures = measureHost(leader);
  // Every rank of the host finds out whose memory it can read (cross-memory attach may be
  // refused: ptrace permissions, a container's seccomp profile) and publishes it in the
  // segment; a pair reads across only where both may, and both ranks read the same bits, so
  // they always agree.
  transport::links::shm::ShmSegment& shared = engine_->segment();
  transport::links::shm::ShmChannel::publishProbe(shared, local_rank);
  engine_->barrier(setUpTag());
  transport::links::shm::ShmChannel::checkReadable(shared, local_rank, config.shm.p2p);
  engine_->barrier(setUpTag());
  engine_->setSingleCopy(config.shm.single_copy_bytes, config.shm.cross_read == CrossRead::kOn);
  // Only one-host jobs run the single copy (several hosts: two levels, staged in the host).
  if (config.shm.cross_read == CrossRead::kAuto && config.shm.single_copy_bytes > 0 &&
      layout_->hostCount() == 1 && engine_->everyoneReadsEveryone()) {
    chooseReadPath(local_rank);
  }
  if (config.shm.single_copy_bytes > 0 && !engine_->everyoneReadsEveryone() && local_rank == 0) {
    RS_LOG_INFO(
        "rank {}: large one-host all-reduces take the staged path through shared memory: "
        "cross-memory reads (process_vm_readv) are refused between some ranks of this host "
        "(RAILSHARD_P2P_SHM=0, ptrace_scope or a container's seccomp profile)",
        rank);
  }
  return figures;
}

void Channels::chooseReadPath(int local_rank) {
  // Whether process_vm_readv beats the staged copy depends on the CPU (1.2-1.4x on an Intel
  // Xeon, 0.6x on an AMD EPYC: docs/benchmarks.md), so each host measures it rather than
  // trusting a default tuned on one of them; every rank gets the slowest rank's figures.
  trace::Event event;
  event.begin_ns = trace::now();
  const collectives::ReadProbe probe =
      collectives::probeCrossRead(*engine_, setUpTag(), kProbeBytes);
  const bool across = probe.crossReadWins();
  engine_->setSingleCopy(engine_->singleCopy().first, across);
  // Tracing starts after the channels (Diagnostics), which records this then.
  event.end_ns = trace::now();
  event.category = trace::Category::kPhase;
  event.name = "shm_read_probe";
  event.detail = across ? "cross_read" : "staged";
  event.bytes = kProbeBytes;
  event.size = engine_->size();
  read_probe_event_ = event;
  if (local_rank != 0) return;
  if (probe.cross_us == 0) {
    RS_LOG_INFO(
        "rank {}: single copy of ordinary buffers: staged (a rank of this host has "
        "fewer cores than the host has ranks)",
        options_.rank);
    return;
  }
  RS_LOG_INFO(
      "rank {}: single copy of ordinary buffers: {} (a {} MiB all-reduce on this host "
      "took {:.0f} us read across with process_vm_readv, {:.0f} us staged; "
      "RAILSHARD_SHM_CROSS_READ=0/1 decides instead)",
      options_.rank, across ? "read across" : "staged", kProbeBytes >> 20, probe.cross_us,
      probe.staged_us);
}

std::string Channels::measureHost(int leader) {
  // Every rank of the host takes part in the hand-offs; the leader alone times the copy and
  // the kernel (the others would only compete with it for the memory bus) and publishes.
  const double alpha = collectives::measureHandOffMicros(*engine_, setUpTag(), kHandOffRounds);
  if (options_.rank != leader) return std::string();
  const double beta = collectives::measureCopyGBps(kProbeBytes);
  const double reduce = collectives::measureReduceGBps(kProbeBytes);
  // And the cores this process may run on, for how crowded they are (agreeOnMeasuredLinks).
  return std::to_string(engine_->slotBytes()) + " " + std::to_string(alpha) + " " +
         std::to_string(beta) + " " + std::to_string(reduce) + " " +
         std::to_string(transport::messaging::allowedCores());
}

void Channels::agreeOnMeasuredLinks(const std::vector<std::string>& segments,
                                    const std::vector<std::string>& identities) {
  // The leader of every host that mapped a segment measured it; every rank has them all and
  // takes the slowest host's figures, so all ranks feed the tuner the same numbers (and so
  // choose the same algorithms). Hosts that could not map a segment sent no figures.
  collectives::MeasuredLinks agreed;
  bool any = false;
  for (const auto& ranks : layout_->hosts) {
    if (ranks.size() < 2) continue;
    const int leader = ranks.front();
    const std::string& text = segments[static_cast<size_t>(leader)];
    if (text.empty()) continue;
    unsigned long long slot = 0;
    double alpha = 0;
    double beta = 0;
    double reduce = 0;
    double cores = 0;
    if (std::sscanf(text.c_str(), "%llu %lf %lf %lf %lf", &slot, &alpha, &beta, &reduce, &cores) !=
            5 ||
        cores < 1) {
      throw ProtocolError("rank " + std::to_string(leader) + " sent unreadable link figures '" +
                          text + "'");
    }
    // How crowded the host's cores are: the job's ranks on its machine (not only the host's:
    // "hosts" that are namespaces of one box share its cores) over the leader's allowed cores.
    // Ranks bound to one core each look crowded by this (their own sets are not known here),
    // and get the leader variant for small all-reduces, which costs them one hand-off.
    const std::string machine =
        transport::links::shm::machineOf(identities[static_cast<size_t>(leader)]);
    const auto sharing = std::count_if(identities.begin(), identities.end(), [&](const auto& id) {
      return transport::links::shm::machineOf(id) == machine;
    });
    agreed.ranks_per_core = std::max(agreed.ranks_per_core, static_cast<double>(sharing) / cores);
    if (!any) {
      agreed.shm = {alpha, beta};
      agreed.reduce_gbps = reduce;
      any = true;
      continue;
    }
    agreed.shm.alpha_us = std::max(agreed.shm.alpha_us, alpha);
    agreed.shm.beta_gbps = std::min(agreed.shm.beta_gbps, beta);
    agreed.reduce_gbps = std::min(agreed.reduce_gbps, reduce);
  }
  measured_ = agreed;
  if (any) {
    RS_LOG_DEBUG(
        "rank {}: measured shared memory {:.2f} us per hand-off, {:.1f} GB/s copy; "
        "reduction {:.1f} GB/s; at most {:.1f} ranks per core on a host",
        options_.rank, agreed.shm.alpha_us, agreed.shm.beta_gbps, agreed.reduce_gbps,
        agreed.ranks_per_core);
  }
}

}  // namespace railshard
