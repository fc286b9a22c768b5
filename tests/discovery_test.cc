// Host discovery on a fake sysfs tree modelling a two-socket GPU server with RoCE and
// InfiniBand NICs, and its pieces (this machine: discovery_real_host_test.cc).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "base/error.h"
#include "core/topology/topology.h"
#include "launcher/discovery/host_discovery.h"
#include "launcher/discovery/ip_network.h"
#include "launcher/discovery/nvml_scan.h"
#include "launcher/discovery/pci_scan.h"
#include "launcher/interfaces.h"

namespace railshard::launcher::discovery {
namespace {

namespace fs = std::filesystem;
using testing::HasSubstr;
using topology::LinkKind;
using topology::LinkLayer;
using topology::Topology;
using topology::Vertex;
using topology::VertexKind;

// ---- helpers ----

std::vector<std::string> ids(const std::vector<const Vertex*>& vertices) {
  std::vector<std::string> result;
  for (const Vertex* v : vertices) result.push_back(v->id);
  return result;
}

// "a -- b kind nominal" per link (ends in plain string order, whatever order the graph keeps
// them in), nominal rounded to 0.01 Gbit/s.
std::set<std::string> linkLines(const Topology& graph) {
  std::set<std::string> lines;
  for (const auto* link : graph.links()) {
    char nominal[32];
    std::snprintf(nominal, sizeof(nominal), "%.2f", link->nominal_gbps);
    const auto [a, b] = std::minmax(link->a, link->b);
    lines.insert(a + " -- " + b + " " + std::string(topology::name(link->kind)) + " " + nominal);
  }
  return lines;
}

bool hasLink(const Topology& graph, const std::string& a, const std::string& b, LinkKind kind) {
  for (const auto* link : graph.linksOf(a)) {
    if ((link->a == b || link->b == b) && link->kind == kind) return true;
  }
  return false;
}

// A directory tree shaped like /sys, removed at the end of the test. Links are relative, as in
// the real sysfs, so that resolving them stays inside the tree.
class FakeSysfs {
 public:
  FakeSysfs() {
    char pattern[] = "/tmp/railshard_sysfs_XXXXXX";
    root_ = ::mkdtemp(pattern);
  }
  ~FakeSysfs() {
    std::error_code ignored;
    fs::remove_all(root_, ignored);
  }
  const std::string& root() const { return root_; }

  void file(const std::string& path, const std::string& content) {
    fs::create_directories(fs::path(root_ + "/" + path).parent_path());
    std::ofstream(root_ + "/" + path) << content << "\n";
  }
  void dir(const std::string& path) { fs::create_directories(root_ + "/" + path); }
  void link(const std::string& path, const std::string& target) {
    fs::create_directories(fs::path(root_ + "/" + path).parent_path());
    fs::create_directory_symlink(target, root_ + "/" + path);
  }

  // A PCI function at devices/<path> (path ends in its bus id), listed in bus/pci/devices.
  void pci(const std::string& path, const std::string& class_code, const std::string& vendor,
           int numa, const std::string& speed = "", int width = 0,
           const std::string& max_speed = "") {
    const std::string dir = "devices/" + path;
    file(dir + "/class", class_code);
    file(dir + "/vendor", vendor);
    file(dir + "/device", "0x2330");
    file(dir + "/numa_node", std::to_string(numa));
    if (!speed.empty()) file(dir + "/current_link_speed", speed);
    if (width > 0) file(dir + "/current_link_width", std::to_string(width));
    if (!max_speed.empty()) file(dir + "/max_link_speed", max_speed);
    link("bus/pci/devices/" + fs::path(path).filename().string(), "../../../" + dir);
  }

  // A netdev at <device_dir>/net/<name> (device_dir "" = devices/virtual).
  void netdev(const std::string& name, const std::string& device_dir, int type,
              const std::string& operstate, int carrier, long long speed_mbps, int mtu) {
    const std::string dir =
        (device_dir.empty() ? "devices/virtual" : "devices/" + device_dir) + "/net/" + name;
    file(dir + "/type", std::to_string(type));
    file(dir + "/operstate", operstate);
    if (carrier >= 0) file(dir + "/carrier", std::to_string(carrier));
    file(dir + "/speed", std::to_string(speed_mbps));
    file(dir + "/mtu", std::to_string(mtu));
    if (!device_dir.empty()) link(dir + "/device", "../..");
    link("class/net/" + name, "../../" + dir);
  }

