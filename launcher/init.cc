#include "launcher/init.h"

#include "base/error.h"
#include "base/logging.h"
#include "base/memory_store.h"
#include "launcher/cgroup.h"
#include "launcher/cluster_growth.h"
#include "launcher/cluster_topology.h"
#include "launcher/environment.h"
#include "launcher/interfaces.h"
#include "launcher/job_token.h"
#include "launcher/mpi_bootstrap.h"
#include "launcher/tcp_store.h"
#include "launcher/tcp_store_server.h"
#include "transport/links/tcp/socket.h"

namespace railshard {

namespace launcher {

Bootstrap bootstrapStore() {
  const auto env = processEnvironment();
  Config config = Config::fromEnvironment(&env);
  cgroup::fitWaitsToQuota(config, env.count("RAILSHARD_SPIN_US") != 0);
  const LaunchEnvironment launch = detectEnvironment(env);
  log::configure(config.log_level, launch.rank);
  RS_LOG_DEBUG("launched by {}: rank {} of {}, local rank {}", name(launch.source), launch.rank,
               launch.size, launch.local_rank);
  RS_LOG_DEBUG("config: {}", config.describe());

  Bootstrap boot;
  boot.rank = launch.rank;
  boot.size = launch.size;
  if (launch.size == 1) {
    boot.config = config;
    boot.store = std::make_shared<MemoryStore>();
    return boot;
  }

  std::shared_ptr<TcpStoreServer> server;
  std::string store_addr = launch.store_addr;
  if (config.store_external) {
    // Someone outside the ranks (railshard-launch --elastic) hosts the store so that it
    // outlives any of them: rank 0 connects like everyone else. detectEnvironment() has
    // checked that the address is there.
    RS_LOG_DEBUG("store {} is hosted outside the ranks (RAILSHARD_STORE_EXTERNAL)", store_addr);
  } else if (launch.source == LaunchSource::kMpirun && store_addr.empty()) {
    // Rank 0 starts the store on a free port and MPI carries its address and a fresh token.
    const bool one_host = launch.local_size == launch.size;
    auto rendezvous = exchangeThroughMpi(launch.rank, [&] {
      std::string host = !config.socket_ifname.empty()
                             ? addressForInterface(config.socket_ifname)
                             : (one_host ? "127.0.0.1" : defaultHostAddress());
      const std::string spec = transport::links::tcp::joinHostPort(host, 0);
      const std::string token = config.token.empty() ? makeJobToken() : config.token;
      server = std::make_shared<TcpStoreServer>(
          transport::links::tcp::resolve(spec, "store address"), token);
      return StoreRendezvous{server->address().toString(), token};
    });
    store_addr = rendezvous.store_addr;
    config.token = rendezvous.token;
  } else if (launch.rank == 0) {
    if (launch.store_fd >= 0) {
      server = TcpStoreServer::adopt(launch.store_fd, config.token);
    } else {
      server = std::make_shared<TcpStoreServer>(
          transport::links::tcp::resolve(store_addr, "RAILSHARD_STORE_ADDR"), config.token);
    }
  }
  if (config.token.empty()) {
    RS_LOG_WARN(
        "RAILSHARD_TOKEN is not set: the store and data ports accept any client that "
        "knows the address");
  }
  boot.config = config;
  boot.join = launch.join;
  boot.store_addr = store_addr;
  boot.server_keepalive = server;

  const std::string store_host =
      transport::links::tcp::splitHostPort(store_addr, "store address").first;
  boot.advertise_host = advertiseAddress(config.socket_ifname, store_host);

  boot.store = std::make_shared<TcpStore>(store_addr, config.token, config.connect_timeout);
  return boot;
}

}  // namespace launcher

std::unique_ptr<Communicator> launcher::formCommunicator(std::shared_ptr<Store> store, int rank,
                                                         int size, const Config& config,
                                                         const std::string& advertise_host) {
  Communicator::Options options;
  options.rank = rank;
  options.size = size;
  options.config = config;
  options.advertise_host = advertise_host;
  options.store = store;
  ClusterTopologyOptions topology;
  topology.rank = rank;
  topology.size = size;
  topology.config = config;
  const Clock::time_point start = Clock::now();
  options.topology =
      std::make_shared<const topology::Topology>(buildClusterTopology(*store, topology));
  RS_LOG_DEBUG("rank {}: cluster topology agreed in {:.1f} ms", rank,
               std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  options.extend_topology = graphExtender(config);
  return Communicator::create(*store, options);
}

std::unique_ptr<Communicator> init() {
  launcher::Bootstrap boot = launcher::bootstrapStore();
  if (boot.join) {
    Communicator::Options options;
    options.config = boot.config;
    options.store = boot.store;
    options.advertise_host = boot.advertise_host;
    options.extend_topology = launcher::graphExtender(boot.config);
    auto joined = Communicator::join(
        options, std::chrono::duration_cast<Communicator::Timeout>(boot.config.timeout));
    joined->keepAlive(boot.store);
    RS_LOG_INFO("joined as rank {} of {} (launch rank {}, generation {})", joined->rank(),
                joined->size(), joined->worldRank(), joined->generation());
    return joined;
  }
  auto communicator = launcher::formCommunicator(boot.store, boot.rank, boot.size, boot.config,
                                                 boot.advertise_host);
  if (boot.size == 1) return communicator;
  // Peers may still read the store after rank 0 is connected to all of them: the server
  // lives as long as rank 0's communicator.
  communicator->keepAlive(boot.store);
  if (boot.server_keepalive) communicator->keepAlive(boot.server_keepalive);
  RS_LOG_INFO("rank {} of {} ready (store {}, advertising {})", boot.rank, boot.size,
              boot.store_addr, boot.advertise_host);
  return communicator;
}

}  // namespace railshard
