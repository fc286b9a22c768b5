// allreduce_perf with device buffers (--device cuda, -d cuda) and --backend nccl, from the real
// binary. Without a GPU (the CI machines) both must fail at once with the reason on stderr;
// -d keeps meaning the datatype for every other value. The GPU runs skip without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/cuda/device_runtime.h"
#include "tests/test_util.h"

namespace railshard {
namespace {

#ifdef RAILSHARD_ALLREDUCE_PERF_BIN
const std::string kPerf = RAILSHARD_ALLREDUCE_PERF_BIN;
#else
const std::string kPerf;
#endif
const std::string kLaunch = RAILSHARD_LAUNCH_BIN;

#define SKIP_WITHOUT_PERF() \
  if (kPerf.empty()) GTEST_SKIP() << "allreduce_perf is not built (benchmarks off)"
#define SKIP_WITH_GPU()           \
  if (kernels::cuda::available()) \
  GTEST_SKIP() << "a CUDA device is present; the no-device errors cannot be provoked here"
#define SKIP_WITHOUT_GPU()         \
  if (!kernels::cuda::available()) \
  GTEST_SKIP() << "no CUDA device: " << kernels::cuda::unavailableReason()

// One process, one rank, one tiny size: enough to reach the option checks or run a row.
test::ProcessResult perf(const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {kPerf, "-b", "8", "-e", "8", "-n", "1", "-w", "0"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return test::runProcess(argv, {{"RAILSHARD_TIMEOUT", "30"}}, std::chrono::seconds(60));
}

bool ncclBuilt() {
  const auto r = test::runProcess({kPerf, "--help"}, {}, std::chrono::seconds(30));
  const auto line = r.out.find("Backends built in:");
  return line != std::string::npos && r.out.find(" nccl", line) < r.out.find('\n', line);
}

TEST(AllreducePerfDevice, DeviceCudaWithoutGpuFailsWithTheReason) {
  SKIP_WITHOUT_PERF();
  SKIP_WITH_GPU();
  for (const std::vector<std::string>& option :
       {std::vector<std::string>{"--device", "cuda"}, std::vector<std::string>{"--device=cuda"},
        std::vector<std::string>{"-d", "cuda"}}) {
    const auto r = perf(option);
    ASSERT_FALSE(r.timed_out);
    EXPECT_NE(r.exit_code, 0) << option[0] << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find("--device cuda needs a CUDA device"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(kernels::cuda::unavailableReason()), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("# nThread"), std::string::npos) << "no table before the error";
  }
}

TEST(AllreducePerfDevice, DashDStillNamesTheDatatype) {
  SKIP_WITHOUT_PERF();
  for (const std::string dtype : {"float", "double", "int32"}) {
    const auto r = perf({"-d", dtype});
    ASSERT_FALSE(r.timed_out);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    const auto rows = test::perfTableRows(r.out);
    ASSERT_EQ(rows.size(), 1u) << r.out;
    ASSERT_GE(rows[0].size(), 3u);
    EXPECT_EQ(rows[0][2], dtype) << r.out;
    EXPECT_NE(r.out.find("# memory: host"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("device cpu"), std::string::npos) << r.out;
  }
  const auto bad = perf({"-d", "tpu"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("-d: unknown datatype 'tpu'"), std::string::npos) << bad.err;
}

TEST(AllreducePerfDevice, DeviceHostIsTheDefaultAndBadValuesAreRejected) {
  SKIP_WITHOUT_PERF();
  const auto host = perf({"--device", "host"});
  EXPECT_EQ(host.exit_code, 0) << host.out << host.err;
  EXPECT_NE(host.out.find("# memory: host"), std::string::npos) << host.out;
  const auto bad = perf({"--device", "gpu"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--device: expected host or cuda, got 'gpu'"), std::string::npos)
      << bad.err;
  const auto help = test::runProcess({kPerf, "--help"}, {}, std::chrono::seconds(30));
  EXPECT_NE(help.out.find("--device host|cuda"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("-d cuda"), std::string::npos) << help.out;
}

TEST(AllreducePerfDevice, JsonSaysTheMemoryKind) {
  SKIP_WITHOUT_PERF();
  const std::string path = test::tempPath("allreduce_perf_device.json");
  const auto r = perf({"-J", path});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::ifstream in(path);
  const auto doc = nlohmann::json::parse(in);
  EXPECT_EQ(doc["config"]["memory"], "host") << doc.dump(2);
}

TEST(AllreducePerfDevice, HostOnlyBackendsRejectDeviceBuffers) {
  SKIP_WITHOUT_PERF();
  // Checked before the backend starts, so no mpirun or launcher is needed to see it.
  for (const std::string backend : {"mpi", "gloo"}) {
    const auto r = perf({"--backend", backend, "--device", "cuda"});
    ASSERT_FALSE(r.timed_out);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("--device cuda is not supported by the " + backend + " backend"),
              std::string::npos)
        << r.err;
  }
}

TEST(AllreducePerfDevice, NcclBackendWithoutGpuFailsWithTheReason) {
  SKIP_WITHOUT_PERF();
  SKIP_WITH_GPU();
  const auto r = perf({"--backend", "nccl"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  if (!ncclBuilt()) {
    EXPECT_NE(r.err.find("built without NCCL"), std::string::npos) << r.err;
    return;
  }
  // Implied device buffers: the GPU is missing before NCCL is even opened.
  EXPECT_NE(r.err.find("--backend nccl needs a CUDA device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(kernels::cuda::unavailableReason()), std::string::npos) << r.err;
}

TEST(AllreducePerfDevice, NcclBackendRefusesExplicitHostBuffers) {
  SKIP_WITHOUT_PERF();
  const auto r = perf({"--backend", "nccl", "--device", "host"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--backend nccl runs on device buffers only"), std::string::npos) << r.err;
}

// --- on a GPU machine only ---

std::vector<std::string> launched(int ranks, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {
      kLaunch, "-n", std::to_string(ranks), kPerf, "-b", "8", "-e", "1M", "-f", "32", "-n", "2",
      "-w",    "1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

void expectCleanDeviceRun(const test::ProcessResult& r) {
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("# memory: cuda"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("device cuda:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Out of bounds values : 0 OK"), std::string::npos) << r.out;
}

TEST(AllreducePerfDevice, RailshardOnDeviceBuffersEveryOp) {
  SKIP_WITHOUT_PERF();
  SKIP_WITHOUT_GPU();
  for (const std::string op : {"sum", "avg", "max"}) {
    expectCleanDeviceRun(test::runProcess(launched(2, {"--device", "cuda", "-o", op}),
                                          {{"RAILSHARD_TIMEOUT", "60"}},
                                          std::chrono::seconds(180)));
  }
}

TEST(AllreducePerfDevice, NcclBackendOnAGpu) {
  SKIP_WITHOUT_PERF();
  SKIP_WITHOUT_GPU();
  if (!ncclBuilt()) GTEST_SKIP() << "allreduce_perf is built without NCCL";
  // NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): one rank per device.
  const int ranks = std::min(2, kernels::cuda::deviceCount());
  for (const std::string dtype : {"float", "bfloat16"}) {
    expectCleanDeviceRun(
        test::runProcess(launched(ranks, {"--backend", "nccl", "-d", dtype, "-o", "avg"}),
                         {{"RAILSHARD_TIMEOUT", "60"}}, std::chrono::seconds(180)));
  }
}

}  // namespace
}  // namespace railshard
