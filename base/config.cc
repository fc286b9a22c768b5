#include "base/config.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>

#include "base/error.h"

extern char** environ;

namespace railshard {

long long parseInteger(const std::string& what, const std::string& value, long long min,
                       long long max) {
  errno = 0;
  char* end = nullptr;
  const long long parsed = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || errno != 0 || end == nullptr || *end != '\0') {
    throw ConfigError(what + ": expected an integer, got '" + value + "'");
  }
  if (parsed < min || parsed > max) {
    throw ConfigError(what + ": " + value + " is out of range [" + std::to_string(min) + ", " +
                      std::to_string(max) + "]");
  }
  return parsed;
}

double parseSeconds(const std::string& what, const std::string& value) {
  char* end = nullptr;
  errno = 0;
  const double parsed = std::strtod(value.c_str(), &end);
  if (value.empty() || errno != 0 || end == nullptr || *end != '\0' || !std::isfinite(parsed) ||
      parsed <= 0) {
    throw ConfigError(what + ": expected a positive number of seconds, got '" + value + "'");
  }
  return parsed;
}

size_t parseBytes(const std::string& what, const std::string& value) {
  if (value.empty()) throw ConfigError(what + ": expected a size in bytes, got ''");
  size_t multiplier = 1;
  std::string digits = value;
  switch (value.back()) {
    case 'K':
    case 'k':
      multiplier = size_t{1} << 10;
      break;
    case 'M':
    case 'm':
      multiplier = size_t{1} << 20;
      break;
    case 'G':
    case 'g':
      multiplier = size_t{1} << 30;
      break;
    default:
      break;
  }
  if (multiplier != 1) digits.pop_back();
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) {
    // Named whole: "big" would otherwise read as "bi" gigabytes.
    throw ConfigError(what + ": expected a size in bytes (a number, optionally K, M or G), got '" +
                      value + "'");
  }
  const long long base = parseInteger(what, digits, 1, 1LL << 40);
  return static_cast<size_t>(base) * multiplier;
}

namespace {

std::chrono::milliseconds toMillis(double seconds) {
  return std::chrono::milliseconds(static_cast<long long>(std::llround(seconds * 1000.0)));
}

void ignore(Config&, const std::string&) {}

}  // namespace

