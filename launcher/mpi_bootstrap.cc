#include "launcher/mpi_bootstrap.h"

#include <cstdlib>
#include <vector>

#include "base/error.h"

#ifdef RAILSHARD_HAVE_MPI
// C bindings only: the C++ ones would drag libmpi_cxx into every user of the library.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace railshard::launcher {

#ifdef RAILSHARD_HAVE_MPI

bool mpiBootstrapAvailable() {
  return true;
}

namespace {

void finalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::string broadcastString(int rank, const std::string& value) {
  int length = rank == 0 ? static_cast<int>(value.size()) : 0;
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::vector<char> buffer(value.begin(), value.end());
  buffer.resize(static_cast<size_t>(length));
  MPI_Bcast(buffer.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
  return std::string(buffer.begin(), buffer.end());
}

}  // namespace

StoreRendezvous exchangeThroughMpi(int rank, const std::function<StoreRendezvous()>& host_store) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    std::atexit(finalizeAtExit);
  }
  int mpi_rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
  if (mpi_rank != rank) {
    throw ConfigError("MPI_COMM_WORLD rank " + std::to_string(mpi_rank) +
                      " differs from OMPI_COMM_WORLD_RANK " + std::to_string(rank));
  }
  StoreRendezvous mine;
  // Rank 0 reports a failure to start the store as an empty address, so that nobody waits
  // in MPI_Bcast for an answer that will not come.
  std::string error;
  if (rank == 0) {
    try {
      mine = host_store();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  StoreRendezvous result;
  result.store_addr = broadcastString(rank, error.empty() ? mine.store_addr : "");
  result.token = broadcastString(rank, mine.token);
  if (result.store_addr.empty()) {
    throw ConfigError("rank 0 could not start the store" + (error.empty() ? "" : ": " + error));
  }
  return result;
}

#else

bool mpiBootstrapAvailable() {
  return false;
}

StoreRendezvous exchangeThroughMpi(int, const std::function<StoreRendezvous()>&) {
  throw ConfigError(
      "started by mpirun, but this railshard was built without MPI, so rank 0 cannot share the "
      "store address: set RAILSHARD_STORE_ADDR=host:port (and RAILSHARD_TOKEN) for every rank, "
      "or rebuild with libopenmpi-dev installed");
}

#endif

}  // namespace railshard::launcher
