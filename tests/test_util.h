#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace railshard::test {

// Built with AddressSanitizer: freed memory sits in its quarantine (up to 256 MiB) instead of
// going back to the allocator, so resident memory grows by design and RSS bounds do not hold
// (LeakSanitizer checks leaks at exit instead).
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

struct ProcessResult {
  int exit_code = -1;  // valid when exited normally
  int signal = 0;      // non-zero when killed by a signal
  bool timed_out = false;
  std::string out;
  std::string err;
};

// Runs argv as a child process with `extra_env` added to this process's environment,
// capturing stdout and stderr. Kills it (SIGKILL, whole process group) after `timeout`.
ProcessResult runProcess(const std::vector<std::string>& argv,
                         const std::map<std::string, std::string>& extra_env = {},
                         std::chrono::milliseconds timeout = std::chrono::seconds(120));

// Starts `size` ranks of `program` with `args` and RAILSHARD_RANK/WORLD_SIZE/STORE_ADDR/TOKEN
// set (rank 0 hosts the store), plus `env`, each as its own process; returns each rank's
// result, by rank.
std::vector<ProcessResult> runRanksByHand(const std::string& program, int size,
                                          const std::vector<std::string>& args,
                                          const std::map<std::string, std::string>& env,
                                          std::chrono::milliseconds limit,
                                          const std::string& token = "test");

// Runs fn(rank) on `size` threads and joins them; element r is rank r's exception (or null).
std::vector<std::exception_ptr> runRanks(int size, const std::function<void(int rank)>& fn);

// Rethrows the first non-null exception of runRanks' result.
void rethrowFirst(const std::vector<std::exception_ptr>& errors);

// A free TCP port on 127.0.0.1 at the time of the call.
int freePort();

// A path in a directory of the test temporary directory unique to this process (ctest runs
// the cases of one binary as parallel processes, which would otherwise overwrite each other's
// files); the directory goes when the process exits.
std::string tempPath(const std::string& name);

// The data rows of allreduce_perf's table (a launcher's "[r] " prefix removed), split into
// words: size, count, type, redop, root, time/algbw/busbw/#wrong out-of-place and in-place,
// and the efficiency column when the link limit is known. `columns` > 0: only rows of
// exactly that many words.
std::vector<std::vector<std::string>> perfTableRows(const std::string& out, size_t columns = 0);

}  // namespace railshard::test
