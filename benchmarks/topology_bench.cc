// How the cluster graph's operations scale with the cluster: synthetic clusters of H DGX-like
// hosts (2 NUMA nodes, 2 PCIe switches, 8 GPUs with NVLink, 4 InfiniBand NICs + 1 Ethernet, one
// rank per GPU). What a job does at start-up: serialise, parse, hash (step 2 of
// buildClusterTopology on every rank), and the queries the transport and dispatcher ask
// (rails to every other host, paths, affinity).
//
//   build/benchmarks/topology_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <string>

#include "core/topology/topology.h"

namespace {

using railshard::topology::Link;
using railshard::topology::LinkKind;
using railshard::topology::LinkLayer;
using railshard::topology::RankPlacement;
using railshard::topology::Topology;
using railshard::topology::Vertex;
using railshard::topology::VertexKind;

Vertex vertex(const std::string& id, VertexKind kind, const std::string& host) {
  Vertex v;
  v.id = id;
  v.kind = kind;
  v.host = host;
  v.name = id.substr(id.rfind('/') + 1);
  return v;
}

Topology cluster(int hosts) {
  Topology t;
  std::vector<RankPlacement> ranks;
  for (int rail = 0; rail < 5; ++rail) {
    Vertex net = vertex("net:10." + std::to_string(rail) + ".0.0/16", VertexKind::kNetwork, "");
    net.link_layer = rail < 4 ? LinkLayer::kInfiniBand : LinkLayer::kEthernet;
    t.addVertex(net);
  }
  for (int h = 0; h < hosts; ++h) {
    const std::string host = "node" + std::to_string(h);
    t.addVertex(vertex(host, VertexKind::kHost, host));
    for (int n = 0; n < 2; ++n) {
      t.addVertex(vertex(host + "/numa" + std::to_string(n), VertexKind::kNuma, host));
      t.addVertex(vertex(host + "/pcisw" + std::to_string(n), VertexKind::kPciSwitch, host));
      t.addLink({host + "/pcisw" + std::to_string(n), host + "/numa" + std::to_string(n),
                 LinkKind::kPcie, 252, 16, 0, 0});
    }
    t.addLink({host + "/numa0", host + "/numa1", LinkKind::kCpuInterconnect, 0, 0, 0, 0});
    for (int g = 0; g < 8; ++g) {
      const std::string gpu = host + "/gpu" + std::to_string(g);
      t.addVertex(vertex(gpu, VertexKind::kGpu, host));
      t.addLink({gpu, host + "/pcisw" + std::to_string(g / 4), LinkKind::kPcie, 252, 16, 0, 0});
      for (int o = 0; o < g; ++o) {
        t.addLink({host + "/gpu" + std::to_string(o), gpu, LinkKind::kNvLink, 3600, 18, 0, 0});
      }
      ranks.push_back({h * 8 + g, host, g, host + "/numa" + std::to_string(g / 4), gpu});
    }
    for (int k = 0; k < 5; ++k) {
      const std::string nic = host + "/ib" + std::to_string(k);
      Vertex v = vertex(nic, VertexKind::kNic, host);
      v.up = true;
      v.speed_gbps = k < 4 ? 400 : 100;
      v.link_layer = k < 4 ? LinkLayer::kInfiniBand : LinkLayer::kEthernet;
      v.addresses = {"10." + std::to_string(k) + "." + std::to_string(h / 250) + "." +
                     std::to_string(h % 250 + 1) + "/16"};
      t.addVertex(v);
      t.addLink({nic, host + "/pcisw" + std::to_string(k % 2), LinkKind::kPcie, 252, 16, 0, 0});
      t.addLink({nic, "net:10." + std::to_string(k) + ".0.0/16",
                 k < 4 ? LinkKind::kInfiniBand : LinkKind::kEthernet, v.speed_gbps, 0, 0, 0});
    }
  }
  t.setRanks(ranks);
  return t;
}

void BM_ToJson(benchmark::State& state) {
  const Topology t = cluster(static_cast<int>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(t.toJson());
}

void BM_FromJson(benchmark::State& state) {
  const std::string text = cluster(static_cast<int>(state.range(0))).toJson();
  state.counters["json_bytes"] = static_cast<double>(text.size());
  for (auto _ : state) benchmark::DoNotOptimize(Topology::fromJson(text, "bench"));
}

void BM_Hash(benchmark::State& state) {
  const Topology t = cluster(static_cast<int>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(t.hash());
}

// What one rank's transport would ask at start-up: the rails to every other host.
void BM_RailsToEveryHost(benchmark::State& state) {
  const int hosts = static_cast<int>(state.range(0));
  const Topology t = cluster(hosts);
  for (auto _ : state) {
    for (int h = 1; h < hosts; ++h)
      benchmark::DoNotOptimize(t.rails("node0", "node" + std::to_string(h)));
  }
}

void BM_PathAcrossHosts(benchmark::State& state) {
  const int hosts = static_cast<int>(state.range(0));
  const Topology t = cluster(hosts);
  for (auto _ : state) benchmark::DoNotOptimize(t.path(0, t.worldSize() - 1));
}

void BM_Affinity(benchmark::State& state) {
  const Topology t = cluster(static_cast<int>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(t.affinity(5));
}

BENCHMARK(BM_ToJson)->Arg(16)->Arg(64)->Arg(256)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FromJson)->Arg(16)->Arg(64)->Arg(256)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Hash)->Arg(16)->Arg(64)->Arg(256)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RailsToEveryHost)->Arg(16)->Arg(64)->Arg(256)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PathAcrossHosts)->Arg(16)->Arg(64)->Arg(256)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Affinity)->Arg(16)->Arg(64)->Arg(256)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
