// railshard-topo: prints a topology graph (see --help): this host's, a job's (when started by
// railshard-launch, mpirun, Slurm or torchrun), or a file's.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "core/topology/topology.h"
#include "launcher/cluster_topology.h"
#include "launcher/discovery/host_discovery.h"
#include "launcher/environment.h"
#include "launcher/init.h"
#include "transport/links/ibverbs/ibverbs_factory.h"

namespace {

using railshard::topology::Topology;
using railshard::topology::VertexKind;

constexpr const char* kUsage =
    "usage: railshard-topo [--json | --dot | --png OUT.png] [--file GRAPH.json]\n"
    "                      [--rails HOST_A HOST_B] [--path RANK_A RANK_B] [--rdma]\n";

constexpr const char* kHelp =
    "\n"
    "Prints a cluster topology graph: hosts, NUMA nodes, PCIe switches, GPUs, NICs, the\n"
    "networks between them, links with nominal (and probed) speeds, and where ranks run.\n"
    "\n"
    "Which graph:\n"
    "  (default)            this host, discovered now (hwloc, sysfs, NVML when present)\n"
    "  under a launcher     the job's merged graph, printed by rank 0 (railshard-launch -n N\n"
    "                       railshard-topo, mpirun -n N railshard-topo, srun, torchrun)\n"
    "  --file GRAPH.json    a graph file (the --json schema), checked and printed\n"
    "\n"
    "How to print it:\n"
    "  (default)            a readable summary\n"
    "  --json               canonical JSON (what RAILSHARD_TOPO_FILE reads)\n"
    "  --dot                Graphviz DOT\n"
    "  --png OUT.png        rendered through Graphviz's dot (apt-get install graphviz)\n"
    "  --rails A B          the rails between hosts A and B\n"
    "  --path RA RB         the path between ranks RA and RB\n"
    "  --rdma               what the RDMA transport sees here: its library, usable ports\n"
    "                       (rate, link layer, MTU, the GID and why), ports left out and why\n"
    "                       (RAILSHARD_IB_HCA and RAILSHARD_IB_GID_INDEX apply)\n"
    "\n"
    "RAILSHARD_SOCKET_IFNAME selects interfaces (prefix, =exact, ^exclude) as for jobs.\n";

struct UsageError {
  std::string problem;
};

struct Arguments {
  std::string format = "summary";  // summary | json | dot | png
  std::string png;
  std::string file;
  std::vector<std::string> rails;
  std::vector<int> path;
  bool help = false;
  bool rdma = false;
};

Arguments parse(int argc, char** argv) {
  Arguments args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto next = [&](const char* what) -> std::string {
      if (i + 1 >= argc) throw UsageError{arg + " needs " + what};
      return argv[++i];
    };
    if (arg == "--json" || arg == "--dot") {
      args.format = arg.substr(2);
    } else if (arg == "--png") {
      args.format = "png";
      args.png = next("an output file");
    } else if (arg == "--file") {
      args.file = next("a graph file");
    } else if (arg == "--rails") {
      args.rails = {next("two host names"), next("two host names")};
    } else if (arg == "--path") {
      for (int k = 0; k < 2; ++k) {
        const std::string value = next("two ranks");
        args.path.push_back(static_cast<int>(railshard::parseInteger("--path", value, 0, 1 << 24)));
      }
    } else if (arg == "--rdma") {
      args.rdma = true;
    } else if (arg == "-h" || arg == "--help") {
      args.help = true;
    } else {
      throw UsageError{"unknown argument '" + arg + "'"};
    }
  }
  return args;
}

std::string gbps(double value) {
  if (value == 0) return "?";
  std::ostringstream out;
  out.precision(value >= 10 ? 0 : 3);
  out << std::fixed << value;
  return out.str() + " Gb/s";
}

std::string gib(uint64_t bytes) {
  std::ostringstream out;
  out.precision(1);
  out << std::fixed << static_cast<double>(bytes) / (1ULL << 30) << " GiB";
  return out.str();
}

