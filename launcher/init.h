#pragma once

#include <memory>
#include <string>

#include "base/config.h"
#include "base/store.h"
#include "core/communicator.h"

namespace railshard {

// Builds the world communicator from whatever launched this process: railshard-launch or
// RAILSHARD_* variables set by hand, mpirun, Slurm or torchrun (see launcher/environment.h),
// or a single rank when nothing did. Rank 0 hosts the rendezvous store; everyone connects to
// it, exchanges addresses and forms the full mesh. Throws ConfigError for a bad environment,
// TimeoutError when peers do not show up within RAILSHARD_CONNECT_TIMEOUT.
// With RAILSHARD_JOIN=1 (a rank railshard-launch --max-restarts restarted, or one started by
// hand) it joins the running job instead: Communicator::join() through the job's store,
// waiting up to RAILSHARD_TIMEOUT for the members' next grow(); the communicator it returns
// has generation() > 0, and the members hand it their state from rank 0 (docs/reliability.md).
std::unique_ptr<Communicator> init();

namespace launcher {

// What init() has before it forms the mesh: this rank's place in the world and a store every
// rank is connected to. Exposed so that other libraries (the Gloo benchmark backend) can
// rendezvous through the same launch environment without a second bootstrap.
struct Bootstrap {
  int rank = 0;
  int size = 1;
  std::shared_ptr<Store> store;  // rank 0's TCP store; a MemoryStore when size is 1
  // Rank 0: the store server. Keep it as long as any rank may still use the store.
  std::shared_ptr<void> server_keepalive;
  Config config;               // from the environment, token filled in when MPI carried it
  std::string store_addr;      // host:port; empty when size is 1
  std::string advertise_host;  // the address peers reach this rank at; empty when size is 1
  bool join = false;           // RAILSHARD_JOIN=1: join the running job (init() calls join())
};

// The environment detection and store hosting init() does (same variables, same errors):
// rank 0 starts the store (or adopts railshard-launch's socket, or gets its address to the
// others through MPI) and every rank connects to it.
Bootstrap bootstrapStore();

// Forms the communicator of `size` ranks that reach one another through `store`: agrees on the
// cluster graph (discovery, or RAILSHARD_TOPO_FILE; the rail probe when RAILSHARD_PROBE=1),
// then builds the transports and shared memory. The one way init() and the torch.distributed
// backend make theirs, so both get the same graph, links and algorithms from the same
// configuration. `advertise_host`: this rank's address for its peers (advertiseAddress()).
std::unique_ptr<Communicator> formCommunicator(std::shared_ptr<Store> store, int rank, int size,
                                               const Config& config,
                                               const std::string& advertise_host);

}  // namespace launcher
}  // namespace railshard
