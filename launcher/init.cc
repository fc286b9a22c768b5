#include "launcher/init.h"

#include "core/base/error.h"
#include "core/base/logging.h"
#include "core/base/memory_store.h"
#include "launcher/environment.h"
#include "launcher/interfaces.h"
#include "launcher/job_token.h"
#include "launcher/mpi_bootstrap.h"
#include "launcher/tcp_store.h"
#include "launcher/tcp_store_server.h"
#include "transport/tcp/socket.h"

namespace railshard {

namespace {

bool isLoopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

}  // namespace

std::unique_ptr<Communicator> init() {
  const auto env = launcher::processEnvironment();
  Config config = Config::fromEnvironment(&env);
  const launcher::LaunchEnvironment launch = launcher::detectEnvironment(env);
  log::configure(config.log_level, launch.rank);
  RS_LOG_DEBUG("launched by {}: rank {} of {}, local rank {}", launcher::name(launch.source),
               launch.rank, launch.size, launch.local_rank);
  RS_LOG_DEBUG("config: {}", config.describe());

  Communicator::Options options;
  options.rank = launch.rank;
  options.size = launch.size;
  options.config = config;
  if (launch.size == 1) {
    MemoryStore store;
    return Communicator::create(store, options);
  }

  std::shared_ptr<launcher::TcpStoreServer> server;
  std::string store_addr = launch.store_addr;
  if (launch.source == launcher::LaunchSource::kMpirun && store_addr.empty()) {
    // Rank 0 starts the store on a free port and MPI carries its address and a fresh token.
    const bool one_host = launch.local_size == launch.size;
    auto rendezvous = launcher::exchangeThroughMpi(launch.rank, [&] {
      std::string host = !config.socket_ifname.empty()
                             ? launcher::addressForInterface(config.socket_ifname)
                             : (one_host ? "127.0.0.1" : launcher::defaultHostAddress());
      const std::string spec =
          host.find(':') != std::string::npos ? "[" + host + "]:0" : host + ":0";
      const std::string token = config.token.empty() ? launcher::makeJobToken() : config.token;
      server = std::make_shared<launcher::TcpStoreServer>(
          transport::tcp::resolve(spec, "store address"), token);
      return launcher::StoreRendezvous{server->address().toString(), token};
    });
    store_addr = rendezvous.store_addr;
    config.token = rendezvous.token;
  } else if (launch.rank == 0) {
    if (launch.store_fd >= 0) {
      server = launcher::TcpStoreServer::adopt(launch.store_fd, config.token);
    } else {
      server = std::make_shared<launcher::TcpStoreServer>(
          transport::tcp::resolve(store_addr, "RAILSHARD_STORE_ADDR"), config.token);
    }
  }
  if (config.token.empty()) {
    RS_LOG_WARN(
        "RAILSHARD_TOKEN is not set: the store and data ports accept any client that "
        "knows the address");
  }
  options.config = config;

  const std::string store_host = transport::tcp::splitHostPort(store_addr, "store address").first;
  if (!config.socket_ifname.empty()) {
    options.advertise_host = launcher::addressForInterface(config.socket_ifname);
  } else if (isLoopback(store_host)) {
    options.advertise_host = "127.0.0.1";
  } else {
    options.advertise_host = launcher::sourceAddressFor(store_host);
  }

  auto store =
      std::make_shared<launcher::TcpStore>(store_addr, config.token, config.connect_timeout);
  auto communicator = Communicator::create(*store, options);
  // Peers may still read the store after rank 0 is connected to all of them: the server
  // lives as long as rank 0's communicator.
  communicator->keepAlive(store);
  if (server) communicator->keepAlive(server);
  RS_LOG_INFO("rank {} of {} ready (store {}, advertising {})", launch.rank, launch.size,
              store_addr, options.advertise_host);
  return communicator;
}

}  // namespace railshard
