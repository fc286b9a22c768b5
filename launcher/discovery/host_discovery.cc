#include "launcher/discovery/host_discovery.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <map>
#include <set>

#include "base/error.h"
#include "base/logging.h"
#include "launcher/discovery/cpu_scan.h"
#include "launcher/discovery/ip_network.h"
#include "launcher/discovery/nic_selection.h"
#include "launcher/discovery/nvml_scan.h"
#include "launcher/discovery/pci_scan.h"
#include "launcher/discovery/sysfs_net.h"

// The graph one host contributes, in the conventions the merge and the queries rely on:
//   host        "<host>"                    kHost
//   NUMA node   "<host>/numa<N>"            N = OS index; at least one; kCpuInterconnect
//                                           between every pair
//   PCIe switch "<host>/pcisw<K>"           K counts switches with a GPU or NIC below, in bus-id
//                                           order of the upstream port; kPcie to its NUMA node
//                                           or to the switch above it
//   GPU         "<host>/gpu<i>"             i = ordinal in PCI bus-id order; kPcie to its switch
//                                           (else NUMA node); kNvLink per GPU pair
//   NIC         "<host>/<ifname>"           or "<host>/<rdma device>" for an RDMA port without a
//                                           netdev; kPcie to switch/NUMA node, kLoopback (lo)
//                                           or kVirtual to the first NUMA node
//   network     "net:<subnet>/<prefix>"     per usable NIC address; kEthernet, kRoce or
//               "ib:<GID subnet prefix>"    kInfiniBand from the NIC
namespace railshard::launcher::discovery {

using topology::Link;
using topology::LinkKind;
using topology::LinkLayer;
using topology::Topology;
using topology::Vertex;
using topology::VertexKind;

namespace {

std::string localHostname() {
  char name[HOST_NAME_MAX + 1] = {0};
  if (::gethostname(name, sizeof(name)) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// A NIC on its way into the graph, with what placing it needs.
struct NicDraft {
  Vertex vertex;
  NicFacts facts;
  std::string default_reason;  // the reason without any RAILSHARD_SOCKET_IFNAME, for errors
  bool loopback = false;
  LinkLayer rdma_link_layer = LinkLayer::kUnknown;
  std::string gid_prefix;
};

class HostGraphBuilder {
 public:
  HostGraphBuilder(const DiscoveryOptions& options, std::string host)
      : options_(options), host_(std::move(host)) {}

  Topology build() {
    const CpuInfo cpu = scanCpus(options_.sysfs_root, options_.use_hwloc);
    pci_ = PciTree::scan(options_.sysfs_root);
    const NetScan net = scanNetwork(options_.sysfs_root);
    const std::vector<InterfaceAddress> addresses =
        options_.addresses ? *options_.addresses : listInterfaceAddresses();
    std::vector<NvmlGpu> nvml;
    if (options_.use_nvml && options_.sysfs_root == "/sys") {
      nvml = scanNvml();
    } else if (options_.use_nvml) {
      RS_LOG_DEBUG("discovery: sysfs root is {}, not /sys; NVML skipped", options_.sysfs_root);
    }

    // NICs first: a RAILSHARD_SOCKET_IFNAME that selects nothing fails before any work.
    std::vector<NicDraft> nics = draftNics(net, addresses);
    checkSelection(nics);

    addHost(cpu);
    addNuma(cpu);
    addGpusAndSwitches(nics, nvml);
    for (const auto& nic : nics) addNic(nic);
    RS_LOG_DEBUG("discovery: host {}: {} NUMA node(s), {} GPU(s), {} NIC(s), source {}", host_,
                 cpu.numa.size(), graph_.vertices(VertexKind::kGpu, host_).size(), nics.size(),
                 cpu.source);
    return std::move(graph_);
  }

 private:
  std::string id(const std::string& local) const { return host_ + "/" + local; }

  // A NIC vertex with what sysfs says about it; the caller adds addresses and MTU.
  NicDraft nicDraft(const std::string& local, LinkLayer layer, double speed_gbps, bool up,
                    const std::string& pci, const std::string& rdma_device, int rdma_port) const {
    NicDraft draft;
    Vertex& v = draft.vertex;
    v.id = id(local);
    v.kind = VertexKind::kNic;
    v.host = host_;
    v.name = local;
    v.link_layer = layer;
    v.speed_gbps = speed_gbps;
    v.up = up;
    v.pci = pci;
    v.rdma_device = rdma_device;
    v.rdma_port = rdma_port;
    return draft;
  }

  void link(const std::string& a, const std::string& b, LinkKind kind, double gbps, int lanes = 0) {
    Link l;
    l.a = a;
    l.b = b;
    l.kind = kind;
    l.nominal_gbps = gbps;
    l.lanes = lanes;
    graph_.addLink(std::move(l));
  }

  void addHost(const CpuInfo& cpu) {
    Vertex host;
    host.id = host_;
    host.kind = VertexKind::kHost;
    host.host = host_;
    host.name = host_;
    host.cores = cpu.cores;
    host.threads = cpu.threads;
    host.memory_bytes = cpu.memory_bytes;
    graph_.addVertex(std::move(host));
  }

  void addNuma(const CpuInfo& cpu) {
    for (const auto& node : cpu.numa) {
      Vertex numa;
      numa.id = id("numa" + std::to_string(node.index));
      numa.kind = VertexKind::kNuma;
      numa.host = host_;
      numa.name = "numa" + std::to_string(node.index);
      numa.index = node.index;
      numa.cores = node.cores;
      numa.threads = node.threads;
      numa.cpus = node.cpus;
      numa.memory_bytes = node.memory_bytes;
      numa_ids_[node.index] = numa.id;
      graph_.addVertex(std::move(numa));
    }
    for (auto x = numa_ids_.begin(); x != numa_ids_.end(); ++x) {
      for (auto y = std::next(x); y != numa_ids_.end(); ++y) {
        link(x->second, y->second, LinkKind::kCpuInterconnect, 0);  // speed unknown
      }
    }
  }

  // The vertex for a NUMA node the firmware named; the first node when it named none (-1)
  // or one that has no vertex.
  std::string numaVertex(int node) const {
    const auto it = numa_ids_.find(node);
    return it != numa_ids_.end() ? it->second : numa_ids_.begin()->second;
  }

  // Where a PCI device attaches: its switch, else its NUMA node.
  std::string pciParent(const std::string& bus_id) const {
    const std::string sw = pci_.switchAbove(bus_id);
    if (!sw.empty() && switch_ids_.count(sw) != 0) return switch_ids_.at(sw);
    const PciDevice* device = pci_.find(bus_id);
    return numaVertex(device != nullptr ? device->numa_node : -1);
  }

  void addGpusAndSwitches(const std::vector<NicDraft>& nics, const std::vector<NvmlGpu>& nvml) {
    // GPUs from the PCI scan, plus any NVML knows that sysfs did not show.
    std::map<std::string, const NvmlGpu*> nvml_by_bus;
    for (const auto& gpu : nvml) nvml_by_bus[gpu.bus_id] = &gpu;
    std::set<std::string> gpu_buses;
    for (const PciDevice* gpu : pci_.gpus()) gpu_buses.insert(gpu->bus_id);
    for (const auto& [bus, gpu] : nvml_by_bus) gpu_buses.insert(bus);

    std::vector<std::string> endpoints(gpu_buses.begin(), gpu_buses.end());
    for (const auto& nic : nics) {
      if (!nic.vertex.pci.empty()) endpoints.push_back(nic.vertex.pci);
    }
    // Switches in bus-id order of their upstream ports; a switch's parent has a lower bus
    // number than its children, but all are named before any is linked, to be safe.
    const std::vector<PciSwitch> switches = pci_.switchesAbove(endpoints);
    for (const PciSwitch& sw : switches) {
      const std::string local = "pcisw" + std::to_string(switch_ids_.size());
      Vertex vertex;
      vertex.id = id(local);
      vertex.kind = VertexKind::kPciSwitch;
      vertex.host = host_;
      vertex.name = local;
      vertex.pci = sw.upstream;
      switch_ids_[sw.upstream] = vertex.id;
      graph_.addVertex(std::move(vertex));
    }
    for (const PciSwitch& sw : switches) {
      // The upstream port's own link is the switch's uplink.
      const PciDevice* port = pci_.find(sw.upstream);
      const std::string above =
          sw.parent.empty() ? numaVertex(sw.numa_node) : switch_ids_.at(sw.parent);
      link(switch_ids_.at(sw.upstream), above, LinkKind::kPcie,
           port != nullptr ? port->link_gbps : 0, port != nullptr ? port->link_width : 0);
    }

    int index = 0;
    for (const auto& bus : gpu_buses) {
      const PciDevice* device = pci_.find(bus);
      const auto nv = nvml_by_bus.find(bus);
      Vertex gpu;
      gpu.id = id("gpu" + std::to_string(index));
      gpu.kind = VertexKind::kGpu;
      gpu.host = host_;
      gpu.index = index++;
      gpu.pci = bus;
      if (nv != nvml_by_bus.end()) {
        gpu.name = nv->second->name;
        gpu.memory_bytes = nv->second->memory_bytes;
      }
      if (gpu.name.empty() && device != nullptr) gpu.name = genericGpuName(*device);
      if (gpu.memory_bytes == 0 && device != nullptr) gpu.memory_bytes = device->memory_bytes;
      gpu_ids_[bus] = gpu.id;
      const std::string gpu_id = gpu.id;
      graph_.addVertex(std::move(gpu));
      link(gpu_id, pciParent(bus), LinkKind::kPcie, device != nullptr ? device->link_gbps : 0,
           device != nullptr ? device->link_width : 0);
    }
    for (const NvLinkPair& pair : nvlinkPairs(nvml)) {
      if (gpu_ids_.count(pair.a) == 0 || gpu_ids_.count(pair.b) == 0) continue;
      link(gpu_ids_.at(pair.a), gpu_ids_.at(pair.b), LinkKind::kNvLink,
           pair.lanes * pair.gbps_per_lane, pair.lanes);
    }
  }

  static std::string genericGpuName(const PciDevice& device) {
    char text[32];
    std::snprintf(text, sizeof(text), "%04x:%04x", device.vendor, device.device);
    return std::string(device.vendor == 0x10de ? "NVIDIA GPU " : "AMD GPU ") + text;
  }

  std::vector<NicDraft> draftNics(const NetScan& net,
                                  const std::vector<InterfaceAddress>& addresses) const {
    std::map<std::string, std::vector<const InterfaceAddress*>> by_name;
    for (const auto& address : addresses) by_name[address.name].push_back(&address);
    std::map<std::pair<std::string, int>, const RdmaPort*> ports;
    for (const auto& port : net.rdma_ports) ports[{port.device, port.port}] = &port;

    std::vector<NicDraft> drafts;
    for (const auto& nic : net.interfaces) {
      NicDraft draft = nicDraft(nic.name, nic.link_layer, nic.speed_gbps, nic.up, nic.pci,
                                nic.rdma_device, nic.rdma_port);
      Vertex& v = draft.vertex;
      v.mtu = nic.mtu;
      bool has_address = false;
      for (const InterfaceAddress* address : by_name[nic.name]) {
        if (address->ipv6 && isIpv6LinkLocal(address->address)) continue;
        v.addresses.push_back(address->address + "/" + std::to_string(address->prefix_length));
        has_address = true;
      }
      std::sort(v.addresses.begin(), v.addresses.end());
      draft.loopback = nic.link_layer == LinkLayer::kLoopback;
      if (!nic.rdma_device.empty()) {
        const RdmaPort* port = ports.at({nic.rdma_device, nic.rdma_port});
        draft.rdma_link_layer = port->link_layer;
        draft.gid_prefix = port->gid_prefix;
      }
      draft.facts = {nic.name,
                     nic.up,
                     draft.loopback,
                     isBridgeOrContainer(nic.name, nic.is_bridge, nic.has_master),
                     !nic.rdma_device.empty(),
                     has_address};
      drafts.push_back(std::move(draft));
    }
    // RDMA ports no netdev claims (native InfiniBand without IPoIB, or a netdev in another
    // namespace): NICs of their own, named after the device.
    std::map<std::string, int> unmapped_per_device;
    for (const auto& port : net.rdma_ports) {
      if (!claimed(net, port)) ++unmapped_per_device[port.device];
    }
    for (const auto& port : net.rdma_ports) {
      if (claimed(net, port)) continue;
      const std::string local = unmapped_per_device[port.device] > 1
                                    ? port.device + "_port" + std::to_string(port.port)
                                    : port.device;
      NicDraft draft = nicDraft(local, port.link_layer, port.rate_gbps, port.active, port.pci,
                                port.device, port.port);
      draft.rdma_link_layer = port.link_layer;
      draft.gid_prefix = port.gid_prefix;
      draft.facts = {local, port.active, false, false, true, false};
      drafts.push_back(std::move(draft));
    }
    for (auto& draft : drafts) {
      draft.default_reason = exclusionReason(draft.facts, "");
      draft.vertex.excluded = exclusionReason(draft.facts, options_.socket_ifname);
    }
    return drafts;
  }

  static bool claimed(const NetScan& net, const RdmaPort& port) {
    return std::any_of(net.interfaces.begin(), net.interfaces.end(), [&](const NetInterface& n) {
      return n.rdma_device == port.device && n.rdma_port == port.port;
    });
  }

  void checkSelection(const std::vector<NicDraft>& nics) const {
    if (options_.socket_ifname.empty()) return;
    for (const auto& nic : nics) {
      if (nic.vertex.excluded.empty()) return;
    }
    std::string list;
    for (const auto& nic : nics) {
      list += (list.empty() ? "" : ", ") + nic.vertex.name;
      if (!nic.default_reason.empty()) list += " (" + nic.default_reason + ")";
    }
    throw ConfigError("RAILSHARD_SOCKET_IFNAME='" + options_.socket_ifname +
                      "' selects no usable interface on host " + host_ +
                      "; interfaces here: " + (list.empty() ? "(none)" : list));
  }

  void addNic(const NicDraft& draft) {
    const Vertex& nic = draft.vertex;
    graph_.addVertex(nic);
    if (draft.loopback) {
      link(nic.id, numaVertex(-1), LinkKind::kLoopback, 0);
    } else if (!nic.pci.empty()) {
      const PciDevice* device = pci_.find(nic.pci);
      link(nic.id, pciParent(nic.pci), LinkKind::kPcie, device != nullptr ? device->link_gbps : 0,
           device != nullptr ? device->link_width : 0);
    } else {
      link(nic.id, numaVertex(-1), LinkKind::kVirtual, 0);
    }
    if (!nic.excluded.empty() || draft.loopback) return;

    LinkKind ip_kind = LinkKind::kEthernet;
    if (nic.link_layer == LinkLayer::kInfiniBand) {
      ip_kind = LinkKind::kInfiniBand;
    } else if (nic.link_layer == LinkLayer::kEthernet && !nic.rdma_device.empty()) {
      ip_kind = LinkKind::kRoce;
    }
    std::set<std::string> joined;
    for (const auto& cidr : nic.addresses) {
      std::string network;
      try {
        network = topology::networkIdOf(cidr);
      } catch (const InvalidArgument&) {
        continue;
      }
      if (!joined.insert(network).second) continue;  // two addresses in one subnet
      addNetwork(network, network.substr(4), nic.link_layer);
      link(nic.id, network, ip_kind, nic.speed_gbps);
    }
    if (draft.rdma_link_layer == LinkLayer::kInfiniBand && !draft.gid_prefix.empty()) {
      const std::string fabric = "ib:" + draft.gid_prefix;
      addNetwork(fabric, draft.gid_prefix, LinkLayer::kInfiniBand);
      link(nic.id, fabric, LinkKind::kInfiniBand, nic.speed_gbps);
    }
  }

  void addNetwork(const std::string& network_id, const std::string& name, LinkLayer layer) {
    if (graph_.find(network_id) != nullptr) return;  // another NIC of this host is on it
    Vertex network;
    network.id = network_id;
    network.kind = VertexKind::kNetwork;
    network.name = name;
    network.link_layer = layer;
    graph_.addVertex(std::move(network));
  }

  const DiscoveryOptions& options_;
  const std::string host_;
  Topology graph_;
  PciTree pci_;
  std::map<int, std::string> numa_ids_;            // OS index -> vertex id
  std::map<std::string, std::string> switch_ids_;  // upstream bus id -> vertex id
  std::map<std::string, std::string> gpu_ids_;     // bus id -> vertex id
};

}  // namespace

topology::Topology discoverHost(const DiscoveryOptions& options) {
  const std::string host = options.hostname.empty() ? localHostname() : options.hostname;
  return HostGraphBuilder(options, host).build();
}

}  // namespace railshard::launcher::discovery