std::string leaf(const std::string& id) {
  return id.substr(id.rfind('/') + 1);
}

void printRails(const Topology& graph, const std::string& a, const std::string& b) {
  const auto rails = graph.rails(a, b);
  std::cout << "rails " << a << " <-> " << b << ": " << rails.size() << "\n";
  for (const auto& rail : rails) {
    std::cout << "  " << leaf(rail.nic_a) << " " << rail.address_a << " <-> " << leaf(rail.nic_b)
              << " " << rail.address_b << "  " << railshard::topology::name(rail.kind)
              << (rail.rdma ? " rdma" : "") << "  nominal " << gbps(rail.nominal_gbps);
    if (rail.measured_gbps > 0) {
      std::cout << "  measured " << gbps(rail.measured_gbps) << ", " << rail.latency_us << " us";
    }
    std::cout << "  (" << rail.network << ")\n";
  }
}

void printSummary(const Topology& graph) {
  const auto hosts = graph.hosts();
  std::cout << "topology " << graph.hash() << ": " << hosts.size() << " host(s), "
            << graph.vertices(VertexKind::kGpu).size() << " GPU(s), " << graph.worldSize()
            << " rank(s)\n";
  for (const auto& host : hosts) {
    const auto& h = graph.vertex(host);
    std::cout << "\nhost " << host << ": " << h.cores << " cores, " << h.threads << " threads, "
              << gib(h.memory_bytes) << "\n";
    for (const auto* v : graph.vertices(VertexKind::kNuma, host)) {
      std::cout << "  " << v->name << ": cpus " << v->cpus << ", " << v->cores << " cores, "
                << gib(v->memory_bytes) << "\n";
    }
    for (const auto* v : graph.vertices(VertexKind::kPciSwitch, host)) {
      std::cout << "  " << leaf(v->id) << ": PCIe switch " << v->pci << "\n";
    }
    for (const auto* v : graph.vertices(VertexKind::kGpu, host)) {
      std::cout << "  " << leaf(v->id) << ": " << v->name << " " << v->pci << ", "
                << gib(v->memory_bytes) << ", " << leaf(graph.numaOf(v->id)) << "\n";
    }
    for (const auto* v : graph.vertices(VertexKind::kNic, host)) {
      std::cout << "  " << v->name << ": " << railshard::topology::name(v->link_layer) << " "
                << gbps(v->speed_gbps) << (v->up ? " up" : " down") << " mtu " << v->mtu;
      if (!v->rdma_device.empty()) std::cout << " rdma " << v->rdma_device << ":" << v->rdma_port;
      for (const auto& address : v->addresses) std::cout << " " << address;
      if (!v->excluded.empty()) std::cout << "  [not used: " << v->excluded << "]";
      std::cout << "\n";
    }
  }
  for (size_t i = 0; i < hosts.size(); ++i) {
    for (size_t j = i + 1; j < hosts.size(); ++j) {
      std::cout << "\n";
      printRails(graph, hosts[i], hosts[j]);
    }
  }
  if (graph.worldSize() > 0) std::cout << "\nranks:\n";
  for (const auto& r : graph.ranks()) {
    std::cout << "  " << r.rank << ": " << r.host << " local " << r.local_rank << " "
              << leaf(r.numa);
    if (!r.gpu.empty()) std::cout << " " << leaf(r.gpu);
    const auto nics = graph.affinity(r.rank).nics;
    if (!nics.empty()) std::cout << ", nearest NIC " << leaf(nics.front());
    std::cout << "\n";
  }
}

void printPath(const Topology& graph, int a, int b) {
  const auto path = graph.path(a, b);
  std::cout << "path rank " << a << " -> rank " << b << ": "
            << railshard::topology::name(path.transport) << ", " << gbps(path.bandwidth_gbps)
            << "\n  ";
  for (size_t i = 0; i < path.vertices.size(); ++i) {
    std::cout << path.vertices[i];
    if (i < path.links.size())
      std::cout << " -(" << railshard::topology::name(path.links[i]) << ")- ";
  }
  if (path.vertices.size() == 1 && path.links.size() == 1) std::cout << "(shm)";
  std::cout << "\n";
}