const std::vector<Config::Variable>& Config::variables() {
  static const std::vector<Variable> table = {
      {"RAILSHARD_LOG_LEVEL", "warn",
       "Log level: trace, debug, info, warn, error, critical or off.",
       [](Config& c, const std::string& v) { c.log_level = logLevelFrom(v); }},
      {"RAILSHARD_TIMEOUT", "300",
       "Deadline in seconds for every blocking wait inside a collective; a wait that passes it "
       "raises TimeoutError naming the collective and the peer.",
       [](Config& c, const std::string& v) {
         c.timeout = toMillis(parseSeconds("RAILSHARD_TIMEOUT", v));
       }},
      {"RAILSHARD_CONNECT_TIMEOUT", "60",
       "Deadline in seconds for start-up: reaching the store and connecting to every peer.",
       [](Config& c, const std::string& v) {
         c.connect_timeout = toMillis(parseSeconds("RAILSHARD_CONNECT_TIMEOUT", v));
       }},
      {"RAILSHARD_HEARTBEAT_TIMEOUT", "10",
       "Seconds a peer may stay silent (no data, no heartbeat) before it is declared lost with "
       "PeerLostError: catches stopped processes and stuck hosts, which keep their connections "
       "open. Heartbeats go out every fifth of this. 0 disables it.",
       [](Config& c, const std::string& v) {
         if (v == "0") {
           c.links.heartbeat_timeout = std::chrono::milliseconds(0);
           return;
         }
         c.links.heartbeat_timeout = toMillis(parseSeconds("RAILSHARD_HEARTBEAT_TIMEOUT", v));
         if (c.links.heartbeat_timeout.count() < 100) {
           throw ConfigError("RAILSHARD_HEARTBEAT_TIMEOUT='" + v + "' must be 0 or at least 0.1 s");
         }
       }},
      {"RAILSHARD_CHUNK_BYTES", "1M",
       "Pipeline chunk of the ring algorithms (suffix K, M or G allowed).",
       [](Config& c, const std::string& v) {
         c.chunk_bytes = parseBytes("RAILSHARD_CHUNK_BYTES", v);
       }},
      {"RAILSHARD_TOKEN", "(set by the launcher)",
       "Job token every store and data connection must present; railshard-launch makes a fresh "
       "random one per job. Set the same value on every rank when starting ranks by hand.",
       [](Config& c, const std::string& v) { c.token = v; }},
      {"RAILSHARD_STORE_ADDR", "(set by the launcher)",
       "host:port of the rendezvous store. Rank 0 hosts it there; the other ranks connect.",
       [](Config& c, const std::string& v) { c.store_addr = v; }},
      {"RAILSHARD_STORE_EXTERNAL", "0",
       "1: the store at RAILSHARD_STORE_ADDR is already running (railshard-launch --elastic "
       "hosts it so that it outlives any rank); rank 0 does not start one.",
       [](Config& c, const std::string& v) {
         c.store_external = parseInteger("RAILSHARD_STORE_EXTERNAL", v, 0, 1) == 1;
       }},
      {"RAILSHARD_TRANSPORT", "auto",
       "Transport between ranks: auto (shared memory between the ranks of each host, in every "
       "job; RDMA between hosts that both have an active RDMA port; else TCP), tcp (TCP between "
       "every pair, same-host ranks included), shm (an error unless "
       "every rank is on one host), or ibverbs (RDMA between every pair, an error naming what "
       "is missing otherwise; docs/rdma.md).",
       [](Config& c, const std::string& v) { c.transport = transportKindFrom(v); }},
      {"RAILSHARD_NCCL", "auto",
       "Device all-reduces with several ranks per host: auto (NCCL inside each host and railshard "
       "between hosts when every rank can load NCCL and every host has the same number of "
       "ranks; else pinned-host staging), on (the same, but an error naming why when it cannot) "
       "or off (always staging). docs/gpu.md.",
       [](Config& c, const std::string& v) { c.nccl = ncclModeFrom(v); }},
      {"RAILSHARD_IB_HCA", "(every device)",
       "RDMA ports to use as rails, comma-separated device names with an optional port: "
       "mlx5_0,mlx5_1:1. Lane r to a peer joins this rank's r-th port to the peer's r-th.",
       [](Config& c, const std::string& v) { c.rdma.hca = v; }},
      {"RAILSHARD_IB_GID_INDEX", "auto",
       "RoCE GID table index. auto: RoCE v2 with an IPv4 address (else IPv6), lowest index; "
       "InfiniBand uses index 0.",
       [](Config& c, const std::string& v) {
         c.rdma.gid_index =
             v == "auto" ? -1 : static_cast<int>(parseInteger("RAILSHARD_IB_GID_INDEX", v, 0, 255));
       }},
      {"RAILSHARD_IB_TIMEOUT", "18",
       "RDMA ACK timeout exponent: the HCA retransmits after 4.096 us * 2^n (18 = 1.07 s). "
       "With RAILSHARD_IB_RETRY_CNT it bounds how long a dead peer takes to surface as a "
       "retry-exceeded error.",
       [](Config& c, const std::string& v) {
         c.rdma.ack_timeout = static_cast<int>(parseInteger("RAILSHARD_IB_TIMEOUT", v, 1, 31));
       }},
      {"RAILSHARD_IB_RETRY_CNT", "7", "RDMA transport retries before a send fails (0-7).",
       [](Config& c, const std::string& v) {
         c.rdma.retry_cnt = static_cast<int>(parseInteger("RAILSHARD_IB_RETRY_CNT", v, 0, 7));
       }},
      {"RAILSHARD_IB_SLOTS", "16",
       "Slots of each RDMA receive ring (one ring per peer and rail, and a staging ring of the "
       "same size): the pieces a sender may have in flight on a lane.",
       [](Config& c, const std::string& v) {
         c.rdma.slots = static_cast<int>(parseInteger("RAILSHARD_IB_SLOTS", v, 2, 4096));
       }},
      {"RAILSHARD_IB_SLOT_BYTES", "256K",
       "Size of one RDMA ring slot (a piece plus its 64-byte header; multiple of 64, 4K to "
       "64M). Memory per peer and rail: 2 x slots x slot bytes.",
       [](Config& c, const std::string& v) {
         const size_t bytes = parseBytes("RAILSHARD_IB_SLOT_BYTES", v);
         if (bytes < 4096 || bytes > (size_t{64} << 20) || bytes % 64 != 0) {
           throw ConfigError("RAILSHARD_IB_SLOT_BYTES: " + v +
                             " is not a multiple of 64 between 4K and 64M");
         }
         c.rdma.slot_bytes = bytes;
       }},
      {"RAILSHARD_IB_RENDEZVOUS", "auto",
       "RDMA messages from host memory of this size or more are read by the receiver straight "
       "from the sender's buffer into its own (zero-copy; both registered for the message); "
       "smaller ones are copied through the ring slots. auto: 512K on RDMA hardware, off on "
       "software devices (Soft-RoCE, soft iWARP: measured slower there). 0 or off: never.",
       [](Config& c, const std::string& v) {
         c.rdma.rendezvous_auto = v == "auto";
         if (v == "auto") {
           c.rdma.rendezvous_bytes = 512 << 10;
         } else {
           c.rdma.rendezvous_bytes =
               v == "off" || v == "0" ? 0 : parseBytes("RAILSHARD_IB_RENDEZVOUS", v);
         }
       }},
      {"RAILSHARD_IB_RENDEZVOUS_VERB", "auto",
       "How a rendezvous message moves: read (the receiver reads the sender's buffer after "
       "one offer) or write (the receiver grants its buffer, the sender writes into it: one "
       "more message, but RDMA WRITE instead of READ). auto: read on RDMA hardware, write on "
       "software devices (rxe's READ is its slow verb). A pair that cannot read writes.",
       [](Config& c, const std::string& v) { c.rdma.rendezvous_verb = rendezvousVerbFrom(v); }},
      {"RAILSHARD_IB_READMIT_MS", "1000",
       "How often a failed RDMA lane is tried again: a new queue pair on the same rail, "
       "exchanged through the store and probed with one write before it carries traffic again. "
       "0: a failed lane stays out until the communicator is made again.",
       [](Config& c, const std::string& v) {
         c.rdma.readmit =
             std::chrono::milliseconds(parseInteger("RAILSHARD_IB_READMIT_MS", v, 0, 3600 * 1000));
       }},
      {"RAILSHARD_IB_CONNECT", "auto",
       "When a rank connects its RDMA lanes to a peer: eager (to every peer at start-up: "
       "errors and connection time there) or lazy (when the pair first sends or receives: a "
       "few store round trips on that first message; a lane pins 8 MiB of registered rings by "
       "default, so a rank that talks to few of many peers saves most of it). auto: lazy "
       "when the rank has more than 8 RDMA peers.",
       [](Config& c, const std::string& v) { c.rdma.connect = laneConnectFrom(v); }},
      {"RAILSHARD_TCP_CONNECT", "auto",
       "When a rank opens its TCP connection to a peer on another host: eager (to every such "
       "peer at start-up) or lazy (when the pair first sends or receives: the first message "
       "waits for one connection, about a round trip; a rank holds sockets only to the peers "
       "its collectives and messages use). auto: lazy when the job has more than 64 ranks.",
       [](Config& c, const std::string& v) { c.links.tcp_connect = tcpConnectFrom(v); }},
      {"RAILSHARD_ALGO", "auto",
       "All-reduce algorithm: auto (cost model), ring, recursive_doubling, shm_direct, "
       "shm_rsag, two_level, two_level_direct or two_level_leader (several hosts with several "
       "ranks each). The choice is logged at debug level.",
       [](Config& c, const std::string& v) { c.algorithm = v; }},
      {"RAILSHARD_SHM_SLOT_BYTES", "auto",
       "Shared-memory staging slot per rank and step (suffix K, M, G); larger messages are "
       "pipelined in slot-sized pieces. auto: 1M, shrunk to fit /dev/shm. Rank 0's value is "
       "used.",
       [](Config& c, const std::string& v) {
         c.shm.slot_bytes = v == "auto" ? 0 : parseBytes("RAILSHARD_SHM_SLOT_BYTES", v);
       }},
      {"RAILSHARD_P2P_SHM", "1",
       "1: point-to-point messages (send/recv) between ranks of one host go through shared "
       "memory, a large one read straight from the sender's buffer (process_vm_readv, checked "
       "at start-up; pairs where it is refused use the transports). 0: over the transports "
       "(loopback TCP).",
       [](Config& c, const std::string& v) {
         c.shm.p2p = parseInteger("RAILSHARD_P2P_SHM", v, 0, 1) == 1;
       }},
      {"RAILSHARD_SHM_SINGLE_COPY", "1M",
       "One-host all-reduces of at least this many bytes (suffix K, M, G) may read the other "
       "ranks' buffers in place instead of staging every byte through the segment: buffers "
       "from allocateSharedBuffer/empty_shared mapped once (always), others with "
       "process_vm_readv when RAILSHARD_SHM_CROSS_READ=1. Needs cross-memory reads between "
       "every pair of the host (RAILSHARD_P2P_SHM); else staged. 0: always staged.",
       [](Config& c, const std::string& v) {
         c.shm.single_copy_bytes = v == "0" ? 0 : parseBytes("RAILSHARD_SHM_SINGLE_COPY", v);
       }},
      {"RAILSHARD_SHM_CROSS_READ", "auto",
       "Whether the single copy (RAILSHARD_SHM_SINGLE_COPY) reads ordinary buffers too, with "
       "process_vm_readv, where every rank has a core and the message is at most 32 MiB. auto: "
       "as a start-up probe on each host finds faster (a 2 MiB all-reduce both ways, the slowest "
       "rank's times; logged at info, 'shm_read_probe' in the trace): it measured 1.2-1.4x the "
       "staged path on one CPU and 0.6-0.65x on another (docs/benchmarks.md). 1: always; 0: "
       "never (buffers from shared regions are read in place either way).",
       [](Config& c, const std::string& v) { c.shm.cross_read = crossReadFrom(v); }},
      {"RAILSHARD_SHARED_ALLOC", "1M",
       "With the torch backend: once a railshard group has several ranks on this host and runs "
       "its collectives through shared memory, CPU tensors of at least this many bytes (suffix "
       "K, M, G) are allocated from memory the host's other ranks map (memfd regions, kept for "
       "reuse when freed), so DDP's gradient buckets take the single copy read with plain "
       "loads (docs/pytorch.md, 'Shared CPU memory'). 0: torch's own allocator.",
       [](Config& c, const std::string& v) {
         c.shm.shared_alloc_bytes = v == "0" ? 0 : parseBytes("RAILSHARD_SHARED_ALLOC", v);
       }},
      {"RAILSHARD_SPIN_US", "2000",
       "Microseconds a shared-memory wait polls (briefly with pause, then yielding the core) "
       "before it sleeps in the kernel. Sleeping is cheap for the CPU but a wake-up can cost "
       "hundreds of microseconds on virtual machines; 0 sleeps at once.",
       [](Config& c, const std::string& v) {
         c.wait.spin = std::chrono::microseconds(parseInteger("RAILSHARD_SPIN_US", v, 0, 60000000));
       }},
      {"RAILSHARD_WAIT", "auto",
       "How a shared-memory wait passes the time before it sleeps. auto and spin: poll "
       "RAILSHARD_SPIN_US, 20 us with pause then yielding (yielding from the start with more "
       "ranks than cores). sleep: sleep after a 2 us glance.",
       [](Config& c, const std::string& v) { c.wait.mode = waitModeFrom(v); }},
      {"RAILSHARD_KERNEL_ISA", "auto",
       "Reduction kernels to use: auto (best the CPU supports), avx512, avx2 or portable. A "
       "choice the CPU cannot run is a ConfigError. Read by kernels/ itself.",
       ignore},
      {"RAILSHARD_SOCKET_IFNAME", "(automatic)",
       "Network interface whose IPv4 address this rank advertises to its peers (exact name or "
       "prefix). By default the address this rank uses to reach the store.",
       [](Config& c, const std::string& v) { c.socket_ifname = v; }},
      {"RAILSHARD_TOPO_FILE", "(discover)",
       "JSON file with the cluster graph to use instead of discovering it (same schema as "
       "railshard-topo --json). Read by rank 0 only.",
       [](Config& c, const std::string& v) { c.topo_file = v; }},
      {"RAILSHARD_TOPO_DUMP", "(none)",
       "Rank 0 writes the cluster graph the ranks agreed on to this file (JSON) at start-up.",
       [](Config& c, const std::string& v) { c.topo_dump = v; }},
      {"RAILSHARD_PROBE", "0",
       "1: measure latency and bandwidth of every rail between every pair of hosts at start-up "
       "and record them in the graph (bounded by RAILSHARD_PROBE_MS per rail).",
       [](Config& c, const std::string& v) {
         c.probe = parseInteger("RAILSHARD_PROBE", v, 0, 1) == 1;
       }},
      {"RAILSHARD_PROBE_MS", "200", "Milliseconds of bulk transfer per rail in the start-up probe.",
       [](Config& c, const std::string& v) {
         c.probe_time = std::chrono::milliseconds(parseInteger("RAILSHARD_PROBE_MS", v, 10, 60000));
       }},
      {"RAILSHARD_RAIL_WEIGHTS", "adaptive",
       "How messages between two hosts are split over their rails: adaptive (start from the "
       "topology's speeds, re-estimate from every transfer), static (the topology's speeds, "
       "never re-estimated) or equal.",
       [](Config& c, const std::string& v) { c.links.weights = railWeightsFrom(v); }},
      {"RAILSHARD_STRIPE_TCP", "0",
       "1: between two hosts that use RDMA, stripe messages over the TCP connections too, "
       "beside the RDMA lanes, by measured rate (a TCP rail on its own NIC adds its "
       "bandwidth; one on the RDMA port's own interface would only compete with it). Every "
       "rank must use the same value.",
       [](Config& c, const std::string& v) {
         c.links.stripe_tcp = parseInteger("RAILSHARD_STRIPE_TCP", v, 0, 1) == 1;
       }},
      {"RAILSHARD_SOCKETS_PER_RAIL", "1",
       "TCP connections per rail between two hosts (1-16); more can help a fast NIC that one "
       "stream cannot fill.",
       [](Config& c, const std::string& v) {
         c.links.sockets_per_rail =
             static_cast<int>(parseInteger("RAILSHARD_SOCKETS_PER_RAIL", v, 1, 16));
       }},
      {"RAILSHARD_RAIL_TIMEOUT", "2",
       "Seconds a rail may hold undelivered data without progress, while another rail to the "
       "same peer makes progress, before it is taken out and its data re-sent on the others.",
       [](Config& c, const std::string& v) {
         c.links.rail_timeout = toMillis(parseSeconds("RAILSHARD_RAIL_TIMEOUT", v));
         if (c.links.rail_timeout.count() < 10) {
           throw ConfigError("RAILSHARD_RAIL_TIMEOUT='" + v + "' must be at least 0.01 s");
         }
       }},
      {"RAILSHARD_DISPATCH_POLICY", "proportional",
       "Default dispatcher policy (DispatchOptions::fromConfig): proportional, round_robin "
       "(or equal), weighted_round_robin, least_loaded, energy.",
       [](Config& c, const std::string& v) {
         const std::set<std::string> known = {"proportional",         "round_robin",  "equal",
                                              "weighted_round_robin", "least_loaded", "energy"};
         if (known.count(v) == 0) {
           throw ConfigError("RAILSHARD_DISPATCH_POLICY='" + v +
                             "' is not one of proportional, round_robin, equal, "
                             "weighted_round_robin, least_loaded, energy");
         }
         c.dispatch_policy = v;
       }},
      {"RAILSHARD_ENERGY_BUDGET", "1.05",
       "The energy policy's step-time budget: a step may take this many times the fastest "
       "plan's time while work moves to the ranks that spend fewer joules (>= 1).",
       [](Config& c, const std::string& v) {
         char* end = nullptr;
         const double budget = std::strtod(v.c_str(), &end);
         if (v.empty() || *end != '\0' || !(budget >= 1) || budget > 100) {
           throw ConfigError("RAILSHARD_ENERGY_BUDGET='" + v + "' must be a number from 1 to 100");
         }
         c.energy_budget = budget;
       }},
      {"RAILSHARD_MEMORY_LIMIT", "(its cgroup's, else the RAM)",
       "Host memory a rank may use (suffix K, M, G); the load signals report the smallest of "
       "this, the rank's memory cgroup limit and the RAM, and the sampler caps the rank's "
       "share to what fits (docs/dispatch.md).",
       [](Config& c, const std::string& v) {
         c.memory_limit_bytes = parseBytes("RAILSHARD_MEMORY_LIMIT", v);
       }},
      {"RAILSHARD_POWER_WATTS", "(off)",
       "An emulated power source for machines without NVML or RAPL: the watts this rank draws "
       "per busy core (energy = watts x its CPU time); labelled emulated wherever shown.",
       [](Config& c, const std::string& v) {
         char* end = nullptr;
         const double watts = std::strtod(v.c_str(), &end);
         if (v.empty() || *end != '\0' || !(watts > 0) || watts > 1e5) {
           throw ConfigError("RAILSHARD_POWER_WATTS='" + v + "' must be a number of watts > 0");
         }
         c.power_watts = watts;
       }},
      {"RAILSHARD_DISPATCH_LOG_EVERY", "100",
       "The dispatcher logs its plan and the measured throughputs at info level every this "
       "many steps (0: never).",
       [](Config& c, const std::string& v) {
         c.dispatch_log_every =
             static_cast<int>(parseInteger("RAILSHARD_DISPATCH_LOG_EVERY", v, 0, 1000000000));
       }},
      {"RAILSHARD_TRACE", "(off)",
       "Directory for per-rank Chrome-trace JSON files of every collective, phase, wait, "
       "reduction, rail transfer and dispatcher plan (docs/tracing.md); written at exit.",
       [](Config& c, const std::string& v) { c.trace_dir = v; }},
      {"RAILSHARD_TRACE_EVENTS", "262144",
       "Trace events kept per process (about 100 bytes each); when full the oldest are dropped "
       "and counted.",
       [](Config& c, const std::string& v) {
         c.trace_events =
             static_cast<size_t>(parseInteger("RAILSHARD_TRACE_EVENTS", v, 1, 1000000000));
       }},
      {"RAILSHARD_METRICS", "(off)",
       "File each rank keeps its metrics in, in the Prometheus text format (rewritten "
       "atomically every RAILSHARD_METRICS_INTERVAL and at exit); {rank} is replaced by the "
       "rank.",
       [](Config& c, const std::string& v) { c.metrics_path = v; }},
      {"RAILSHARD_METRICS_INTERVAL", "5",
       "Seconds between two writes of the RAILSHARD_METRICS file (> 0).",
       [](Config& c, const std::string& v) {
         c.metrics_interval = toMillis(parseSeconds("RAILSHARD_METRICS_INTERVAL", v));
         if (c.metrics_interval.count() < 1) {
           throw ConfigError("RAILSHARD_METRICS_INTERVAL='" + v + "' must be at least 0.001 s");
         }
       }},
      {"RAILSHARD_METRICS_PORT", "(off)",
       "Each rank serves its metrics over HTTP (GET /metrics, the Prometheus text format) on "
       "this port plus its local rank, for a Prometheus server to scrape.",
       [](Config& c, const std::string& v) {
         c.metrics_port = static_cast<int>(parseInteger("RAILSHARD_METRICS_PORT", v, 1, 65535));
       }},
      {"RAILSHARD_RANK", "(set by the launcher)",
       "This process's rank, 0 <= rank < RAILSHARD_WORLD_SIZE.", ignore},
      {"RAILSHARD_WORLD_SIZE", "(set by the launcher)", "Number of ranks in the job.", ignore},
      {"RAILSHARD_LOCAL_RANK", "(set by the launcher)",
       "This process's index among the ranks on its host.", ignore},
      {"RAILSHARD_STORE_FD", "(set by railshard-launch)",
       "Internal: a listening socket railshard-launch hands to rank 0 so the store's port is "
       "reserved without a race.",
       ignore},
  };
  return table;
}

