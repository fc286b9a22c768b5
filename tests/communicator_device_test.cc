// The Communicator's choice between host and device paths (core/communicator_device.cc) as far
// as a machine without a GPU can check it: what MemoryKind does, the errors for device
// buffers without CUDA, RAILSHARD_NCCL parsing. The device algorithms themselves are tested
// in device_staging_test (on the CPU, through HostDeviceOps) and on a GPU by
// scripts/gpu_check.sh.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "base/memory_store.h"
#include "core/communicator.h"
#include "kernels/cuda/device_runtime.h"
#include "tests/test_util.h"

namespace railshard {
namespace {

Config testConfig() {
  Config config;
  config.timeout = std::chrono::seconds(30);
  config.connect_timeout = std::chrono::seconds(30);
  return config;
}

std::vector<std::exception_ptr> withRanks(int size,
                                          const std::function<void(Communicator&)>& body) {
  MemoryStore store;
  return test::runRanks(size, [&](int rank) {
    Communicator::Options options;
    options.rank = rank;
    options.size = size;
    options.config = testConfig();
    auto comm = Communicator::create(store, options);
    body(*comm);
  });
}

// Host buffers with an explicit kHost or the default kAuto give the host result either way.
TEST(CommunicatorDevice, HostAndAutoPlacementsReduceHostBuffers) {
  for (MemoryKind kind : {MemoryKind::kAuto, MemoryKind::kHost}) {
    const auto errors = withRanks(3, [kind](Communicator& comm) {
      std::vector<int64_t> data(1001);
      for (size_t i = 0; i < data.size(); ++i) data[i] = (comm.rank() + 1) * int64_t(i);
      Communicator::Placement placement;
      placement.memory = kind;
      comm.allreduce(data.data(), data.data(), data.size(), DataType::kInt64, ReduceOp::kSum,
                     placement);
      for (size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], 6 * int64_t(i)) << i;
      std::vector<int64_t> gathered(3 * 4);
      std::vector<int64_t> mine(4, comm.rank());
      comm.allgather(mine.data(), gathered.data(), 4, DataType::kInt64, placement);
      for (size_t i = 0; i < gathered.size(); ++i) ASSERT_EQ(gathered[i], int64_t(i / 4));
      std::vector<float> value(5, comm.rank() == 2 ? 7.0f : 0.0f);
      comm.broadcast(value.data(), value.data(), 5, DataType::kFloat32, 2, placement);
      for (float v : value) ASSERT_EQ(v, 7.0f);
      std::vector<int32_t> scatter_in(3 * 2, 1);
      std::vector<int32_t> scatter_out(2, 0);
      comm.reduceScatter(scatter_in.data(), scatter_out.data(), 2, DataType::kInt32, ReduceOp::kSum,
                         placement);
      ASSERT_EQ(scatter_out, std::vector<int32_t>(2, 3));
      // The host path ran: no device algorithm name.
      ASSERT_EQ(comm.lastAlgorithm().find("device"), std::string_view::npos);
    });
    test::rethrowFirst(errors);
  }
}

// Asking for device buffers where CUDA cannot run is a ConfigError that says why, raised
// before any communication (so every rank gets it at once, none waits for the others).
TEST(CommunicatorDevice, DeviceBuffersWithoutCudaNameTheReason) {
  if (kernels::cuda::available()) GTEST_SKIP() << "a CUDA device is present";
  const std::string reason = kernels::cuda::unavailableReason();
  ASSERT_FALSE(reason.empty());
  const auto errors = withRanks(2, [&](Communicator& comm) {
    std::vector<float> data(16, 1.0f);
    Communicator::Placement device;
    device.memory = MemoryKind::kDevice;
    auto expectConfigError = [&](const char* collective, auto&& call) {
      try {
        call();
        ADD_FAILURE() << collective << ": no error";
      } catch (const ConfigError& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find(collective), std::string::npos) << message;
        EXPECT_NE(message.find("device buffers were given"), std::string::npos) << message;
        EXPECT_NE(message.find(reason), std::string::npos) << message;
      }
    };
    expectConfigError("allreduce", [&] {
      comm.allreduce(data.data(), data.data(), 16, DataType::kFloat32, ReduceOp::kSum, device);
    });
    expectConfigError("broadcast", [&] {
      comm.broadcast(data.data(), data.data(), 16, DataType::kFloat32, 0, device);
    });
    expectConfigError("allgather", [&] {
      std::vector<float> out(32);
      comm.allgather(data.data(), out.data(), 16, DataType::kFloat32, device);
    });
    expectConfigError("reduce_scatter", [&] {
      comm.reduceScatter(data.data(), data.data(), 8, DataType::kFloat32, ReduceOp::kSum, device);
    });
    // The refused calls left the communicator usable and in step: a host call still works.
    comm.allreduce(data.data(), 16, DataType::kFloat32, ReduceOp::kSum);
    for (float v : data) ASSERT_EQ(v, 2.0f);
  });
  test::rethrowFirst(errors);
}

TEST(CommunicatorDevice, UnknownMemoryKindIsInvalidArgument) {
  const auto errors = withRanks(1, [](Communicator& comm) {
    float x = 1;
    Communicator::Placement bad;
    bad.memory = static_cast<MemoryKind>(9);
    try {
      comm.allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, bad);
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("unknown memory kind 9"), std::string::npos) << e.what();
    }
  });
  test::rethrowFirst(errors);
}

TEST(CommunicatorDevice, NcclSettingIsParsed) {
  std::map<std::string, std::string> env{{"RAILSHARD_NCCL", "off"}};
  EXPECT_EQ(Config::fromEnvironment(&env).nccl, NcclMode::kOff);
  env["RAILSHARD_NCCL"] = "on";
  EXPECT_EQ(Config::fromEnvironment(&env).nccl, NcclMode::kOn);
  env["RAILSHARD_NCCL"] = "auto";
  EXPECT_EQ(Config::fromEnvironment(&env).nccl, NcclMode::kAuto);
  env["RAILSHARD_NCCL"] = "maybe";
  try {
    Config::fromEnvironment(&env);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("RAILSHARD_NCCL: unknown value 'maybe'"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace railshard
