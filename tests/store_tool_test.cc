// railshard-store, the standalone rendezvous store: a real process, real TCP clients
// (launcher/tcp_store.h, what every rank uses), its address file, token handling, SIGTERM, and
// usage errors. What it is for -- rank 0 killed under mpirun while the job goes on -- is
// failure_test's Elastic.UnderMpirunTheStandaloneStoreOutlivesRankZeroAndAHandStartedRankJoins.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <fcntl.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "launcher/tcp_store.h"
#include "tests/test_util.h"

extern char** environ;

namespace railshard {
namespace {

using namespace std::chrono_literals;

const std::string kStore = RAILSHARD_STORE_BIN;

// railshard-store in the background, its stderr in a file; stopped with SIGTERM.
class StoreProcess {
 public:
  explicit StoreProcess(const std::vector<std::string>& args) {
    address_file_ = test::tempPath("store.addr");
    err_file_ = test::tempPath("store.err");
    std::filesystem::remove(address_file_);
    std::vector<std::string> argv = {kStore, "--host",         "127.0.0.1",  "--port",
                                     "0",    "--address-file", address_file_};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> raw;
    for (auto& a : argv) raw.push_back(a.data());
    raw.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, err_file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    EXPECT_EQ(posix_spawn(&pid_, kStore.c_str(), &actions, nullptr, raw.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    // Bounded wait for the address file (written once it listens).
    for (int i = 0; i < 400 && !std::filesystem::exists(address_file_); ++i) {
      std::this_thread::sleep_for(25ms);
    }
    std::ifstream in(address_file_);
    std::getline(in, address_);
    std::getline(in, made_token_);
  }
  ~StoreProcess() {
    if (pid_ > 0) stop();
  }
  // SIGTERM; returns the exit status (-1 if it did not exit normally).
  int stop() {
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::string stderrText() const {
    std::ifstream in(err_file_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  const std::string& address() const { return address_; }
  const std::string& madeToken() const { return made_token_; }

 private:
  pid_t pid_ = 0;
  std::string address_file_;
  std::string err_file_;
  std::string address_;
  std::string made_token_;
};

TEST(StoreTool, ServesTheJobsClientsRefusesOthersAndStopsOnSigterm) {
  const std::string token_file = test::tempPath("token");
  std::ofstream(token_file) << "store-tool-token\n";
  StoreProcess store({"--token-file", token_file});
  ASSERT_FALSE(store.address().empty()) << store.stderrText();
  EXPECT_EQ(store.address().rfind("127.0.0.1:", 0), 0u) << store.address();
  EXPECT_TRUE(store.madeToken().empty());  // the token came from the file: not repeated
  {
    launcher::TcpStore a(store.address(), "store-tool-token", 5s);
    launcher::TcpStore b(store.address(), "store-tool-token", 5s);
    a.setString("railshard/key", "value", 5s);
    EXPECT_EQ(b.getString("railshard/key", 5s), "value");
    EXPECT_EQ(a.add("railshard/n", 2, 5s), 2);
    EXPECT_EQ(b.add("railshard/n", 3, 5s), 5);
  }
  try {
    launcher::TcpStore bad(store.address(), "another-job", 5s);
    ADD_FAILURE() << "a client with a wrong token connected";
  } catch (const PeerLostError& e) {
    EXPECT_NE(std::string(e.what()).find("RAILSHARD_TOKEN"), std::string::npos) << e.what();
  }
  // Data outlives its clients: a new one still reads it.
  launcher::TcpStore c(store.address(), "store-tool-token", 5s);
  EXPECT_EQ(c.getString("railshard/key", 5s), "value");
  EXPECT_EQ(store.stop(), 0);
  const std::string err = store.stderrText();
  EXPECT_NE(err.find("railshard-store: serving on 127.0.0.1:"), std::string::npos) << err;
  EXPECT_NE(err.find("railshard-store: stopping (SIGTERM)"), std::string::npos) << err;
  std::filesystem::remove(token_file);
}

TEST(StoreTool, WithoutATokenItMakesOneAndWritesIt) {
  ::unsetenv("RAILSHARD_TOKEN");
  StoreProcess store({});
  ASSERT_FALSE(store.address().empty()) << store.stderrText();
  ASSERT_EQ(store.madeToken().size(), 32u) << store.madeToken();
  launcher::TcpStore client(store.address(), store.madeToken(), 5s);
  client.setString("k", "v", 5s);
  EXPECT_EQ(client.getString("k", 5s), "v");
  EXPECT_EQ(store.stop(), 0);
}

TEST(StoreTool, BadOptionsAndABusyPortAreReportedByName) {
  const auto unknown = test::runProcess({kStore, "--bogus"}, {}, 10s);
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.err.find("railshard-store: unknown option '--bogus'"), std::string::npos)
      << unknown.err;
  const auto port = test::runProcess({kStore, "--port", "70000"}, {}, 10s);
  EXPECT_EQ(port.exit_code, 2);
  EXPECT_NE(port.err.find("--port"), std::string::npos) << port.err;
  const auto token = test::runProcess({kStore, "--token-file", "/nonexistent/token"}, {}, 10s);
  EXPECT_EQ(token.exit_code, 1);
  EXPECT_NE(token.err.find("--token-file: cannot read '/nonexistent/token'"), std::string::npos)
      << token.err;

  StoreProcess first({});
  ASSERT_FALSE(first.address().empty());
  const std::string port_text = first.address().substr(first.address().rfind(':') + 1);
  const auto busy = test::runProcess({kStore, "--host", "127.0.0.1", "--port", port_text},
                                     {{"RAILSHARD_TOKEN", "t"}}, 10s);
  EXPECT_EQ(busy.exit_code, 1) << busy.err;
  EXPECT_NE(busy.err.find("railshard-store: "), std::string::npos) << busy.err;
  EXPECT_NE(busy.err.find(port_text), std::string::npos) << busy.err;
}

}  // namespace
}  // namespace railshard
