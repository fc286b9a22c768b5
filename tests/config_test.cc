#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "base/config.h"
#include "base/error.h"
#include "base/types.h"

namespace railshard {
namespace {

TEST(Config, DefaultsAndParsing) {
  const std::map<std::string, std::string> env = {{"RAILSHARD_TIMEOUT", "2.5"},
                                                  {"RAILSHARD_CHUNK_BYTES", "256K"},
                                                  {"RAILSHARD_LOG_LEVEL", "debug"},
                                                  {"RAILSHARD_TOKEN", "abc"}};
  const Config config = Config::fromEnvironment(&env);
  EXPECT_EQ(config.timeout.count(), 2500);
  EXPECT_EQ(config.chunk_bytes, 256u * 1024);
  EXPECT_EQ(config.log_level, LogLevel::kDebug);
  EXPECT_EQ(config.token, "abc");
  const std::map<std::string, std::string> empty;
  EXPECT_EQ(Config::fromEnvironment(&empty).chunk_bytes, size_t{1} << 20);
}

TEST(Config, RendezvousThresholdIsAutoASizeOrOff) {
  auto parse = [](const std::string& value) {
    const std::map<std::string, std::string> env = {{"RAILSHARD_IB_RENDEZVOUS", value}};
    const Config config = Config::fromEnvironment(&env);
    return std::make_pair(config.rdma.rendezvous_bytes, config.rdma.rendezvous_auto);
  };
  const std::map<std::string, std::string> empty;
  const Config defaults = Config::fromEnvironment(&empty);
  EXPECT_TRUE(defaults.rdma.rendezvous_auto);
  EXPECT_EQ(defaults.rdma.rendezvous_bytes, 512u << 10);
  EXPECT_EQ(parse("auto"), std::make_pair(size_t{512} << 10, true));
  EXPECT_EQ(parse("1M"), std::make_pair(size_t{1} << 20, false));
  EXPECT_EQ(parse("0"), std::make_pair(size_t{0}, false));
  EXPECT_EQ(parse("off"), std::make_pair(size_t{0}, false));
  EXPECT_THROW(parse("sometimes"), ConfigError);
}

TEST(Config, RendezvousVerbIsAutoReadOrWrite) {
  auto parse = [](const std::string& value) {
    const std::map<std::string, std::string> env = {{"RAILSHARD_IB_RENDEZVOUS_VERB", value}};
    return Config::fromEnvironment(&env).rdma.rendezvous_verb;
  };
  const std::map<std::string, std::string> empty;
  EXPECT_EQ(Config::fromEnvironment(&empty).rdma.rendezvous_verb, RendezvousVerb::kAuto);
  EXPECT_EQ(parse("auto"), RendezvousVerb::kAuto);
  EXPECT_EQ(parse("read"), RendezvousVerb::kRead);
  EXPECT_EQ(parse("write"), RendezvousVerb::kWrite);
  try {
    parse("put");
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("RAILSHARD_IB_RENDEZVOUS_VERB: unknown value 'put'"),
              std::string::npos)
        << e.what();
  }
}

TEST(Config, TcpConnectIsAutoEagerOrLazyAndErrorsNameItsOwnVariable) {
  auto parse = [](const std::string& value) {
    const std::map<std::string, std::string> env = {{"RAILSHARD_TCP_CONNECT", value}};
    return Config::fromEnvironment(&env).links.tcp_connect;
  };
  const std::map<std::string, std::string> empty;
  EXPECT_EQ(Config::fromEnvironment(&empty).links.tcp_connect, LaneConnect::kAuto);
  EXPECT_EQ(parse("auto"), LaneConnect::kAuto);
  EXPECT_EQ(parse("eager"), LaneConnect::kEager);
  EXPECT_EQ(parse("lazy"), LaneConnect::kLazy);
  try {
    parse("sometimes");
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("RAILSHARD_TCP_CONNECT: unknown value 'sometimes'"),
              std::string::npos)
        << e.what();
  }
}

TEST(Config, LaneConnectIsAutoEagerOrLazy) {
  auto parse = [](const std::string& value) {
    const std::map<std::string, std::string> env = {{"RAILSHARD_IB_CONNECT", value}};
    return Config::fromEnvironment(&env).rdma.connect;
  };
  const std::map<std::string, std::string> empty;
  EXPECT_EQ(Config::fromEnvironment(&empty).rdma.connect, LaneConnect::kAuto);
  EXPECT_EQ(parse("auto"), LaneConnect::kAuto);
  EXPECT_EQ(parse("eager"), LaneConnect::kEager);
  EXPECT_EQ(parse("lazy"), LaneConnect::kLazy);
  try {
    parse("later");
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("RAILSHARD_IB_CONNECT: unknown value 'later'"),
              std::string::npos)
        << e.what();
  }
}

