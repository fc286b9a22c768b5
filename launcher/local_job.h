#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "launcher/rank_environment.h"

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
  // Elastic mode: up to `max_failures` ranks may fail (non-zero status or a signal) while the
  // others carry on; the failure after that stops the job as in normal mode. The launcher
  // then hosts the rendezvous store itself, so that it outlives any rank, tells every rank so
  // (RAILSHARD_STORE_EXTERNAL=1, no RAILSHARD_STORE_FD), and marks each failed rank in it:
  // key kLostRankKeyPrefix + "<rank>", value how it ended ("exited with status 3").
  bool elastic = false;
  int max_failures = 1;
  // Elastic mode: a failed rank is started again, up to `max_restarts` times in all, with
  // RAILSHARD_JOIN=1 (its own slot's RAILSHARD_RANK; init() then joins the running job through
  // the launcher's store, and the members let it in with grow()). Each restart is also a
  // failure counted against max_failures.
  int max_restarts = 0;
  // Elastic mode: the job carries on after a failure only while at least `min_ranks` ranks
  // are left running (a rank being restarted counts); 0: no floor. With it, max_failures
  // may be left at its maximum (railshard-launch --min-ranks alone does that).
  int min_ranks = 0;
  // Several hosts, one launcher on each (railshard-launch --nnodes N --node-rank K --master
  // HOST:PORT): this launcher's world_size ranks are ranks K * world_size ... of a job of
  // N * world_size, every one dials the store at `master`, which node 0's launcher hosts
  // (listening on that address, so it must be node 0's; ranks get RAILSHARD_STORE_EXTERNAL=1)
  // until every node's ranks have ended (each launcher counts its node in when its ranks
  // have: kNodesDoneKey; at most kNodesDoneWait after its own). torch's store (MASTER_ADDR)
  // is the master's host, its port the next one. Needs the same `token` on every node; not
  // with elastic.
  int nnodes = 1;
  int node_rank = 0;
  std::string master;
  // Named in the failure line; empty: this machine's host name.
  std::string host_name;
  // Per rank slot, the control groups' cgroup.procs the rank enters before it execs (its CPU
  // quota and memory limit under --emulate-speeds / --emulate-memory: launcher/rank_groups.h);
  // a restarted rank enters its slot's. Empty: none.
  std::vector<std::vector<std::string>> cgroup_procs;
  // Called with one line (no newline) for each thing the user should know: a rank failed, a
  // signal was forwarded, ranks had to be killed.
  std::function<void(const std::string& line)> notice;
};

// Where an elastic job marks a failed rank in the store (see LocalJobOptions::elastic).
inline constexpr const char* kLostRankKeyPrefix = "railshard/lost/";
// Several hosts: how many nodes' ranks have all ended (LocalJobOptions::nnodes), and how long
// node 0's launcher keeps the store for the others after its own ranks ended.
inline constexpr const char* kNodesDoneKey = "railshard/launch/nodes_done";
inline constexpr std::chrono::seconds kNodesDoneWait{60};

// Starts the ranks, forwards their output line by line, and supervises them: the first rank
// that fails (non-zero status or a signal) is reported in one line (rank, host, how it ended,
// its last non-blank stderr line) and has the others stopped with SIGTERM, then SIGKILL after
// the grace period; in elastic mode that happens only at failure max_failures + 1. SIGINT and
// SIGTERM to this process are forwarded to every rank the same way (a second one kills at
// once). Returns the status the launcher should exit with: 0 when every rank exited 0 (elastic:
// when at most max_failures ranks failed and at least one rank exited 0), else the first
// failed rank's status (128 + signal when it was killed), or 128 + signal when this process
// was told to stop.
//
// Blocks SIGINT, SIGTERM, SIGCHLD and SIGPIPE while it runs (the previous mask comes back on
// return), so call it from the main thread of a single-threaded program such as the launcher.
// Throws SpawnError when the command cannot be executed, Error when the store address cannot
// be bound; ranks already started are killed before the exception leaves.
int runLocalJob(const LocalJobOptions& options);

// How a rank ended, for the failure line and the lost mark: "exited with status 3",
// "killed by SIGKILL".
std::string describeEnding(int exit_code, int signal);

}  // namespace railshard::launcher
