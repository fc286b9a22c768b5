// The NCCL network plugin between two "hosts" (network and UTS namespaces) joined by two
// shaped rails, 400 and 100 Mbit/s (tests/netns_testbed.h): benchmarks/nccl_net_bench drives
// the plugin as NCCL's proxy does (8 connections, 8 requests in flight each), one process per
// host, every byte checked against its sender's pattern. The fused device stripes over both
// rails by measured rate; a rail taken down mid-stream costs only its bandwidth and comes back
// into use. Rates are benchmarks' business (docs/nccl-plugin.md); here: exactness, both rails
// used in the order of their rates, the failure and the return seen. Needs root; skips
// otherwise.
#include <gtest/gtest.h>

#include <regex>
#include <thread>

#include "netns_testbed.h"
#include "test_util.h"

namespace {

using railshard::test::NetnsTestbed;
using railshard::test::ProcessResult;

const std::string kBench = std::string(RAILSHARD_BINARY_DIR) + "/benchmarks/nccl_net_bench";

// "NCCL recv comm with 10.201.0.2: rail1 carried 123 bytes, ..." lines, summed per rail.
std::map<std::string, unsigned long long> railBytes(const std::string& log) {
  std::map<std::string, unsigned long long> bytes;
  const std::regex line(R"(: (rail\d) carried (\d+) bytes)");
  for (std::sregex_iterator it(log.begin(), log.end(), line), end; it != end; ++it) {
    bytes[(*it)[1]] += std::stoull((*it)[2]);
  }
  return bytes;
}

class NcclPluginNetns : public NetnsTestbed {
 protected:
  std::vector<std::string> bench(const std::string& role, int messages) {
    return {kBench,
            "--plugin",
            RAILSHARD_NCCL_PLUGIN,
            "--role",
            role,
            "--handle-file",
            handles_,
            "--comms",
            "8",
            "--bytes",
            std::to_string(1 << 20),
            "--messages",
            std::to_string(messages)};
  }
  void SetUp() override {
    NetnsTestbed::SetUp();
    handles_ = "/tmp/nccl-handles-" + std::to_string(::getpid());
    ::unlink(handles_.c_str());
  }
  void TearDown() override {
    ::unlink(handles_.c_str());
    NetnsTestbed::TearDown();
  }
  std::string handles_;
};

TEST_F(NcclPluginNetns, TheFusedDeviceStripesOverBothRailsByRateAndEveryByteIsExact) {
  auto receiver = startRank(0, bench("recv", 12), {});
  auto sender = startRank(1, bench("send", 12), {});
  const ProcessResult s = sender.get();
  const ProcessResult r = receiver.get();
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_EQ(s.exit_code, 0) << s.out << s.err;
  EXPECT_NE(r.out.find("bytes=100663296 "), std::string::npos) << r.out;  // 8 x 12 x 1 MiB
  EXPECT_NE(r.out.find("wrong=0"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("railshard-fused(rail0+rail1)"), std::string::npos) << r.err;
  const auto bytes = railBytes(s.err);  // what the sender handed each rail
  ASSERT_EQ(bytes.size(), 2u) << s.err;
  // Shaped 4:1; the veths' nominal speeds are equal, so the order comes from measurement.
  EXPECT_GT(bytes.at("rail1"), 5ull << 20) << s.err;
  EXPECT_GT(bytes.at("rail0"), 2 * bytes.at("rail1")) << s.err;
  EXPECT_EQ(bytes.at("rail0") + bytes.at("rail1"), 100663296ull) << s.err;
}

TEST_F(NcclPluginNetns, ARailDownMidStreamCostsOnlyItsBandwidthAndComesBack) {
  // ~8 s of traffic at the two rails' 0.48 Gbit/s of payload; rail1 out from 1.5 s to 4 s.
  auto receiver = startRank(0, bench("recv", 60), {});
  auto sender = startRank(1, bench("send", 60), {{"RAILSHARD_RAIL_TIMEOUT", "1"}});
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ASSERT_EQ(testbed("link", {"1", "1", "down"}).exit_code, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  ASSERT_EQ(testbed("link", {"1", "1", "up"}).exit_code, 0);
  const ProcessResult s = sender.get();
  const ProcessResult r = receiver.get();
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_EQ(s.exit_code, 0) << s.out << s.err;
  EXPECT_NE(r.out.find("bytes=503316480 "), std::string::npos) << r.out;  // 8 x 60 x 1 MiB
  EXPECT_NE(r.out.find("wrong=0"), std::string::npos) << r.out;
  // The sender took rail1 out and said why ...
  EXPECT_NE(s.err.find("rail1"), std::string::npos) << s.err;
  EXPECT_NE(s.err.find("taken out"), std::string::npos) << s.err;
  // ... and every connection ended with it back up.
  EXPECT_NE(s.err.find("rail1 carried"), std::string::npos) << s.err;
  EXPECT_EQ(s.err.find("estimated, down"), std::string::npos) << s.err;
}

}  // namespace