TEST(Config, ShmSingleCopyIsAThresholdInBytesOrZero) {
  auto parse = [](const std::string& value) {
    const std::map<std::string, std::string> env = {{"RAILSHARD_SHM_SINGLE_COPY", value}};
    return Config::fromEnvironment(&env).shm.single_copy_bytes;
  };
  const std::map<std::string, std::string> empty;
  EXPECT_EQ(Config::fromEnvironment(&empty).shm.single_copy_bytes, size_t{1} << 20);
  EXPECT_EQ(parse("0"), 0u);
  EXPECT_EQ(parse("256K"), size_t{256} << 10);
  EXPECT_EQ(parse("4096"), 4096u);
  try {
    parse("on");
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("RAILSHARD_SHM_SINGLE_COPY: expected a size in bytes"),
              std::string::npos)
        << e.what();
  }
}

TEST(Config, ShmCrossReadIsProbedUnlessSet) {
  auto parse = [](const std::string& value) {
    const std::map<std::string, std::string> env = {{"RAILSHARD_SHM_CROSS_READ", value}};
    return Config::fromEnvironment(&env).shm.cross_read;
  };
  const std::map<std::string, std::string> empty;
  EXPECT_EQ(Config::fromEnvironment(&empty).shm.cross_read, CrossRead::kAuto);
  EXPECT_EQ(parse("1"), CrossRead::kOn);
  EXPECT_EQ(parse("0"), CrossRead::kOff);
  EXPECT_EQ(parse("auto"), CrossRead::kAuto);
  try {
    parse("yes");
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("RAILSHARD_SHM_CROSS_READ"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("yes"), std::string::npos) << e.what();
  }
}

TEST(Config, SharedAllocIsBytesOrOff) {
  auto parse = [](const std::string& value) {
    const std::map<std::string, std::string> env = {{"RAILSHARD_SHARED_ALLOC", value}};
    return Config::fromEnvironment(&env).shm.shared_alloc_bytes;
  };
  const std::map<std::string, std::string> empty;
  EXPECT_EQ(Config::fromEnvironment(&empty).shm.shared_alloc_bytes, size_t{1} << 20);
  EXPECT_EQ(parse("0"), 0u);
  EXPECT_EQ(parse("256K"), size_t{256} << 10);
  try {
    parse("lots");
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("RAILSHARD_SHARED_ALLOC"), std::string::npos) << e.what();
  }
}

TEST(Config, WaitIsAutoSpinOrSleep) {
  auto parse = [](const std::string& value) {
    const std::map<std::string, std::string> env = {{"RAILSHARD_WAIT", value}};
    return Config::fromEnvironment(&env).wait.mode;
  };
  const std::map<std::string, std::string> empty;
  EXPECT_EQ(Config::fromEnvironment(&empty).wait.mode, WaitMode::kAuto);
  EXPECT_EQ(parse("spin"), WaitMode::kSpin);
  EXPECT_EQ(parse("sleep"), WaitMode::kSleep);
  try {
    parse("yield");
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("RAILSHARD_WAIT: unknown value 'yield'"),
              std::string::npos)
        << e.what();
  }
}

TEST(Config, BadValuesNameTheVariableAndValue) {
  auto messageOf = [](const std::string& key, const std::string& value) {
    const std::map<std::string, std::string> env = {{key, value}};
    try {
      Config::fromEnvironment(&env);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"RAILSHARD_TIMEOUT", "-1"},
                                                        {"RAILSHARD_TIMEOUT", "soon"},
                                                        {"RAILSHARD_CHUNK_BYTES", "12Q"},
                                                        {"RAILSHARD_LOG_LEVEL", "loud"},
                                                        {"RAILSHARD_TRANSPORT", "carrier-pigeon"},
                                                        {"RAILSHARD_RAIL_WEIGHTS", "fastest"},
                                                        {"RAILSHARD_SOCKETS_PER_RAIL", "0"},
                                                        {"RAILSHARD_SOCKETS_PER_RAIL", "17"},
                                                        {"RAILSHARD_RAIL_TIMEOUT", "0.001"},
                                                        {"RAILSHARD_IB_RENDEZVOUS", "big"}}) {
    const std::string message = messageOf(key, value);
    EXPECT_NE(message.find(key), std::string::npos) << message;
    EXPECT_NE(message.find(value), std::string::npos) << message;
  }
}

