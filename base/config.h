#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace railshard {

// RAILSHARD_TRANSPORT: what carries messages between ranks (docs/configuration.md).
enum class TransportKind : uint8_t { kAuto, kTcp, kShm, kIbverbs };
// RAILSHARD_RAIL_WEIGHTS: how a message between two hosts is split over their rails.
enum class RailWeights : uint8_t { kAdaptive, kStatic, kEqual };
// RAILSHARD_IB_RENDEZVOUS_VERB: how a large RDMA message moves in place (docs/rdma.md).
enum class RendezvousVerb : uint8_t { kAuto, kRead, kWrite };
// When RDMA lanes to a peer are connected: all at start-up, or when the pair first talks.
enum class LaneConnect : uint8_t { kAuto, kEager, kLazy };
// How a shared-memory wait passes the time (RAILSHARD_WAIT; transport/messaging/wait_policy.h).
enum class WaitMode : uint8_t { kAuto, kSpin, kSleep };
// RAILSHARD_NCCL: NCCL inside a host for device all-reduces (docs/gpu.md).
enum class NcclMode : uint8_t { kAuto, kOn, kOff };
// RAILSHARD_SHM_CROSS_READ: whether the single copy reads ordinary buffers with
// process_vm_readv; kAuto: as a start-up probe on the host finds faster.
enum class CrossRead : uint8_t { kAuto, kOn, kOff };
// RAILSHARD_LOG_LEVEL, least to most severe; kOff logs nothing.
enum class LogLevel : uint8_t { kTrace, kDebug, kInfo, kWarn, kError, kCritical, kOff };

// "auto", "tcp", ...: the names the variables take (the same as spdlog's for LogLevel).
std::string_view name(TransportKind kind);
std::string_view name(RailWeights weights);
std::string_view name(NcclMode mode);
std::string_view name(CrossRead mode);
std::string_view name(RendezvousVerb verb);
std::string_view name(LaneConnect connect);
std::string_view name(WaitMode mode);
std::string_view name(LogLevel level);
// From those names; ConfigError naming the variable, the value and the names it takes.
TransportKind transportKindFrom(const std::string& text);
RailWeights railWeightsFrom(const std::string& text);
NcclMode ncclModeFrom(const std::string& text);
CrossRead crossReadFrom(const std::string& text);
RendezvousVerb rendezvousVerbFrom(const std::string& text);
LaneConnect laneConnectFrom(const std::string& text);
LaneConnect tcpConnectFrom(const std::string& text);  // RAILSHARD_TCP_CONNECT's names
WaitMode waitModeFrom(const std::string& text);
LogLevel logLevelFrom(const std::string& text);

// The parts of Config that parts of the library are made from: each takes its own struct
// whole (the messenger its LinkConfig, the RDMA driver its RdmaConfig, ...), so a new variable
// reaches its part without being copied field by field on the way.

// How a messenger uses the links to its peer (transport/messaging, docs/multirail.md).
struct LinkConfig {
  RailWeights weights = RailWeights::kAdaptive;  // RAILSHARD_RAIL_WEIGHTS
  bool stripe_tcp = false;   // RAILSHARD_STRIPE_TCP: RDMA pairs also stripe over their TCP rails
  int sockets_per_rail = 1;  // RAILSHARD_SOCKETS_PER_RAIL
  // RAILSHARD_TCP_CONNECT: when the TCP connection of a pair is made (start-up or first use).
  LaneConnect tcp_connect = LaneConnect::kAuto;
  // RAILSHARD_RAIL_TIMEOUT: a data link busy without progress this long, while another
  // delivered, is taken out.
  std::chrono::milliseconds rail_timeout{2000};
  // RAILSHARD_HEARTBEAT_TIMEOUT: a peer heard nothing from for this long is declared lost
  // (a stopped process, a stuck host); 0 disables the heartbeat.
  std::chrono::milliseconds heartbeat_timeout{std::chrono::seconds(10)};
};

// RDMA lanes (transport/links/ibverbs, docs/rdma.md).
struct RdmaConfig {
  std::string hca;                // RAILSHARD_IB_HCA: "mlx5_0,mlx5_1:1"; empty = every device
  int gid_index = -1;             // RAILSHARD_IB_GID_INDEX; -1 = choose
  int ack_timeout = 18;           // RAILSHARD_IB_TIMEOUT: 4.096 us * 2^n ACK timeout
  int retry_cnt = 7;              // RAILSHARD_IB_RETRY_CNT
  int slots = 16;                 // RAILSHARD_IB_SLOTS: receive ring slots per peer and rail
  size_t slot_bytes = 256 << 10;  // RAILSHARD_IB_SLOT_BYTES
  // RAILSHARD_IB_RENDEZVOUS: host messages of this many bytes or more move in place
  // (zero-copy); 0 = every message through the staging slots.
  size_t rendezvous_bytes = 512 << 10;
  bool rendezvous_auto = true;  // "auto": 512K, but not on software devices
  RendezvousVerb rendezvous_verb = RendezvousVerb::kAuto;  // RAILSHARD_IB_RENDEZVOUS_VERB
  std::chrono::milliseconds readmit{1000};                 // RAILSHARD_IB_READMIT_MS; 0 = never
  LaneConnect connect = LaneConnect::kAuto;                // RAILSHARD_IB_CONNECT
};

