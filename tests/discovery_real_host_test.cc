// Host discovery of this machine: real /sys, hwloc cross-checked against sysfs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "base/error.h"
#include "core/topology/topology.h"
#include "launcher/discovery/host_discovery.h"
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

std::vector<std::string> ids(const std::vector<const Vertex*>& vertices) {
  std::vector<std::string> result;
  for (const Vertex* v : vertices) result.push_back(v->id);
  return result;
}

// ---- this machine ----

// GPUs by the same rule as discovery, read independently: display/3D class, NVIDIA or AMD.
int pciGpusHere() {
  int count = 0;
  std::error_code error;
  for (fs::directory_iterator it("/sys/bus/pci/devices", error), end; !error && it != end;
       it.increment(error)) {
    std::ifstream class_file(it->path() / "class");
    std::ifstream vendor_file(it->path() / "vendor");
    std::string class_code, vendor;
    class_file >> class_code;
    vendor_file >> vendor;
    const bool gpu_class = class_code.rfind("0x0300", 0) == 0 || class_code.rfind("0x0302", 0) == 0;
    if (gpu_class && (vendor == "0x10de" || vendor == "0x1002")) ++count;
  }
  return count;
}

TEST(DiscoveryRealHost, DescribesThisMachine) {
  const auto start = std::chrono::steady_clock::now();
  const Topology graph = discoverHost({});
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, std::chrono::seconds(2));

  ASSERT_EQ(graph.hosts().size(), 1u);
  const Vertex& host = graph.vertex(graph.hosts().front());
  char name[256] = {0};
  ::gethostname(name, sizeof(name) - 1);
  EXPECT_EQ(host.id, name);
  EXPECT_GE(host.cores, 1);
  EXPECT_EQ(host.threads, static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_GT(host.memory_bytes, 0u);
  EXPECT_GE(graph.vertices(VertexKind::kNuma).size(), 1u);

  EXPECT_EQ(static_cast<int>(graph.vertices(VertexKind::kGpu).size()), pciGpusHere());
  if (!fs::exists("/sys/class/infiniband")) {
    for (const Vertex* nic : graph.vertices(VertexKind::kNic)) EXPECT_EQ(nic->rdma_device, "");
  }

  const Vertex* lo = graph.find(host.id + "/lo");
  ASSERT_NE(lo, nullptr);
  EXPECT_EQ(lo->excluded, "loopback");

  int usable = 0;
  for (const Vertex* nic : graph.vertices(VertexKind::kNic)) {
    if (nic->name.rfind("ifb", 0) == 0) {
      EXPECT_NE(nic->excluded, "") << nic->name;
    }
    if (!nic->excluded.empty() || nic->link_layer == LinkLayer::kLoopback) continue;
    ++usable;
    EXPECT_TRUE(nic->up) << nic->name;
    EXPECT_FALSE(nic->addresses.empty()) << nic->name;
    bool on_network = false;
    for (const auto* link : graph.linksOf(nic->id)) {
      const std::string& other = link->a == nic->id ? link->b : link->a;
      on_network = on_network || other.rfind("net:", 0) == 0;
    }
    EXPECT_TRUE(on_network) << nic->name;
  }
  EXPECT_GE(usable, 1);
  if (const Vertex* eth0 = graph.find(host.id + "/eth0")) {
    EXPECT_EQ(eth0->excluded, "");
    EXPECT_TRUE(eth0->up);
  }
}

TEST(DiscoveryRealHost, HwlocAndSysfsAgree) {
  DiscoveryOptions sysfs_only;
  sysfs_only.use_hwloc = false;
  const Topology with_hwloc = discoverHost({});
  const Topology without = discoverHost(sysfs_only);
  const Vertex& a = *with_hwloc.vertices(VertexKind::kHost).front();
  const Vertex& b = *without.vertices(VertexKind::kHost).front();
  EXPECT_EQ(a.cores, b.cores);
  EXPECT_EQ(a.threads, b.threads);
  const auto numa_a = with_hwloc.vertices(VertexKind::kNuma);
  const auto numa_b = without.vertices(VertexKind::kNuma);
  ASSERT_EQ(ids(numa_a), ids(numa_b));
  for (size_t i = 0; i < numa_a.size(); ++i) {
    EXPECT_EQ(numa_a[i]->cores, numa_b[i]->cores) << numa_a[i]->id;
    EXPECT_EQ(numa_a[i]->threads, numa_b[i]->threads) << numa_a[i]->id;
    EXPECT_EQ(numa_a[i]->cpus, numa_b[i]->cpus) << numa_a[i]->id;
  }
}

TEST(DiscoveryRealHost, NamingLoopbackMakesItUsable) {
  DiscoveryOptions options;
  options.socket_ifname = "lo";
  const Topology graph = discoverHost(options);
  const Vertex& lo = graph.vertex(graph.hosts().front() + "/lo");
  EXPECT_EQ(lo.excluded, "");
  for (const Vertex* nic : graph.vertices(VertexKind::kNic)) {
    if (nic->name != "lo") {
      EXPECT_THAT(nic->excluded, HasSubstr("not selected")) << nic->name;
    }
  }
}

}  // namespace
}  // namespace railshard::launcher::discovery
