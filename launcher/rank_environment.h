#pragma once

#include <string>
#include <vector>

namespace railshard::launcher {

// Where one rank sits: its rank in the job and the job's size, and its place among the ranks
// its launcher starts on this host (one launcher per host: railshard-launch --nnodes).
struct RankPlace {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
};

// The environment of one rank: `base` without any RAILSHARD_* launch variables it carries
// (from an enclosing job, say), plus RAILSHARD_RANK, RAILSHARD_WORLD_SIZE,
// RAILSHARD_LOCAL_RANK, RAILSHARD_STORE_ADDR, RAILSHARD_TOKEN, RAILSHARD_STORE_FD when
// store_fd >= 0, RAILSHARD_STORE_EXTERNAL=1 when store_external and RAILSHARD_ELASTIC=1 when
// elastic (the launcher keeps the job going when a rank fails: a program can check it).
std::vector<std::string> rankEnvironment(const std::vector<std::string>& base,
                                         const RankPlace& place, const std::string& store_addr,
                                         const std::string& token, int store_fd,
                                         bool store_external = false, bool elastic = false);

// What torch.distributed's env:// rendezvous (and torchrun-style scripts) read: RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, and MASTER_ADDR=master_addr / MASTER_PORT=
// master_port unless `base` sets them (a user's choice is kept; every rank sees the same one),
// and OMP_NUM_THREADS=1 when the host runs several ranks and `base` has none (as torchrun).
// Appended to each rank's environment, so dist.init_process_group("railshard") works
// unchanged under railshard-launch. The rank variables always follow RAILSHARD_RANK: an
// enclosing torchrun's values would contradict it.
std::vector<std::string> torchEnvironment(const std::vector<std::string>& base,
                                          const RankPlace& place, const std::string& master_addr,
                                          int master_port);

}  // namespace railshard::launcher