// RAILSHARD_TRANSPORT and RAILSHARD_RAIL_WEIGHTS arrive as enums, and each name round-trips.
TEST(Config, TransportAndRailWeightsAreTypedAndTheirNamesRoundTrip) {
  const std::map<std::string, std::string> env = {{"RAILSHARD_TRANSPORT", "ibverbs"},
                                                  {"RAILSHARD_RAIL_WEIGHTS", "equal"}};
  const Config config = Config::fromEnvironment(&env);
  EXPECT_EQ(config.transport, TransportKind::kIbverbs);
  EXPECT_EQ(config.links.weights, RailWeights::kEqual);
  EXPECT_EQ(Config().transport, TransportKind::kAuto);
  EXPECT_EQ(Config().links.weights, RailWeights::kAdaptive);
  for (auto kind :
       {TransportKind::kAuto, TransportKind::kTcp, TransportKind::kShm, TransportKind::kIbverbs}) {
    EXPECT_EQ(transportKindFrom(std::string(name(kind))), kind) << name(kind);
  }
  for (auto weights : {RailWeights::kAdaptive, RailWeights::kStatic, RailWeights::kEqual}) {
    EXPECT_EQ(railWeightsFrom(std::string(name(weights))), weights) << name(weights);
  }
  EXPECT_EQ(name(TransportKind::kShm), "shm");
  EXPECT_EQ(name(RailWeights::kStatic), "static");
  EXPECT_THROW(transportKindFrom("Tcp"), ConfigError);  // names are exact
}

// RAILSHARD_NCCL and RAILSHARD_LOG_LEVEL too; a bad value names the variable, the value and
// every accepted name, the same way for each enum.
TEST(Config, NcclModeAndLogLevelAreTypedAndBadNamesListTheChoices) {
  const std::map<std::string, std::string> env = {{"RAILSHARD_NCCL", "off"},
                                                  {"RAILSHARD_LOG_LEVEL", "critical"}};
  const Config config = Config::fromEnvironment(&env);
  EXPECT_EQ(config.nccl, NcclMode::kOff);
  EXPECT_EQ(config.log_level, LogLevel::kCritical);
  EXPECT_EQ(Config().nccl, NcclMode::kAuto);
  EXPECT_EQ(Config().log_level, LogLevel::kWarn);
  for (auto mode : {NcclMode::kAuto, NcclMode::kOn, NcclMode::kOff}) {
    EXPECT_EQ(ncclModeFrom(std::string(name(mode))), mode) << name(mode);
  }
  const char* levels[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(name(logLevelFrom(levels[i])), levels[i]);
    EXPECT_EQ(static_cast<int>(logLevelFrom(levels[i])), i);  // least to most severe
  }
  const std::map<std::string, std::string> loud = {{"RAILSHARD_LOG_LEVEL", "loud"}};
  try {
    Config::fromEnvironment(&loud);
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "RAILSHARD_LOG_LEVEL: unknown value 'loud' (expected trace, debug, info, warn, "
                 "error, critical or off)");
  }
  try {
    railWeightsFrom("fast");
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(
        e.what(),
        "RAILSHARD_RAIL_WEIGHTS: unknown value 'fast' (expected adaptive, static or equal)");
  }
}

// docs/configuration.md documents every variable of the table, so the two cannot drift.
TEST(Config, EveryVariableIsDocumented) {
  std::ifstream file(std::string(RAILSHARD_SOURCE_DIR) + "/docs/configuration.md");
  ASSERT_TRUE(file.good());
  std::stringstream text;
  text << file.rdbuf();
  for (const auto& variable : Config::variables()) {
    EXPECT_NE(text.str().find("`" + variable.name + "`"), std::string::npos)
        << variable.name << " is missing from docs/configuration.md";
  }
}

TEST(Types, NamesParseAndSizes) {
  EXPECT_EQ(sizeOf(DataType::kBFloat16), 2u);
  EXPECT_EQ(sizeOf(DataType::kInt64), 8u);
  EXPECT_EQ(parseDataType("fp16"), DataType::kFloat16);
  EXPECT_EQ(parseDataType("float"), DataType::kFloat32);
  EXPECT_EQ(parseDataType("BF16"), DataType::kBFloat16);
  EXPECT_FALSE(parseDataType("quad").has_value());
  EXPECT_EQ(parseReduceOp("avg"), ReduceOp::kAvg);
  EXPECT_EQ(name(ReduceOp::kProd), "prod");
  EXPECT_FALSE(isValid(static_cast<DataType>(7)));
}

}  // namespace
}  // namespace railshard
