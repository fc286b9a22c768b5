#include "tests/test_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace railshard::test {

ProcessResult runProcess(const std::vector<std::string>& argv,
                         const std::map<std::string, std::string>& extra_env,
                         std::chrono::milliseconds timeout) {
  int out_pipe[2];
  int err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    throw std::runtime_error("pipe failed");
  }
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    const std::string key = entry.substr(0, entry.find('='));
    if (extra_env.count(key) == 0) env_strings.push_back(entry);
  }
  for (const auto& [k, v] : extra_env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> argp;
  for (auto& s : args) argp.push_back(s.data());
  argp.push_back(nullptr);

  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    ::execvpe(argp[0], argp.data(), envp.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  ProcessResult result;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  char buffer[65536];
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      result.timed_out = true;
      ::kill(-pid, SIGKILL);
      break;
    }
    if (::poll(fds, 2, static_cast<int>(std::min<long long>(left, 1000))) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof(buffer));
      if (n <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      } else {
        (i == 0 ? result.out : result.err).append(buffer, static_cast<size_t>(n));
      }
    }
  }
  for (auto& p : fds) {
    if (p.fd >= 0) ::close(p.fd);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  return result;
}

std::vector<std::exception_ptr> runRanks(int size, const std::function<void(int rank)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        fn(rank);
      } catch (...) {
        errors[static_cast<size_t>(rank)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

void rethrowFirst(const std::vector<std::exception_ptr>& errors) {
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

namespace {

// This process's directory under the test temporary directory, made on first use and removed
// with everything in it when the process exits (a test binary leaves nothing behind, unless
// it crashed). A child of a test (fork) inherits the path but not the removal.
class ProcessTempDir {
 public:
  ProcessTempDir() {
    std::string base = ::testing::TempDir();
    if (!base.empty() && base.back() != '/') base += '/';
    path_ = base + "railshard_test_" + std::to_string(::getpid());
    std::filesystem::create_directories(path_);
  }
  ~ProcessTempDir() {
    if (::getpid() != owner_) return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  pid_t owner_ = ::getpid();
};

}  // namespace

std::string tempPath(const std::string& name) {
  static ProcessTempDir dir;
  return dir.path() + "/" + name;
}

int freePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::vector<std::vector<std::string>> perfTableRows(const std::string& out, size_t columns) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("[", 0) == 0 && line.find("] ") != std::string::npos) {
      line = line.substr(line.find("] ") + 2);
    }
    std::istringstream words(line);
    std::vector<std::string> row;
    std::string word;
    while (words >> word) row.push_back(word);
    const bool width_ok = columns > 0 ? row.size() == columns : row.size() >= 13;
    if (width_ok && row[0].find_first_not_of("0123456789") == std::string::npos && row[4] == "-1") {
      rows.push_back(row);
    }
  }
  return rows;
}

std::vector<ProcessResult> runRanksByHand(const std::string& program, int size,
                                          const std::vector<std::string>& args,
                                          const std::map<std::string, std::string>& env,
                                          std::chrono::milliseconds limit,
                                          const std::string& token) {
  const std::string addr = "127.0.0.1:" + std::to_string(freePort());
  std::vector<ProcessResult> results(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      std::map<std::string, std::string> rank_env = env;
      rank_env["RAILSHARD_RANK"] = std::to_string(rank);
      rank_env["RAILSHARD_WORLD_SIZE"] = std::to_string(size);
      rank_env["RAILSHARD_STORE_ADDR"] = addr;
      rank_env["RAILSHARD_TOKEN"] = token;
      std::vector<std::string> argv = {program};
      argv.insert(argv.end(), args.begin(), args.end());
      results[static_cast<size_t>(rank)] = runProcess(argv, rank_env, limit);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace railshard::test