  // An RDMA device on the PCI function at devices/<pci_path>, with port 1.
  void rdma(const std::string& device, const std::string& pci_path, const std::string& layer,
            const std::string& rate, const std::string& ndev, const std::string& gid) {
    const std::string dir = "devices/" + pci_path + "/infiniband/" + device;
    link(dir + "/device", "../..");
    file(dir + "/ports/1/link_layer", layer);
    file(dir + "/ports/1/rate", rate);
    file(dir + "/ports/1/state", "4: ACTIVE");
    file(dir + "/ports/1/gids/0", gid);
    if (!ndev.empty()) file(dir + "/ports/1/gid_attrs/ndevs/0", ndev);
    link("class/infiniband/" + device, "../../" + dir);
  }

 private:
  std::string root_;
};

InterfaceAddress address(const std::string& name, const std::string& ip, int prefix) {
  InterfaceAddress a;
  a.name = name;
  a.address = ip;
  a.ipv6 = ip.find(':') != std::string::npos;
  a.prefix_length = prefix;
  return a;
}

// Two NUMA nodes of 2 cores x 2 threads; on numa1 a PCIe switch with two NVIDIA GPUs and a
// ConnectX RoCE NIC (eth2, mlx5_0); on numa0 an InfiniBand HCA with IPoIB (ib0, mlx5_1), one
// without a netdev (mlx5_2), a virtio NIC (eth0), a switch with only an NVMe drive below, an
// ASPEED VGA; and the virtual crowd: lo, docker0, a bridge port, a plain veth, ifb0, a down eth3.
struct FakeServer {
  FakeSysfs sys;
  DiscoveryOptions options;

