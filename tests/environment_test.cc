#include <gtest/gtest.h>

#include "base/error.h"
#include "launcher/environment.h"

namespace railshard::launcher {
namespace {

using Env = std::map<std::string, std::string>;

std::string configErrorOf(const Env& env) {
  try {
    detectEnvironment(env);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Environment, NothingMeansSingleRank) {
  const auto e = detectEnvironment({{"HOME", "/root"}});
  EXPECT_EQ(e.source, LaunchSource::kSingle);
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.size, 1);
}

TEST(Environment, RailshardVariables) {
  const auto e = detectEnvironment({{"RAILSHARD_RANK", "2"},
                                    {"RAILSHARD_WORLD_SIZE", "4"},
                                    {"RAILSHARD_LOCAL_RANK", "1"},
                                    {"RAILSHARD_STORE_ADDR", "10.0.0.1:29500"},
                                    {"RAILSHARD_STORE_FD", "3"}});
  EXPECT_EQ(e.source, LaunchSource::kRailshard);
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.store_addr, "10.0.0.1:29500");
  EXPECT_EQ(e.store_fd, 3);
}

TEST(Environment, MpirunWithoutStoreAddressLeavesItToMpi) {
  const auto e = detectEnvironment({{"OMPI_COMM_WORLD_RANK", "3"},
                                    {"OMPI_COMM_WORLD_SIZE", "4"},
                                    {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                    {"PMIX_RANK", "3"}});
  EXPECT_EQ(e.source, LaunchSource::kMpirun);
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.local_size, 4);
  EXPECT_TRUE(e.store_addr.empty());
}

TEST(Environment, SlurmNeedsAStoreAddress) {
  const auto message = configErrorOf({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "8"}});
  EXPECT_NE(message.find("RAILSHARD_STORE_ADDR"), std::string::npos) << message;
  EXPECT_NE(message.find("SLURM_NTASKS=8"), std::string::npos) << message;
  const auto e = detectEnvironment({{"SLURM_PROCID", "1"},
                                    {"SLURM_NTASKS", "8"},
                                    {"SLURM_LOCALID", "1"},
                                    {"RAILSHARD_STORE_ADDR", "n1:5000"}});
  EXPECT_EQ(e.source, LaunchSource::kSlurm);
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.size, 8);
  EXPECT_EQ(e.local_rank, 1);
}

TEST(Environment, TorchrunUsesTheNextPortAfterMasterPort) {
  const auto e = detectEnvironment({{"RANK", "1"},
                                    {"WORLD_SIZE", "2"},
                                    {"LOCAL_RANK", "1"},
                                    {"MASTER_ADDR", "node7"},
                                    {"MASTER_PORT", "29500"}});
  EXPECT_EQ(e.source, LaunchSource::kTorchrun);
  EXPECT_EQ(e.store_addr, "node7:29501");
  const auto message = configErrorOf({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "x"}});
  EXPECT_NE(message.find("MASTER_PORT"), std::string::npos) << message;
}