int renderPng(const std::string& dot, const std::string& out) {
  if (::access("/usr/bin/dot", X_OK) != 0 && std::system("command -v dot >/dev/null 2>&1") != 0) {
    throw railshard::ConfigError("--png needs Graphviz's 'dot' (apt-get install graphviz)");
  }
  const std::string command = "dot -Tpng -o '" + out + "'";
  FILE* pipe = ::popen(command.c_str(), "w");
  if (pipe == nullptr) throw railshard::Error("cannot run dot");
  std::fwrite(dot.data(), 1, dot.size(), pipe);
  const int status = ::pclose(pipe);
  if (status != 0) throw railshard::Error("dot failed (status " + std::to_string(status) + ")");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Arguments args;
  try {
    args = parse(argc, argv);
  } catch (const UsageError& error) {
    std::fprintf(stderr, "railshard-topo: %s\n%s", error.problem.c_str(), kUsage);
    return 2;
  } catch (const railshard::Error& error) {
    std::fprintf(stderr, "railshard-topo: %s\n%s", error.what(), kUsage);
    return 2;
  }
  if (args.help) {
    std::cout << kUsage << kHelp;
    return 0;
  }
  if (args.rdma) {
    try {
      const railshard::Config config = railshard::Config::fromEnvironment();
      std::cout << railshard::transport::links::ibverbs::describeRdma(config.rdma.hca,
                                                                      config.rdma.gid_index);
      return 0;
    } catch (const railshard::Error& e) {
      std::cerr << "railshard-topo: " << e.what() << "\n";
      return 2;
    }
  }
  try {
    Topology graph;
    int rank = 0;
    if (!args.file.empty()) {
      std::ifstream in(args.file);
      if (!in) throw railshard::ConfigError("cannot read '" + args.file + "'");
      std::stringstream text;
      text << in.rdbuf();
      graph = Topology::fromJson(text.str(), args.file);
    } else {
      const auto env = railshard::launcher::processEnvironment();
      const auto launch = railshard::launcher::detectEnvironment(env);
      if (launch.size > 1) {
        auto boot = railshard::launcher::bootstrapStore();
        railshard::launcher::ClusterTopologyOptions options;
        options.rank = boot.rank;
        options.size = boot.size;
        options.config = boot.config;
        graph = railshard::launcher::buildClusterTopology(*boot.store, options);
        rank = boot.rank;
        // Rank 0 hosts the store: it must stay until everyone has read the graph.
        boot.store->add("railshard/topo/tool_done", 1, std::chrono::seconds(60));
        const auto deadline = railshard::deadlineAfter(boot.config.connect_timeout);
        while (rank == 0 &&
               boot.store->add("railshard/topo/tool_done", 0, std::chrono::seconds(60)) <
                   boot.size &&
               railshard::Clock::now() < deadline) {
          ::usleep(1000);
        }
      } else {
        const auto config = railshard::Config::fromEnvironment(&env);
        railshard::launcher::discovery::DiscoveryOptions options;
        options.socket_ifname = config.socket_ifname;
        graph = railshard::launcher::discovery::discoverHost(options);
      }
    }
    if (rank != 0) return 0;
    if (!args.rails.empty()) {
      printRails(graph, args.rails[0], args.rails[1]);
    } else if (!args.path.empty()) {
      printPath(graph, args.path[0], args.path[1]);
    } else if (args.format == "json") {
      std::cout << graph.toJson();
    } else if (args.format == "dot") {
      std::cout << graph.toDot();
    } else if (args.format == "png") {
      return renderPng(graph.toDot(), args.png);
    } else {
      printSummary(graph);
    }
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "railshard-topo: %s\n", error.what());
    return 1;
  }
}