  FakeServer() {
    for (int node = 0; node < 2; ++node) {
      const std::string dir = "devices/system/node/node" + std::to_string(node);
      sys.file(dir + "/cpulist", node == 0 ? "0-3" : "4-7");
      sys.file(dir + "/meminfo", "Node " + std::to_string(node) +
                                     " MemTotal:       16777216 kB\nNode 0 MemFree: 1 kB");
    }
    for (int cpu = 0; cpu < 8; ++cpu) {
      const int first = cpu - cpu % 2;
      sys.file("devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/core_cpus_list",
               std::to_string(first) + "-" + std::to_string(first + 1));
    }
    sys.file("devices/system/cpu/online", "0-7");

    const std::string rp1 = "pci0000:00/0000:00:01.0";
    const std::string up = rp1 + "/0000:01:00.0";
    sys.pci(rp1, "0x060400", "0x8086", 1);
    sys.pci(up, "0x060400", "0x10b5", 1, "16.0 GT/s PCIe", 16);
    sys.pci(up + "/0000:02:00.0", "0x060400", "0x10b5", 1);
    sys.pci(up + "/0000:02:01.0", "0x060400", "0x10b5", 1, "", 0, "16.0 GT/s PCIe");
    sys.pci(up + "/0000:02:02.0", "0x060400", "0x10b5", 1);
    sys.pci(up + "/0000:02:00.0/0000:03:00.0", "0x030200", "0x10de", 1, "16.0 GT/s PCIe", 16);
    // Idle GPU: trained down to 2.5 GT/s, capable of 16 like the port above it.
    sys.pci(up + "/0000:02:01.0/0000:04:00.0", "0x030200", "0x10de", 1, "2.5 GT/s PCIe", 16,
            "16.0 GT/s PCIe");
    const std::string cx_eth = up + "/0000:02:02.0/0000:05:00.0";
    sys.pci(cx_eth, "0x020000", "0x15b3", 1, "16.0 GT/s PCIe", 16);
    sys.netdev("eth2", cx_eth, 1, "up", 1, 100000, 9000);
    sys.rdma("mlx5_0", cx_eth, "Ethernet", "100 Gb/sec (4X EDR)", "eth2",
             "fe80:0000:0000:0000:0a0b:0cff:fe0d:0e0f");

    sys.pci("pci0000:00/0000:00:02.0", "0x060400", "0x8086", 0);
    const std::string cx_ib = "pci0000:00/0000:00:02.0/0000:06:00.0";
    sys.pci(cx_ib, "0x020700", "0x15b3", 0, "8.0 GT/s PCIe", 16);
    sys.netdev("ib0", cx_ib, 32, "up", 1, 100000, 4092);
    sys.rdma("mlx5_1", cx_ib, "InfiniBand", "200 Gb/sec (4X HDR)", "",
             "fe80:0000:0000:0000:0c42:a103:0012:3456");

    const std::string virtio = "pci0000:00/0000:00:03.0";
    sys.pci(virtio, "0x020000", "0x1af4", -1);
    sys.netdev("eth0", virtio + "/virtio1", 1, "up", 1, -1, 1500);

    // A switch with nothing of ours below: no vertex.
    sys.pci("pci0000:00/0000:00:04.0", "0x060400", "0x8086", 0);
    sys.pci("pci0000:00/0000:00:04.0/0000:07:00.0", "0x060400", "0x10b5", 0);
    sys.pci("pci0000:00/0000:00:04.0/0000:07:00.0/0000:08:00.0", "0x060400", "0x10b5", 0);
    sys.pci("pci0000:00/0000:00:04.0/0000:07:00.0/0000:08:00.0/0000:09:00.0", "0x010802", "0x144d",
            0);

    sys.pci("pci0000:00/0000:00:05.0", "0x060400", "0x8086", 0);
    const std::string hca = "pci0000:00/0000:00:05.0/0000:0a:00.0";
    sys.pci(hca, "0x020700", "0x15b3", 0, "16.0 GT/s PCIe", 16);
    sys.rdma("mlx5_2", hca, "InfiniBand", "400 Gb/sec (4X NDR)", "",
             "fe80:0000:0000:0000:0c42:a103:0099:0001");

    sys.pci("pci0000:00/0000:00:06.0", "0x030000", "0x1a03", 0);  // BMC VGA: not a GPU

    sys.netdev("lo", "", 772, "unknown", 1, -1, 65536);
    sys.netdev("docker0", "", 1, "up", 1, -1, 1500);
    sys.dir("devices/virtual/net/docker0/bridge");
    sys.netdev("vethab12", "", 1, "up", 1, 10000, 1500);
    sys.link("devices/virtual/net/vethab12/master", "../docker0");
    sys.netdev("veth0", "", 1, "up", 1, 10000, 1500);
    sys.netdev("ifb0", "", 1, "unknown", 1, -1, 1500);
    sys.netdev("eth3", "", 1, "down", -1, -1, 1500);
    sys.file("class/net/bonding_masters", "");

    options.sysfs_root = sys.root();
    options.hostname = "node-a";
    options.use_hwloc = false;
    options.use_nvml = false;
    options.addresses = std::vector<InterfaceAddress>{
        address("lo", "127.0.0.1", 8),        address("lo", "::1", 128),
        address("eth0", "10.0.0.5", 24),      address("eth0", "fe80::5", 64),
        address("eth2", "10.1.0.5", 24),      address("eth2", "fd00:1::5", 64),
        address("eth2", "fe80::1", 64),       address("ib0", "10.2.0.5", 16),
        address("docker0", "172.17.0.1", 16), address("eth3", "10.9.0.1", 24),
        address("veth0", "10.3.0.1", 24),     address("gone0", "10.8.0.1", 24)};
  }
};

const std::vector<std::string> kFakeNics = {"docker0", "eth0", "eth2",   "eth3",  "ib0",
                                            "ifb0",    "lo",   "mlx5_2", "veth0", "vethab12"};

// ---- pieces ----

TEST(DiscoveryPieces, Ipv6LinkLocalAddressesAreNotNetworks) {
  EXPECT_TRUE(isIpv6LinkLocal("fe80::fc:ff:fe00:1"));
  EXPECT_FALSE(isIpv6LinkLocal("fd00::2"));
  EXPECT_FALSE(isIpv6LinkLocal("10.0.0.1"));
}

TEST(DiscoveryPieces, PcieBandwidthFromSpeedAndWidth) {
  EXPECT_NEAR(pcieGbps(8, 16), 126.03, 0.01);   // gen3 x16, 128b/130b
  EXPECT_NEAR(pcieGbps(16, 16), 252.06, 0.01);  // gen4 x16
  EXPECT_NEAR(pcieGbps(2.5, 1), 2.0, 1e-9);     // gen1, 8b/10b
  EXPECT_EQ(pcieGbps(0, 16), 0);
  EXPECT_EQ(parseLinkSpeed("16.0 GT/s PCIe"), 16.0);
  EXPECT_EQ(parseLinkSpeed("Unknown"), 0);
}

TEST(DiscoveryPieces, InterfaceSpecMatching) {
  EXPECT_TRUE(interfaceMatches("eth0", ""));
  EXPECT_TRUE(interfaceMatches("eth0", "eth"));
  EXPECT_FALSE(interfaceMatches("eth0", "=eth"));
  EXPECT_TRUE(interfaceMatches("eth0", "=eth0"));
  EXPECT_FALSE(interfaceMatches("docker0", "^docker"));
  EXPECT_TRUE(interfaceMatches("eth0", "^docker"));
  EXPECT_TRUE(interfaceMatches("ib1", "eth,ib"));
  EXPECT_FALSE(interfaceMatches("ib1", "eth,ib,^ib1"));
}

TEST(DiscoveryPieces, AddressesCarryPrefixLength) {
  bool saw_loopback = false;
  for (const auto& entry : listInterfaceAddresses()) {
    EXPECT_GE(entry.prefix_length, 0);
    EXPECT_LE(entry.prefix_length, entry.ipv6 ? 128 : 32);
    if (entry.address == "127.0.0.1") {
      saw_loopback = true;
      EXPECT_EQ(entry.prefix_length, 8);
    }
  }
  EXPECT_TRUE(saw_loopback);
}

TEST(DiscoveryPieces, NvmlBusIdsAreNormalisedToSysfsForm) {
  EXPECT_EQ(normalizePciBusId("00000000:17:00.0"), "0000:17:00.0");
  EXPECT_EQ(normalizePciBusId("0000:AB:1F.7"), "0000:ab:1f.7");
  EXPECT_EQ(normalizePciBusId("garbage"), "");
}

TEST(DiscoveryPieces, NvLinkPairsDirectAndThroughSwitches) {
  // Direct: 0-1 with 4 links (both ends report them). Switched: 2 and 3 each with 3 links
  // into switch S1 and 2 into S2 (two GPUs see them); 4 reaches only S3 alone (ignored).
  NvmlGpu g0{"0000:01:00.0", "A", 0, 0, {{"0000:02:00.0", 4}}};
  NvmlGpu g1{"0000:02:00.0", "A", 0, 0, {{"0000:01:00.0", 4}}};
  NvmlGpu g2{"0000:03:00.0", "H", 0, 400, {{"0000:a0:00.0", 3}, {"0000:a1:00.0", 2}}};
  NvmlGpu g3{"0000:04:00.0", "H", 0, 400, {{"0000:a0:00.0", 3}, {"0000:a1:00.0", 2}}};
  NvmlGpu g4{"0000:05:00.0", "H", 0, 0, {{"0000:a2:00.0", 2}}};
  const auto pairs = nvlinkPairs({g0, g1, g2, g3, g4});
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[0].a, "0000:01:00.0");
  EXPECT_EQ(pairs[0].b, "0000:02:00.0");
  EXPECT_EQ(pairs[0].lanes, 4);
  EXPECT_EQ(pairs[0].gbps_per_lane, kAssumedNvLinkGbps);
  EXPECT_EQ(pairs[1].a, "0000:03:00.0");
  EXPECT_EQ(pairs[1].b, "0000:04:00.0");
  EXPECT_EQ(pairs[1].lanes, 5);
  EXPECT_EQ(pairs[1].gbps_per_lane, 400);
}

// ---- the fake server ----

TEST(DiscoveryFakeSysfs, VerticesOfAServer) {
  FakeServer server;
  const Topology graph = discoverHost(server.options);

  EXPECT_EQ(graph.hosts(), std::vector<std::string>{"node-a"});
  const Vertex& host = graph.vertex("node-a");
  EXPECT_EQ(host.cores, 4);
  EXPECT_EQ(host.threads, 8);
  EXPECT_EQ(host.memory_bytes, 32ull << 30);

  EXPECT_EQ(ids(graph.vertices(VertexKind::kNuma)),
            (std::vector<std::string>{"node-a/numa0", "node-a/numa1"}));
  const Vertex& numa1 = graph.vertex("node-a/numa1");
  EXPECT_EQ(numa1.name, "numa1");
  EXPECT_EQ(numa1.index, 1);
  EXPECT_EQ(numa1.cpus, "4-7");
  EXPECT_EQ(numa1.cores, 2);
  EXPECT_EQ(numa1.threads, 4);
  EXPECT_EQ(numa1.memory_bytes, 16ull << 30);

  // One switch: the NVMe-only switch at 07:00.0 has nothing of ours below it.
  EXPECT_EQ(ids(graph.vertices(VertexKind::kPciSwitch)), std::vector<std::string>{"node-a/pcisw0"});
  EXPECT_EQ(graph.vertex("node-a/pcisw0").pci, "0000:01:00.0");

  // NVIDIA GPUs in bus order; the ASPEED VGA is not one.
  EXPECT_EQ(ids(graph.vertices(VertexKind::kGpu)),
            (std::vector<std::string>{"node-a/gpu0", "node-a/gpu1"}));
  EXPECT_EQ(graph.vertex("node-a/gpu0").pci, "0000:03:00.0");
  EXPECT_EQ(graph.vertex("node-a/gpu1").pci, "0000:04:00.0");
  EXPECT_EQ(graph.vertex("node-a/gpu1").index, 1);
  EXPECT_THAT(graph.vertex("node-a/gpu0").name, HasSubstr("NVIDIA"));

  std::vector<std::string> nic_ids;
  for (const auto& name : kFakeNics) nic_ids.push_back("node-a/" + name);
  EXPECT_EQ(ids(graph.vertices(VertexKind::kNic)), nic_ids);

  std::map<std::string, std::string> reasons;
  for (const Vertex* nic : graph.vertices(VertexKind::kNic)) reasons[nic->name] = nic->excluded;
  EXPECT_EQ(reasons,
            (std::map<std::string, std::string>{{"docker0", "bridge/container interface"},
                                                {"eth0", ""},
                                                {"eth2", ""},
                                                {"eth3", "down"},
                                                {"ib0", ""},
                                                {"ifb0", "ifb"},
                                                {"lo", "loopback"},
                                                {"mlx5_2", ""},
                                                {"veth0", ""},
                                                {"vethab12", "bridge/container interface"}}));

  const Vertex& eth2 = graph.vertex("node-a/eth2");
  EXPECT_EQ(eth2.link_layer, LinkLayer::kEthernet);
  EXPECT_EQ(eth2.speed_gbps, 100);
  EXPECT_EQ(eth2.mtu, 9000);
  EXPECT_TRUE(eth2.up);
  EXPECT_EQ(eth2.pci, "0000:05:00.0");
  EXPECT_EQ(eth2.rdma_device, "mlx5_0");
  EXPECT_EQ(eth2.rdma_port, 1);
  EXPECT_EQ(eth2.addresses, (std::vector<std::string>{"10.1.0.5/24", "fd00:1::5/64"}));

  const Vertex& ib0 = graph.vertex("node-a/ib0");
  EXPECT_EQ(ib0.link_layer, LinkLayer::kInfiniBand);
  EXPECT_EQ(ib0.speed_gbps, 200);  // the port's rate beats IPoIB's speed file
  EXPECT_EQ(ib0.rdma_device, "mlx5_1");
  EXPECT_EQ(ib0.rdma_port, 1);

  const Vertex& hca = graph.vertex("node-a/mlx5_2");
  EXPECT_EQ(hca.rdma_device, "mlx5_2");
  EXPECT_EQ(hca.link_layer, LinkLayer::kInfiniBand);
  EXPECT_EQ(hca.speed_gbps, 400);
  EXPECT_TRUE(hca.addresses.empty());

  const Vertex& eth0 = graph.vertex("node-a/eth0");
  EXPECT_EQ(eth0.pci, "0000:00:03.0");  // virtio: the PCI device above virtio1
  EXPECT_EQ(eth0.speed_gbps, 0);
  EXPECT_EQ(eth0.addresses, std::vector<std::string>{"10.0.0.5/24"});  // no fe80::

  const Vertex& lo = graph.vertex("node-a/lo");
  EXPECT_EQ(lo.link_layer, LinkLayer::kLoopback);
  EXPECT_TRUE(lo.up);  // "unknown" with carrier

  EXPECT_EQ(
      ids(graph.vertices(VertexKind::kNetwork)),
      (std::vector<std::string>{"ib:fe80:0000:0000:0000", "net:10.0.0.0/24", "net:10.1.0.0/24",
                                "net:10.2.0.0/16", "net:10.3.0.0/24", "net:fd00:1::/64"}));
  const Vertex& net = graph.vertex("net:10.1.0.0/24");
  EXPECT_EQ(net.name, "10.1.0.0/24");
  EXPECT_EQ(net.host, "");
  EXPECT_EQ(net.link_layer, LinkLayer::kEthernet);
  EXPECT_EQ(graph.vertex("ib:fe80:0000:0000:0000").link_layer, LinkLayer::kInfiniBand);
}

TEST(DiscoveryFakeSysfs, LinksOfAServer) {
  FakeServer server;
  const Topology graph = discoverHost(server.options);
  const std::set<std::string> expected = {
      "node-a/numa0 -- node-a/numa1 cpu_interconnect 0.00",
      "node-a/numa1 -- node-a/pcisw0 pcie 252.06", "node-a/gpu0 -- node-a/pcisw0 pcie 252.06",
      // Idle at 2.5 GT/s, but both the GPU and its port can do 16 GT/s.
      "node-a/gpu1 -- node-a/pcisw0 pcie 252.06", "node-a/eth2 -- node-a/pcisw0 pcie 252.06",
      "node-a/ib0 -- node-a/numa0 pcie 126.03", "node-a/mlx5_2 -- node-a/numa0 pcie 252.06",
      "node-a/eth0 -- node-a/numa0 pcie 0.00", "node-a/lo -- node-a/numa0 loopback 0.00",
      "node-a/docker0 -- node-a/numa0 virtual 0.00", "node-a/eth3 -- node-a/numa0 virtual 0.00",
      "node-a/ifb0 -- node-a/numa0 virtual 0.00", "node-a/numa0 -- node-a/veth0 virtual 0.00",
      "node-a/numa0 -- node-a/vethab12 virtual 0.00",
      "net:10.0.0.0/24 -- node-a/eth0 ethernet 0.00", "net:10.1.0.0/24 -- node-a/eth2 roce 100.00",
      "net:fd00:1::/64 -- node-a/eth2 roce 100.00",
      "net:10.2.0.0/16 -- node-a/ib0 infiniband 200.00",
      "ib:fe80:0000:0000:0000 -- node-a/ib0 infiniband 200.00",
      "ib:fe80:0000:0000:0000 -- node-a/mlx5_2 infiniband 400.00",
      "net:10.3.0.0/24 -- node-a/veth0 ethernet 10.00",  // veth reports 10000 Mbit/s
  };
  EXPECT_EQ(linkLines(graph), expected);
  for (const auto* link : graph.links()) {
    if (link->kind == LinkKind::kPcie && link->nominal_gbps > 0) {
      EXPECT_EQ(link->lanes, 16);
    }
  }
}

TEST(DiscoveryFakeSysfs, SocketIfnameExactSelectsOneNic) {
  FakeServer server;
  server.options.socket_ifname = "=eth2";
  const Topology graph = discoverHost(server.options);
  for (const Vertex* nic : graph.vertices(VertexKind::kNic)) {
    if (nic->name == "eth2") {
      EXPECT_EQ(nic->excluded, "");
    } else {
      EXPECT_EQ(nic->excluded, "not selected by RAILSHARD_SOCKET_IFNAME==eth2") << nic->name;
    }
  }
  EXPECT_EQ(ids(graph.vertices(VertexKind::kNetwork)),
            (std::vector<std::string>{"net:10.1.0.0/24", "net:fd00:1::/64"}));
}

TEST(DiscoveryFakeSysfs, SocketIfnameExclusionKeepsDefaults) {
  FakeServer server;
  server.options.socket_ifname = "^docker";
  const Topology graph = discoverHost(server.options);
  EXPECT_EQ(graph.vertex("node-a/docker0").excluded,
            "not selected by RAILSHARD_SOCKET_IFNAME=^docker");
  EXPECT_EQ(graph.vertex("node-a/vethab12").excluded, "bridge/container interface");
  EXPECT_EQ(graph.vertex("node-a/lo").excluded, "loopback");
  EXPECT_EQ(graph.vertex("node-a/eth0").excluded, "");
  EXPECT_EQ(graph.vertex("node-a/eth2").excluded, "");
}

TEST(DiscoveryFakeSysfs, SocketIfnameMatchingNothingIsAConfigError) {
  FakeServer server;
  server.options.socket_ifname = "nomatch";
  try {
    discoverHost(server.options);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& error) {
    const std::string message = error.what();
    EXPECT_THAT(message, HasSubstr("nomatch"));
    for (const auto& name : kFakeNics) EXPECT_THAT(message, HasSubstr(name));
    EXPECT_THAT(message, HasSubstr("eth3 (down)"));
  }
  // Naming only a down interface selects nothing usable either.
  server.options.socket_ifname = "=eth3";
  EXPECT_THROW(discoverHost(server.options), ConfigError);
}

TEST(DiscoveryFakeSysfs, NamingLoopbackMakesItUsable) {
  FakeServer server;
  server.options.socket_ifname = "lo";
  const Topology graph = discoverHost(server.options);
  EXPECT_EQ(graph.vertex("node-a/lo").excluded, "");
  EXPECT_TRUE(graph.vertices(VertexKind::kNetwork).empty());  // loopback joins no network
}

TEST(DiscoveryFakeSysfs, WithoutNumaInformationOneNodeHoldsEveryCpu) {
  FakeSysfs sys;
  sys.file("devices/system/cpu/online", "0-3");
  sys.netdev("lo", "", 772, "unknown", 1, -1, 65536);
  DiscoveryOptions options;
  options.sysfs_root = sys.root();
  options.hostname = "bare";
  options.use_hwloc = false;
  options.use_nvml = false;
  options.addresses = std::vector<InterfaceAddress>{address("lo", "127.0.0.1", 8)};
  const Topology graph = discoverHost(options);
  EXPECT_EQ(ids(graph.vertices(VertexKind::kNuma)), std::vector<std::string>{"bare/numa0"});
  EXPECT_EQ(graph.vertex("bare/numa0").cpus, "0-3");
  EXPECT_EQ(graph.vertex("bare").threads, 4);
  EXPECT_EQ(graph.vertex("bare").cores, 4);  // no core grouping known: one core per CPU
  EXPECT_GT(graph.vertex("bare").memory_bytes, 0u);
}

TEST(DiscoveryFakeSysfs, NestedSwitchesLinkToTheirParent) {
  FakeSysfs sys;
  const std::string top = "pci0000:00/0000:00:01.0/0000:01:00.0";
  const std::string nested = top + "/0000:02:00.0/0000:03:00.0";
  sys.pci("pci0000:00/0000:00:01.0", "0x060400", "0x8086", 0);
  sys.pci(top, "0x060400", "0x10b5", 0, "16.0 GT/s PCIe", 16);
  sys.pci(top + "/0000:02:00.0", "0x060400", "0x10b5", 0);
  sys.pci(nested, "0x060400", "0x10b5", 0, "16.0 GT/s PCIe", 8);
  sys.pci(nested + "/0000:04:00.0", "0x060400", "0x10b5", 0);
  sys.pci(nested + "/0000:04:00.0/0000:05:00.0", "0x030200", "0x1002", 0, "16.0 GT/s PCIe", 16);
  sys.file("devices/" + nested + "/0000:04:00.0/0000:05:00.0/mem_info_vram_total", "68719476736");
  DiscoveryOptions options;
  options.sysfs_root = sys.root();
  options.hostname = "h";
  options.use_hwloc = false;
  options.use_nvml = false;
  options.addresses = std::vector<InterfaceAddress>{};
  const Topology graph = discoverHost(options);
  EXPECT_EQ(ids(graph.vertices(VertexKind::kPciSwitch)),
            (std::vector<std::string>{"h/pcisw0", "h/pcisw1"}));
  EXPECT_EQ(graph.vertex("h/pcisw1").pci, "0000:03:00.0");
  EXPECT_TRUE(hasLink(graph, "h/pcisw0", "h/numa0", LinkKind::kPcie));
  EXPECT_TRUE(hasLink(graph, "h/pcisw1", "h/pcisw0", LinkKind::kPcie));
  EXPECT_TRUE(hasLink(graph, "h/gpu0", "h/pcisw1", LinkKind::kPcie));
  EXPECT_EQ(graph.vertex("h/gpu0").memory_bytes, 64ull << 30);
  EXPECT_THAT(graph.vertex("h/gpu0").name, HasSubstr("AMD"));
}

}  // namespace
}  // namespace railshard::launcher::discovery