namespace {

// Each enum's names, in declaration order: name() and the parsers read the same table.
template <typename E>
struct Names {
  const char* variable;
  std::vector<std::pair<E, std::string_view>> names;

  std::string_view of(E value) const {
    for (const auto& [e, text] : names) {
      if (e == value) return text;
    }
    return "?";
  }
  E from(const std::string& text) const {
    std::string expected;
    size_t i = 0;
    for (const auto& [e, name] : names) {
      if (text == name) return e;
      expected += std::string(i == 0                  ? ""
                              : i + 1 == names.size() ? " or "
                                                      : ", ") +
                  std::string(name);
      ++i;
    }
    throw ConfigError(std::string(variable) + ": unknown value '" + text + "' (expected " +
                      expected + ")");
  }
};

const Names<TransportKind> kTransportNames{"RAILSHARD_TRANSPORT",
                                           {{TransportKind::kAuto, "auto"},
                                            {TransportKind::kTcp, "tcp"},
                                            {TransportKind::kShm, "shm"},
                                            {TransportKind::kIbverbs, "ibverbs"}}};
const Names<RailWeights> kRailWeightNames{"RAILSHARD_RAIL_WEIGHTS",
                                          {{RailWeights::kAdaptive, "adaptive"},
                                           {RailWeights::kStatic, "static"},
                                           {RailWeights::kEqual, "equal"}}};
const Names<RendezvousVerb> kRendezvousVerbNames{"RAILSHARD_IB_RENDEZVOUS_VERB",
                                                 {{RendezvousVerb::kAuto, "auto"},
                                                  {RendezvousVerb::kRead, "read"},
                                                  {RendezvousVerb::kWrite, "write"}}};
const Names<LaneConnect> kLaneConnectNames{
    "RAILSHARD_IB_CONNECT",
    {{LaneConnect::kAuto, "auto"}, {LaneConnect::kEager, "eager"}, {LaneConnect::kLazy, "lazy"}}};
const Names<LaneConnect> kTcpConnectNames{
    "RAILSHARD_TCP_CONNECT",
    {{LaneConnect::kAuto, "auto"}, {LaneConnect::kEager, "eager"}, {LaneConnect::kLazy, "lazy"}}};
const Names<WaitMode> kWaitModeNames{
    "RAILSHARD_WAIT",
    {{WaitMode::kAuto, "auto"}, {WaitMode::kSpin, "spin"}, {WaitMode::kSleep, "sleep"}}};
const Names<NcclMode> kNcclNames{
    "RAILSHARD_NCCL", {{NcclMode::kAuto, "auto"}, {NcclMode::kOn, "on"}, {NcclMode::kOff, "off"}}};
const Names<CrossRead> kCrossReadNames{
    "RAILSHARD_SHM_CROSS_READ",
    {{CrossRead::kAuto, "auto"}, {CrossRead::kOn, "1"}, {CrossRead::kOff, "0"}}};
const Names<LogLevel> kLogLevelNames{"RAILSHARD_LOG_LEVEL",
                                     {{LogLevel::kTrace, "trace"},
                                      {LogLevel::kDebug, "debug"},
                                      {LogLevel::kInfo, "info"},
                                      {LogLevel::kWarn, "warn"},
                                      {LogLevel::kError, "error"},
                                      {LogLevel::kCritical, "critical"},
                                      {LogLevel::kOff, "off"}}};

}  // namespace

