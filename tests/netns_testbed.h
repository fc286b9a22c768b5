#pragma once

// The two-host namespace test bed (benchmarks/testbed/testbed.sh) as a GoogleTest fixture:
// hosts "<name>-h0" and "<name>-h1" joined by rail0 (400 Mbit/s, 10.200.0.0/24) and rail1
// (100 Mbit/s, 10.201.0.0/24), torn down after each test. Needs root and iproute2; skips
// otherwise.
#include <gtest/gtest.h>
#include <unistd.h>

#include <future>
#include <map>
#include <string>
#include <vector>

#include "test_util.h"

namespace railshard::test {

class NetnsTestbed : public ::testing::Test {
 protected:
  const std::string testbed_ = std::string(RAILSHARD_SOURCE_DIR) + "/benchmarks/testbed/testbed.sh";

  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
    name_ = "rst" + std::to_string(::getpid() % 100000);  // <= 8 characters
    runProcess({testbed_, "down", name_});
    const ProcessResult up = runProcess({testbed_, "up", name_, "2", "400mbit", "100mbit"});
    if (up.exit_code != 0) {
      GTEST_SKIP() << "cannot build the namespace test bed (no netns/veth/tc support?): " << up.err;
    }
    ready_ = true;
  }
  void TearDown() override {
    if (ready_) runProcess({testbed_, "down", name_});
  }

  // Rank r of 2 in host r of the test bed (host name "<name>-h<r>").
  std::future<ProcessResult> startRank(int rank, const std::vector<std::string>& command,
                                       std::map<std::string, std::string> env) {
    std::vector<std::string> argv = {testbed_, "run", name_, std::to_string(rank)};
    argv.insert(argv.end(), command.begin(), command.end());
    env["RAILSHARD_RANK"] = std::to_string(rank);
    env["RAILSHARD_WORLD_SIZE"] = "2";
    // The store listens on rail 0 in namespace a; nothing else uses this port there.
    env["RAILSHARD_STORE_ADDR"] = "10.200.0.1:29500";
    env["RAILSHARD_TOKEN"] = "netns-test-token";
    env["RAILSHARD_CONNECT_TIMEOUT"] = "30";
    return std::async(std::launch::async,
                      [argv, env] { return runProcess(argv, env, std::chrono::seconds(90)); });
  }

  // `testbed.sh COMMAND NAME ARGS...` on this test bed (rate, link).
  ProcessResult testbed(const std::string& command, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {testbed_, command, name_};
    argv.insert(argv.end(), args.begin(), args.end());
    return runProcess(argv);
  }

  std::string name_;
  bool ready_ = false;
};

}  // namespace railshard::test
