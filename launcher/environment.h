#pragma once

#include <map>
#include <string>

namespace railshard::launcher {

// Who started this process, as read from its environment.
enum class LaunchSource { kSingle, kRailshard, kMpirun, kSlurm, kTorchrun };
std::string_view name(LaunchSource source);

struct LaunchEnvironment {
  LaunchSource source = LaunchSource::kSingle;
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;      // ranks on this host, when the launcher says (mpirun)
  std::string store_addr;  // host:port; empty under mpirun = exchange it through MPI
  int store_fd = -1;       // listening socket handed to rank 0 by railshard-launch
  // RAILSHARD_STORE_EXTERNAL=1: the store at store_addr is already running, hosted outside
  // the ranks (railshard-launch --elastic); no rank starts one.
  bool store_external = false;
  // RAILSHARD_JOIN=1: this process joins a running job (Communicator::join(), through the
  // external store) instead of forming the world with the others; rank and size are then the
  // launcher's slot, not the rank it gets. railshard-launch --max-restarts sets it for a
  // restarted rank; by hand it needs RAILSHARD_STORE_EXTERNAL=1 and the job's store address.
  bool join = false;
};

// Reads, in this order: RAILSHARD_RANK/WORLD_SIZE (railshard-launch or by hand); mpirun's
// OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK (PMIX_RANK cross-checked); Slurm's
// SLURM_PROCID/NTASKS/LOCALID; torchrun's RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT.
// None of them: a single-rank world. A partial or contradictory environment is a ConfigError
// that says what was found and what is missing. RAILSHARD_STORE_EXTERNAL=1 goes with any of
// them and needs RAILSHARD_STORE_ADDR (or torchrun's MASTER_ADDR/PORT) in a world of more
// than one rank, and no RAILSHARD_STORE_FD.
LaunchEnvironment detectEnvironment(const std::map<std::string, std::string>& env);

// This process's environment as a map.
std::map<std::string, std::string> processEnvironment();

}  // namespace railshard::launcher