std::string_view name(TransportKind kind) {
  return kTransportNames.of(kind);
}
std::string_view name(RailWeights weights) {
  return kRailWeightNames.of(weights);
}
std::string_view name(NcclMode mode) {
  return kNcclNames.of(mode);
}
std::string_view name(CrossRead mode) {
  return kCrossReadNames.of(mode);
}
CrossRead crossReadFrom(const std::string& text) {
  return kCrossReadNames.from(text);
}
std::string_view name(RendezvousVerb verb) {
  return kRendezvousVerbNames.of(verb);
}
std::string_view name(WaitMode mode) {
  return kWaitModeNames.of(mode);
}

WaitMode waitModeFrom(const std::string& text) {
  return kWaitModeNames.from(text);
}

std::string_view name(LaneConnect connect) {
  return kLaneConnectNames.of(connect);
}
std::string_view name(LogLevel level) {
  return kLogLevelNames.of(level);
}
TransportKind transportKindFrom(const std::string& text) {
  return kTransportNames.from(text);
}
RailWeights railWeightsFrom(const std::string& text) {
  return kRailWeightNames.from(text);
}
RendezvousVerb rendezvousVerbFrom(const std::string& text) {
  return kRendezvousVerbNames.from(text);
}
LaneConnect laneConnectFrom(const std::string& text) {
  return kLaneConnectNames.from(text);
}
LaneConnect tcpConnectFrom(const std::string& text) {
  return kTcpConnectNames.from(text);
}
NcclMode ncclModeFrom(const std::string& text) {
  return kNcclNames.from(text);
}
LogLevel logLevelFrom(const std::string& text) {
  return kLogLevelNames.from(text);
}

