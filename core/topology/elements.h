#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace railshard::topology {

// What a vertex of the cluster graph stands for.
enum class VertexKind {
  kHost,       // one machine (an OS instance); a container for the vertices below
  kNuma,       // a NUMA node / CPU package with its cores and memory
  kPciSwitch,  // a PCIe switch (a bridge below the root complex) that GPUs and NICs hang off
  kGpu,        // an accelerator
  kNic,        // a network interface: Ethernet, IPoIB, RoCE or InfiniBand (RDMA device)
  kNetwork,    // an IP subnet ("10.1.0.0/24") or an InfiniBand fabric; NICs on it can talk
};

// What a link is made of. Nominal bandwidths are per direction.
enum class LinkKind {
  kNvLink,           // GPU <-> GPU (or NVSwitch)
  kPcie,             // device <-> switch / NUMA node
  kCpuInterconnect,  // NUMA <-> NUMA: QPI/UPI/Infinity Fabric
  kEthernet,         // NIC <-> network (IP over Ethernet)
  kInfiniBand,       // NIC <-> fabric (native IB or IPoIB)
  kRoce,             // NIC <-> network: RDMA over Converged Ethernet
  kLoopback,         // the loopback interface <-> its host
  kShm,              // shared memory between processes on one NUMA node (paths only)
  kVirtual,          // a virtual device (veth, virtio without PCI info) <-> its host
};

// The layer-2 technology of a NIC or network.
enum class LinkLayer { kUnknown, kEthernet, kInfiniBand, kLoopback };

// How a pair of ranks exchanges data, derived from the path between them.
enum class PathTransport {
  kSelf,    // the same rank
  kShm,     // same host: shared memory
  kNvLink,  // same host, both on GPUs joined by NVLink (CUDA IPC)
  kRdma,    // different hosts over an InfiniBand/RoCE rail
  kTcp,     // different hosts over an IP rail
};

std::string_view name(VertexKind kind);
std::string_view name(LinkKind kind);
std::string_view name(LinkLayer layer);
std::string_view name(PathTransport transport);
// Inverse of name(); false for unknown text.
bool parse(std::string_view text, VertexKind& out);
bool parse(std::string_view text, LinkKind& out);
bool parse(std::string_view text, LinkLayer& out);

// One vertex. A flat value: the fields that do not apply to a kind stay at their defaults
// (and are left out of the JSON).
struct Vertex {
  std::string id;  // unique; "<host>" for hosts, "<host>/<local>" inside one, "net:..." else
  VertexKind kind = VertexKind::kHost;
  std::string host;  // id of the host this vertex belongs to; empty for networks
  std::string name;  // hostname, "numa0", GPU model, interface name, subnet

  int index = -1;             // NUMA OS index, GPU ordinal
  int cores = 0;              // host/NUMA: physical cores
  int threads = 0;            // host/NUMA: hardware threads
  std::string cpus;           // NUMA: CPU list as in sysfs, "0-15,32-47"
  uint64_t memory_bytes = 0;  // host/NUMA/GPU; 0 = unknown
  std::string pci;            // GPU/NIC/switch: PCI bus id "0000:17:00.0"

  // NICs and networks.
  LinkLayer link_layer = LinkLayer::kUnknown;
  double speed_gbps = 0;               // NIC nominal speed; 0 = unknown
  int mtu = 0;                         // NIC
  bool up = false;                     // NIC: operstate up (or unknown with carrier)
  std::vector<std::string> addresses;  // NIC: "10.1.0.1/24", "fe80::1/64"; sorted
  std::string rdma_device;             // NIC: "mlx5_0" when it is (also) an RDMA port
  int rdma_port = 0;                   // NIC: port number on rdma_device
  std::string excluded;                // NIC: why it carries no traffic; empty = usable

  bool operator==(const Vertex&) const = default;
};

// An undirected link between two vertices; a < b in canonical order.
struct Link {
  std::string a;
  std::string b;
  LinkKind kind = LinkKind::kPcie;
  double nominal_gbps = 0;   // 0 = unknown
  int lanes = 0;             // NVLink links / PCIe lanes when known
  double measured_gbps = 0;  // from the link probe; 0 = not measured
  double latency_us = 0;     // from the link probe; 0 = not measured

  bool operator==(const Link&) const = default;
};

// Where one rank runs. Ids refer to vertices; gpu is empty on hosts without one.
struct RankPlacement {
  int rank = 0;
  std::string host;
  int local_rank = 0;
  std::string numa;
  std::string gpu;

  bool operator==(const RankPlacement&) const = default;
};

// A usable pair of interfaces between two hosts: one NIC on each, on a shared network.
struct Rail {
  std::string nic_a;      // NIC vertex on host A
  std::string nic_b;      // NIC vertex on host B
  std::string address_a;  // IP address (no prefix) on nic_a in `network`; empty for native IB
  std::string address_b;
  std::string network;                  // network vertex id
  LinkKind kind = LinkKind::kEthernet;  // kEthernet, kInfiniBand or kRoce
  bool rdma = false;                    // both ends are RDMA ports on this network
  double nominal_gbps = 0;              // the slower NIC's speed; 0 = unknown
  double measured_gbps = 0;             // probed; 0 = not measured
  double latency_us = 0;                // probed one-way latency; 0 = not measured

  // What the rail scheduler should plan with: the measurement when there is one.
  double gbps() const { return measured_gbps > 0 ? measured_gbps : nominal_gbps; }
  bool operator==(const Rail&) const = default;
};

// The best way between two ranks.
struct Path {
  PathTransport transport = PathTransport::kSelf;
  std::vector<std::string> vertices;  // from rank a's anchor (GPU, else NUMA) to rank b's
  std::vector<LinkKind> links;        // one per hop; kShm for two ranks on one NUMA node
  double bandwidth_gbps = 0;          // the narrowest link with a known speed; 0 = unknown
  std::optional<Rail> rail;           // the rail taken between hosts
};

// What is near a rank: its NUMA node, its GPU and the NICs closest to it (same PCIe switch,
// then same NUMA node, then the rest of the host), fastest first within each group.
struct Affinity {
  std::string host;
  std::string numa;
  std::string gpu;
  std::vector<std::string> nics;
};

}  // namespace railshard::topology

namespace railshard::topology {

// The id of the network vertex an interface address belongs to: "10.1.0.7/24" ->
// "net:10.1.0.0/24", "fd00::5/64" -> "net:fd00::/64". InvalidArgument for a malformed address.
std::string networkIdOf(const std::string& cidr);

}  // namespace railshard::topology
