#pragma once

#include <functional>
#include <string>

namespace railshard::launcher {

// True when this build can bootstrap through MPI (built with an MPI library).
bool mpiBootstrapAvailable();

struct StoreRendezvous {
  std::string store_addr;
  std::string token;
};

// Under mpirun: rank 0 calls `host_store()` (which starts the store and returns its
// host:port and token) and MPI_Bcast sends the result to every rank. Initialises MPI when
// the program has not (and finalises it at exit then). Throws ConfigError when built
// without MPI.
StoreRendezvous exchangeThroughMpi(int rank, const std::function<StoreRendezvous()>& host_store);

}  // namespace railshard::launcher