// Shared memory between the ranks of one host (links/shm, core/collectives/shm_engine.h).
struct ShmConfig {
  size_t slot_bytes = 0;  // 0 = automatic (see RAILSHARD_SHM_SLOT_BYTES)
  bool p2p = true;        // RAILSHARD_P2P_SHM: same-host messages through shared memory
  size_t single_copy_bytes = size_t{1} << 20;  // RAILSHARD_SHM_SINGLE_COPY; 0 = never
  CrossRead cross_read = CrossRead::kAuto;     // RAILSHARD_SHM_CROSS_READ
  // RAILSHARD_SHARED_ALLOC: CPU tensors of at least this many bytes from shared regions once a
  // railshard group has several ranks on this host (python/csrc/shared_allocator.h); 0 = never
  size_t shared_alloc_bytes = size_t{1} << 20;
};

// How every wait of the library passes the time (transport/messaging/wait_policy.h).
struct WaitConfig {
  std::chrono::microseconds spin{2000};  // RAILSHARD_SPIN_US: poll this long before sleeping
  WaitMode mode = WaitMode::kAuto;       // RAILSHARD_WAIT
};

// All tunables in one place. Filled from RAILSHARD_* environment variables (see
// docs/configuration.md, which a test keeps in sync with variables()).
struct Config {
  LogLevel log_level = LogLevel::kWarn;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};
  size_t chunk_bytes = size_t{1} << 20;
  std::string token;            // job token; empty only for in-process (thread) communicators
  std::string store_addr;       // host:port of the rendezvous store
  bool store_external = false;  // RAILSHARD_STORE_EXTERNAL: no rank hosts the store
  TransportKind transport = TransportKind::kAuto;
  std::string algorithm = "auto";   // RAILSHARD_ALGO: auto or a name from the tuner
  NcclMode nccl = NcclMode::kAuto;  // RAILSHARD_NCCL
  LinkConfig links;
  RdmaConfig rdma;
  ShmConfig shm;
  WaitConfig wait;
  std::string socket_ifname;  // interface (prefix) whose address peers connect to
  std::string topo_file;      // RAILSHARD_TOPO_FILE: load the cluster graph from here
  std::string topo_dump;      // RAILSHARD_TOPO_DUMP: rank 0 writes the graph here
  bool probe = false;         // RAILSHARD_PROBE: measure every rail at start-up
  std::chrono::milliseconds probe_time{200};     // bulk-transfer time per rail in the probe
  std::string dispatch_policy = "proportional";  // RAILSHARD_DISPATCH_POLICY
  int dispatch_log_every = 100;  // RAILSHARD_DISPATCH_LOG_EVERY: plan at info level every N steps
  std::string trace_dir;         // RAILSHARD_TRACE: per-rank trace files go here; "" = off
  size_t trace_events = 262144;  // RAILSHARD_TRACE_EVENTS: events kept per process
  // RAILSHARD_METRICS: Prometheus text file kept fresh (base/metrics.h); "{rank}" in it is
  // the caller's to replace. "" = off.
  std::string metrics_path;
  std::chrono::milliseconds metrics_interval{5000};  // RAILSHARD_METRICS_INTERVAL
  int metrics_port = 0;  // RAILSHARD_METRICS_PORT: HTTP /metrics on port + local rank; 0 = off
  double energy_budget = 1.05;    // RAILSHARD_ENERGY_BUDGET: the energy policy's step-time budget
  size_t memory_limit_bytes = 0;  // RAILSHARD_MEMORY_LIMIT: memory a rank may use; 0 = its own
  double power_watts = 0;         // RAILSHARD_POWER_WATTS: emulated draw per busy core; 0 = off

  // Metrics are kept (a RAILSHARD_METRICS file or a RAILSHARD_METRICS_PORT to scrape).
  bool metricsOn() const { return !metrics_path.empty() || metrics_port > 0; }

  // Reads every variable of variables() from `env` (the process environment when null).
  // A malformed value is a ConfigError naming the variable and the value.
  static Config fromEnvironment(const std::map<std::string, std::string>* env = nullptr);

  struct Variable {
    std::string name;
    std::string default_value;
    std::string doc;
    // Parses `value` into `config`; throws ConfigError on a bad value.
    std::function<void(Config& config, const std::string& value)> apply;
  };
  // The table behind fromEnvironment(), in documentation order. Variables that describe the
  // launch (rank, world size, store address) are listed too, with apply doing what belongs
  // in Config and the launcher reading the rest itself.
  static const std::vector<Variable>& variables();

  // "name=value" lines for the start-up debug log.
  std::string describe() const;
};

// Parsers shared by Config and the launcher; each throws ConfigError naming `what`.
long long parseInteger(const std::string& what, const std::string& value, long long min,
                       long long max);
double parseSeconds(const std::string& what, const std::string& value);
size_t parseBytes(const std::string& what, const std::string& value);  // "4M", "512K", "1024"

}  // namespace railshard