TEST(Environment, PrecedenceRailshardOverMpirun) {
  const auto e = detectEnvironment({{"RAILSHARD_RANK", "1"},
                                    {"RAILSHARD_WORLD_SIZE", "2"},
                                    {"RAILSHARD_STORE_ADDR", "h:1"},
                                    {"OMPI_COMM_WORLD_RANK", "1"},
                                    {"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_EQ(e.source, LaunchSource::kRailshard);
}

TEST(Environment, PartialAndContradictoryEnvironmentsAreConfigErrors) {
  EXPECT_NE(configErrorOf({{"RAILSHARD_RANK", "0"}}).find("RAILSHARD_WORLD_SIZE is not"),
            std::string::npos);
  EXPECT_NE(configErrorOf({{"OMPI_COMM_WORLD_SIZE", "4"}}).find("OMPI_COMM_WORLD_RANK"),
            std::string::npos);
  EXPECT_NE(
      configErrorOf(
          {{"RAILSHARD_RANK", "4"}, {"RAILSHARD_WORLD_SIZE", "4"}, {"RAILSHARD_STORE_ADDR", "h:1"}})
          .find("not below"),
      std::string::npos);
  EXPECT_NE(configErrorOf({{"RAILSHARD_RANK", "x"}, {"RAILSHARD_WORLD_SIZE", "4"}})
                .find("expected an integer"),
            std::string::npos);
  const auto message = configErrorOf({{"OMPI_COMM_WORLD_RANK", "1"},
                                      {"OMPI_COMM_WORLD_SIZE", "4"},
                                      {"SLURM_PROCID", "3"},
                                      {"SLURM_NTASKS", "4"}});
  EXPECT_NE(message.find("contradictory"), std::string::npos) << message;
  EXPECT_NE(message.find("SLURM_PROCID=3"), std::string::npos) << message;
  EXPECT_NE(configErrorOf({{"PMIX_RANK", "0"}}).find("OMPI_COMM_WORLD_SIZE"), std::string::npos);
}

TEST(Environment, ExternalStoreNeedsOnlyItsAddress) {
  const auto e = detectEnvironment({{"RAILSHARD_RANK", "0"},
                                    {"RAILSHARD_WORLD_SIZE", "3"},
                                    {"RAILSHARD_STORE_ADDR", "127.0.0.1:29500"},
                                    {"RAILSHARD_STORE_EXTERNAL", "1"}});
  EXPECT_TRUE(e.store_external);
  EXPECT_EQ(e.store_addr, "127.0.0.1:29500");
  EXPECT_EQ(e.store_fd, -1);
  EXPECT_FALSE(detectEnvironment({{"RAILSHARD_STORE_EXTERNAL", "0"}}).store_external);
  // Under mpirun an external store is one MPI need not announce.
  EXPECT_TRUE(detectEnvironment({{"OMPI_COMM_WORLD_RANK", "0"},
                                 {"OMPI_COMM_WORLD_SIZE", "2"},
                                 {"RAILSHARD_STORE_ADDR", "10.0.0.1:1"},
                                 {"RAILSHARD_STORE_EXTERNAL", "1"}})
                  .store_external);
}

TEST(Environment, ExternalStoreWithoutAddressOrWithASocketIsAConfigError) {
  const auto no_addr = configErrorOf({{"OMPI_COMM_WORLD_RANK", "0"},
                                      {"OMPI_COMM_WORLD_SIZE", "2"},
                                      {"RAILSHARD_STORE_EXTERNAL", "1"}});
  EXPECT_NE(no_addr.find("RAILSHARD_STORE_ADDR"), std::string::npos) << no_addr;
  const auto with_fd = configErrorOf({{"RAILSHARD_RANK", "0"},
                                      {"RAILSHARD_WORLD_SIZE", "2"},
                                      {"RAILSHARD_STORE_ADDR", "127.0.0.1:1"},
                                      {"RAILSHARD_STORE_FD", "5"},
                                      {"RAILSHARD_STORE_EXTERNAL", "1"}});
  EXPECT_NE(with_fd.find("RAILSHARD_STORE_FD"), std::string::npos) << with_fd;
  EXPECT_NE(configErrorOf({{"RAILSHARD_STORE_EXTERNAL", "yes"}}).find("RAILSHARD_STORE_EXTERNAL"),
            std::string::npos);
}

// RAILSHARD_JOIN=1 (a restarted rank): read with the slot's launch variables, and refused
// without an external store to join through or in a world of one.
TEST(Environment, JoinNeedsAnExternalStoreAndSeveralRanks) {
  const std::map<std::string, std::string> slot = {{"RAILSHARD_RANK", "2"},
                                                   {"RAILSHARD_WORLD_SIZE", "4"},
                                                   {"RAILSHARD_STORE_ADDR", "127.0.0.1:29500"},
                                                   {"RAILSHARD_STORE_EXTERNAL", "1"},
                                                   {"RAILSHARD_JOIN", "1"}};
  const auto e = detectEnvironment(slot);
  EXPECT_TRUE(e.join);
  EXPECT_EQ(e.rank, 2);
  EXPECT_FALSE(detectEnvironment({{"RAILSHARD_JOIN", "0"}}).join);
  auto internal = slot;
  internal.erase("RAILSHARD_STORE_EXTERNAL");
  EXPECT_NE(configErrorOf(internal).find("RAILSHARD_JOIN=1 joins a running job through its store: "
                                         "set RAILSHARD_STORE_EXTERNAL=1"),
            std::string::npos)
      << configErrorOf(internal);
  const auto alone = configErrorOf({{"RAILSHARD_STORE_EXTERNAL", "1"}, {"RAILSHARD_JOIN", "1"}});
  EXPECT_NE(alone.find("found a world of 1 rank"), std::string::npos) << alone;
  EXPECT_NE(configErrorOf({{"RAILSHARD_JOIN", "2"}}).find("RAILSHARD_JOIN"), std::string::npos);
}

}  // namespace
}  // namespace railshard::launcher
