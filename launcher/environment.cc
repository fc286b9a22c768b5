#include "launcher/environment.h"

#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "transport/links/tcp/socket.h"

extern char** environ;

namespace railshard::launcher {

std::string_view name(LaunchSource source) {
  switch (source) {
    case LaunchSource::kSingle:
      return "single process";
    case LaunchSource::kRailshard:
      return "railshard-launch / RAILSHARD_* variables";
    case LaunchSource::kMpirun:
      return "mpirun";
    case LaunchSource::kSlurm:
      return "Slurm";
    case LaunchSource::kTorchrun:
      return "torchrun";
  }
  return "unknown";
}

std::map<std::string, std::string> processEnvironment() {
  std::map<std::string, std::string> env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string text(*entry);
    const auto eq = text.find('=');
    if (eq != std::string::npos) env[text.substr(0, eq)] = text.substr(eq + 1);
  }
  return env;
}

namespace {

const std::string* find(const std::map<std::string, std::string>& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

int integer(const std::map<std::string, std::string>& env, const std::string& key, int min) {
  return static_cast<int>(parseInteger(key, *find(env, key), min, 1 << 24));
}

// Both or neither of a rank/size pair; a lone one is a ConfigError naming the other.
bool pair(const std::map<std::string, std::string>& env, const std::string& rank_key,
          const std::string& size_key, const std::string& launcher) {
  const bool has_rank = find(env, rank_key) != nullptr;
  const bool has_size = find(env, size_key) != nullptr;
  if (has_rank != has_size) {
    throw ConfigError("incomplete " + launcher +
                      " environment: " + (has_rank ? rank_key : size_key) + " is set but " +
                      (has_rank ? size_key : rank_key) + " is not");
  }
  return has_rank;
}

void checkRange(LaunchEnvironment& e, const std::string& rank_key, const std::string& size_key) {
  if (e.rank >= e.size) {
    throw ConfigError(rank_key + "=" + std::to_string(e.rank) + " is not below " + size_key + "=" +
                      std::to_string(e.size));
  }
}

// Other launchers' rank variables must agree with the one we chose: a mismatch means two
// launchers are stacked (e.g. torchrun inside mpirun) and we would join the wrong world.
void crossCheck(const std::map<std::string, std::string>& env, const LaunchEnvironment& e,
                const std::string& chosen_rank_key) {
  const std::vector<std::pair<std::string, std::string>> others = {
      {"RAILSHARD_RANK", "RAILSHARD_WORLD_SIZE"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
      {"PMIX_RANK", ""},
      {"SLURM_PROCID", "SLURM_NTASKS"},
      {"RANK", "WORLD_SIZE"}};
  for (const auto& [rank_key, size_key] : others) {
    if (rank_key == chosen_rank_key) continue;
    const std::string* rank = find(env, rank_key);
    if (rank != nullptr && *rank != std::to_string(e.rank)) {
      // Slurm steps that run one task per node under mpirun and similar layouts differ
      // legitimately only when the world size differs too.
      const std::string* size = size_key.empty() ? nullptr : find(env, size_key);
      if (size != nullptr && *size != std::to_string(e.size)) continue;
      throw ConfigError("contradictory environment: " + chosen_rank_key + " says rank " +
                        std::to_string(e.rank) + " but " + rank_key + "=" + *rank);
    }
  }
}

}  // namespace

namespace {

// Which launcher started us and what it says; see detectEnvironment().
LaunchEnvironment detectSource(const std::map<std::string, std::string>& env) {
  LaunchEnvironment e;
  if (pair(env, "RAILSHARD_RANK", "RAILSHARD_WORLD_SIZE", "railshard")) {
    e.source = LaunchSource::kRailshard;
    e.rank = integer(env, "RAILSHARD_RANK", 0);
    e.size = integer(env, "RAILSHARD_WORLD_SIZE", 1);
    checkRange(e, "RAILSHARD_RANK", "RAILSHARD_WORLD_SIZE");
    e.local_rank = find(env, "RAILSHARD_LOCAL_RANK") ? integer(env, "RAILSHARD_LOCAL_RANK", 0) : 0;
    e.local_size = 0;  // unknown
    if (const auto* addr = find(env, "RAILSHARD_STORE_ADDR")) e.store_addr = *addr;
    if (const auto* fd = find(env, "RAILSHARD_STORE_FD")) {
      e.store_fd = static_cast<int>(parseInteger("RAILSHARD_STORE_FD", *fd, 0, 1 << 20));
    }
    if (e.size > 1 && e.store_addr.empty()) {
      throw ConfigError("RAILSHARD_RANK and RAILSHARD_WORLD_SIZE=" + std::to_string(e.size) +
                        " are set but RAILSHARD_STORE_ADDR (host:port of rank 0's store) is "
                        "not");
    }
    crossCheck(env, e, "RAILSHARD_RANK");
    return e;
  }
  if (pair(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun")) {
    e.source = LaunchSource::kMpirun;
    e.rank = integer(env, "OMPI_COMM_WORLD_RANK", 0);
    e.size = integer(env, "OMPI_COMM_WORLD_SIZE", 1);
    checkRange(e, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
    if (find(env, "OMPI_COMM_WORLD_LOCAL_RANK")) {
      e.local_rank = integer(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0);
    }
    e.local_size =
        find(env, "OMPI_COMM_WORLD_LOCAL_SIZE") ? integer(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1) : 0;
    if (const auto* addr = find(env, "RAILSHARD_STORE_ADDR")) e.store_addr = *addr;
    crossCheck(env, e, "OMPI_COMM_WORLD_RANK");
    return e;
  }
  if (find(env, "PMIX_RANK") != nullptr) {
    throw ConfigError(
        "PMIX_RANK is set but OMPI_COMM_WORLD_SIZE is not: railshard needs the "
        "world size; launch with OpenMPI's mpirun or set RAILSHARD_RANK, "
        "RAILSHARD_WORLD_SIZE and RAILSHARD_STORE_ADDR");
  }
  if (pair(env, "SLURM_PROCID", "SLURM_NTASKS", "Slurm")) {
    e.source = LaunchSource::kSlurm;
    e.rank = integer(env, "SLURM_PROCID", 0);
    e.size = integer(env, "SLURM_NTASKS", 1);
    checkRange(e, "SLURM_PROCID", "SLURM_NTASKS");
    if (find(env, "SLURM_LOCALID")) e.local_rank = integer(env, "SLURM_LOCALID", 0);
    e.local_size = 0;
    if (const auto* addr = find(env, "RAILSHARD_STORE_ADDR")) e.store_addr = *addr;
    if (e.size > 1 && e.store_addr.empty()) {
      throw ConfigError("Slurm environment found (SLURM_PROCID=" + std::to_string(e.rank) +
                        ", SLURM_NTASKS=" + std::to_string(e.size) +
                        ") but RAILSHARD_STORE_ADDR is not set: export it as "
                        "<first node's address>:<free port> in the batch script");
    }
    crossCheck(env, e, "SLURM_PROCID");
    return e;
  }
  if (pair(env, "RANK", "WORLD_SIZE", "torchrun")) {
    e.source = LaunchSource::kTorchrun;
    e.rank = integer(env, "RANK", 0);
    e.size = integer(env, "WORLD_SIZE", 1);
    checkRange(e, "RANK", "WORLD_SIZE");
    if (find(env, "LOCAL_RANK")) e.local_rank = integer(env, "LOCAL_RANK", 0);
    e.local_size = find(env, "LOCAL_WORLD_SIZE") ? integer(env, "LOCAL_WORLD_SIZE", 1) : 0;
    if (const auto* addr = find(env, "RAILSHARD_STORE_ADDR")) {
      e.store_addr = *addr;
    } else {
      const auto* master = find(env, "MASTER_ADDR");
      const auto* port = find(env, "MASTER_PORT");
      if (e.size > 1 && (master == nullptr || port == nullptr)) {
        throw ConfigError("torchrun environment found (RANK=" + std::to_string(e.rank) +
                          ", WORLD_SIZE=" + std::to_string(e.size) + ") but " +
                          (master == nullptr ? "MASTER_ADDR" : "MASTER_PORT") +
                          " is not set (or set RAILSHARD_STORE_ADDR)");
      }
      if (master != nullptr && port != nullptr) {
        // torchrun's own store owns MASTER_PORT; ours takes the next port.
        const int next = static_cast<int>(parseInteger("MASTER_PORT", *port, 1, 65534)) + 1;
        e.store_addr = transport::links::tcp::joinHostPort(*master, static_cast<uint16_t>(next));
      }
    }
    crossCheck(env, e, "RANK");
    return e;
  }
  return e;  // single process
}

}  // namespace

LaunchEnvironment detectEnvironment(const std::map<std::string, std::string>& env) {
  LaunchEnvironment e = detectSource(env);
  if (const auto* external = find(env, "RAILSHARD_STORE_EXTERNAL")) {
    e.store_external = parseInteger("RAILSHARD_STORE_EXTERNAL", *external, 0, 1) == 1;
  }
  if (const auto* join = find(env, "RAILSHARD_JOIN")) {
    e.join = parseInteger("RAILSHARD_JOIN", *join, 0, 1) == 1;
  }
  if (e.join && !e.store_external) {
    throw ConfigError(
        "RAILSHARD_JOIN=1 joins a running job through its store: set RAILSHARD_STORE_EXTERNAL=1 "
        "and RAILSHARD_STORE_ADDR to the job's store (railshard-launch --max-restarts does)");
  }
  if (e.join && e.size < 2) {
    throw ConfigError(
        "RAILSHARD_JOIN=1 needs the launch environment of a job of several ranks "
        "(RAILSHARD_RANK and RAILSHARD_WORLD_SIZE of the slot it takes); found a world of 1 "
        "rank");
  }
  if (!e.store_external) return e;
  // An external store is one nobody here starts: without its address (under mpirun rank 0
  // would otherwise start one and send the address round) there is nothing to connect to.
  if (e.size > 1 && e.store_addr.empty()) {
    throw ConfigError(
        "RAILSHARD_STORE_EXTERNAL=1 says the store is hosted outside the ranks, but "
        "RAILSHARD_STORE_ADDR (its host:port) is not set");
  }
  if (e.store_fd >= 0) {
    throw ConfigError(
        "contradictory environment: RAILSHARD_STORE_EXTERNAL=1 says no rank hosts the store, "
        "but RAILSHARD_STORE_FD hands rank " +
        std::to_string(e.rank) + " a socket to host it on");
  }
  return e;
}

}  // namespace railshard::launcher