Config Config::fromEnvironment(const std::map<std::string, std::string>* env) {
  std::map<std::string, std::string> process_env;
  if (env == nullptr) {
    for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
      const std::string text(*entry);
      const auto eq = text.find('=');
      if (eq != std::string::npos) process_env[text.substr(0, eq)] = text.substr(eq + 1);
    }
    env = &process_env;
  }
  Config config;
  for (const auto& variable : variables()) {
    auto it = env->find(variable.name);
    if (it != env->end()) variable.apply(config, it->second);
  }
  return config;
}

std::string Config::describe() const {
  std::ostringstream out;
  out << "log_level=" << name(log_level) << " timeout=" << timeout.count() / 1000.0 << "s"
      << " connect_timeout=" << connect_timeout.count() / 1000.0 << "s"
      << " heartbeat_timeout=" << links.heartbeat_timeout.count() / 1000.0 << "s"
      << " chunk_bytes=" << chunk_bytes << " transport=" << name(transport)
      << " algorithm=" << algorithm << " nccl=" << name(nccl)
      << " shm_slot_bytes=" << shm.slot_bytes << " p2p_shm=" << shm.p2p
      << " shm_single_copy_bytes=" << shm.single_copy_bytes
      << " shm_cross_read=" << name(shm.cross_read)
      << " shared_alloc_bytes=" << shm.shared_alloc_bytes
      << " ib_hca=" << (rdma.hca.empty() ? "-" : rdma.hca) << " ib_gid_index=" << rdma.gid_index
      << " ib_timeout=" << rdma.ack_timeout << " ib_retry_cnt=" << rdma.retry_cnt
      << " ib_slots=" << rdma.slots << " ib_slot_bytes=" << rdma.slot_bytes << " ib_rendezvous="
      << (rdma.rendezvous_auto ? std::string("auto") : std::to_string(rdma.rendezvous_bytes))
      << " ib_rendezvous_verb=" << name(rdma.rendezvous_verb)
      << " ib_readmit=" << rdma.readmit.count() << "ms ib_connect=" << name(rdma.connect)
      << " wait=" << name(wait.mode) << " store_addr=" << (store_addr.empty() ? "-" : store_addr)
      << " socket_ifname=" << (socket_ifname.empty() ? "-" : socket_ifname)
      << " topo_file=" << (topo_file.empty() ? "-" : topo_file) << " probe=" << (probe ? "1" : "0")
      << " rail_weights=" << name(links.weights) << " stripe_tcp=" << (links.stripe_tcp ? "1" : "0")
      << " sockets_per_rail=" << links.sockets_per_rail
      << " tcp_connect=" << name(links.tcp_connect)
      << " rail_timeout=" << links.rail_timeout.count() / 1000.0 << "s"
      << " trace=" << (trace_dir.empty() ? "-" : trace_dir) << " trace_events=" << trace_events
      << " metrics=" << (metrics_path.empty() ? "-" : metrics_path)
      << " metrics_port=" << metrics_port << " dispatch_policy=" << dispatch_policy
      << " energy_budget=" << energy_budget << " memory_limit=" << memory_limit_bytes
      << " power_watts=" << power_watts << " token=" << (token.empty() ? "none" : "set");
  return out.str();
}

}  // namespace railshard
