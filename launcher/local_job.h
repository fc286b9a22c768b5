#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace railshard::launcher {

// One job of railshard-launch: N ranks of one command on this host.
struct LocalJobOptions {
  int world_size = 1;
  std::vector<std::string> command;  // program (looked up in PATH) and its arguments
  // Where the rendezvous store listens. The launcher binds the socket itself and hands it to
  // rank 0, so port 0 (any free port) cannot race with another job.
  std::string store_host = "127.0.0.1";
  uint16_t store_port = 0;
  // How long ranks get between SIGTERM (or a forwarded SIGINT) and SIGKILL.
  std::chrono::milliseconds grace{std::chrono::seconds(5)};
  bool prefix_output = true;  // "[rank] " before every line a rank prints
  std::string token;          // RAILSHARD_TOKEN for every rank; empty: a fresh random one
  int stdout_fd = 1;          // where the ranks' stdout and stderr lines go
  int stderr_fd = 2;
  // Called with one line (no newline) for each thing the user should know: a rank failed, a
  // signal was forwarded, ranks had to be killed.
  std::function<void(const std::string& line)> notice;
};

// Starts the ranks, forwards their output line by line, and supervises them: the first rank
// that fails (non-zero status or a signal) has the others stopped with SIGTERM, then SIGKILL
// after the grace period; SIGINT and SIGTERM to this process are forwarded to every rank the
// same way (a second one kills at once). Returns the status the launcher should exit with:
// 0 when every rank exited 0, the failed rank's status (128 + signal when it was killed), or
// 128 + signal when this process was told to stop.
//
// Blocks SIGINT, SIGTERM, SIGCHLD and SIGPIPE while it runs (the previous mask comes back on
// return), so call it from the main thread of a single-threaded program such as the launcher.
// Throws SpawnError when the command cannot be executed, Error when the store address cannot
// be bound; ranks already started are killed before the exception leaves.
int runLocalJob(const LocalJobOptions& options);

// The environment of one rank: `base` without any RAILSHARD_* launch variables it carries
// (from an enclosing job, say), plus RAILSHARD_RANK, RAILSHARD_WORLD_SIZE,
// RAILSHARD_LOCAL_RANK, RAILSHARD_STORE_ADDR, RAILSHARD_TOKEN and, when store_fd >= 0,
// RAILSHARD_STORE_FD.
std::vector<std::string> rankEnvironment(const std::vector<std::string>& base, int rank,
                                         int world_size, const std::string& store_addr,
                                         const std::string& token, int store_fd);

}  // namespace railshard::launcher
