// The NCCL network plugin with an RDMA rail: the HCA ports of the libibverbs emulation
// (tests/fakes/fake_ibverbs.cc, one device "fake0", both ends in this process) beside this
// host's loopback as the TCP rail. The fused device stripes NCCL's messages over both; an RDMA
// rail offered alone carries the data itself, its records over the TCP rail. Bytes are
// checked against the pattern each sender wrote, and each rail's share against what it
// reports it carried (the TCP rail, in the comm's closing log line) and what the emulated HCA
// wrote. Over a real kernel verbs stack (Soft-RoCE): benchmarks/testbed/rdma/suite.sh.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "tests/nccl_plugin_harness.h"

namespace railshard {
namespace {

#ifdef FAKE_IBVERBS_PATH

using test::LoadedPlugin;
using test::pattern;
namespace nccl = plugins::nccl;

using BytesWritten = uint64_t (*)(const char*);

// One process loads the plugin once (its devices are found at init): every case shares it.
class NcclPluginRdma : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ::setenv("RAILSHARD_IBVERBS_LIBRARY", FAKE_IBVERBS_PATH, 1);
    ::setenv("FAKE_IBVERBS_DEVICES", "1", 1);
    ::setenv("RAILSHARD_NCCL_RAILS", "=lo", 1);
    ::setenv("RAILSHARD_NCCL_DEVICES", "all", 1);
    plugin_ = new LoadedPlugin(test::loadPlugin());
  }
  void SetUp() override {
    ASSERT_NE(plugin_->net, nullptr);
    void* fake = ::dlopen(FAKE_IBVERBS_PATH, RTLD_NOW | RTLD_NOLOAD);
    ASSERT_NE(fake, nullptr) << "the plugin did not load the emulation: " << test::allLogged();
    bytes_written_ = reinterpret_cast<BytesWritten>(::dlsym(fake, "fake_ibverbs_bytes_written"));
    ASSERT_NE(bytes_written_, nullptr);
  }
  // The device called `name`; -1 when the plugin offers none.
  int device(const std::string& name) {
    int ndev = 0;
    if (plugin_->net->devices(&ndev) != nccl::Result::kSuccess) return -1;
    for (int d = 0; d < ndev; ++d) {
      nccl::PropertiesV11 props{};
      if (plugin_->net->getProperties(d, &props) == nccl::Result::kSuccess &&
          name == props.base.name) {
        return d;
      }
    }
    return -1;
  }
  // Streams `count` messages of `bytes` on device `dev`, 8 in flight, each checked exact;
  // returns what the send comm's TCP rail (lo) says it carried.
  uint64_t stream(int dev, int count, size_t bytes) {
    void* send_comm = nullptr;
    void* recv_comm = nullptr;
    EXPECT_TRUE(test::connectPair(*plugin_, dev, &send_comm, &recv_comm)) << test::allLogged();
    if (send_comm == nullptr || recv_comm == nullptr) return 0;
    constexpr int kInFlight = 8;
    for (int first = 0; first < count; first += kInFlight) {
      const int n = std::min(kInFlight, count - first);
      std::vector<std::vector<uint8_t>> sent;
      std::vector<std::vector<uint8_t>> got(static_cast<size_t>(n),
                                            std::vector<uint8_t>(bytes, 0xEE));
      std::vector<void*> sends(static_cast<size_t>(n)), recvs(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) {
        void* data = got[static_cast<size_t>(i)].data();
        size_t size = bytes;
        int tag = first + i;
        EXPECT_EQ(plugin_->net->irecv(recv_comm, 1, &data, &size, &tag, nullptr, nullptr,
                                      &recvs[static_cast<size_t>(i)]),
                  nccl::Result::kSuccess);
        sent.push_back(pattern(bytes, first + i));
        EXPECT_EQ(plugin_->net->isend(send_comm, sent.back().data(), bytes, first + i, nullptr,
                                      nullptr, &sends[static_cast<size_t>(i)]),
                  nccl::Result::kSuccess);
      }
      for (int i = 0; i < n; ++i) {
        int size = -1;
        EXPECT_EQ(test::testUntilDone(*plugin_, sends[static_cast<size_t>(i)], &size),
                  nccl::Result::kSuccess)
            << test::allLogged();
        EXPECT_EQ(test::testUntilDone(*plugin_, recvs[static_cast<size_t>(i)], &size),
                  nccl::Result::kSuccess)
            << test::allLogged();
        EXPECT_EQ(size, static_cast<int>(bytes));
        EXPECT_TRUE(got[static_cast<size_t>(i)] == sent[static_cast<size_t>(i)])
            << "message " << first + i << " differs";
      }
      if (::testing::Test::HasFailure()) break;
    }
    const size_t lines = test::logLines().size();
    EXPECT_EQ(plugin_->net->closeSend(send_comm), nccl::Result::kSuccess);
    EXPECT_EQ(plugin_->net->closeRecv(recv_comm), nccl::Result::kSuccess);
    // "NCCL send comm with 127.0.0.1: lo carried 123 bytes, ..."
    uint64_t lo = 0;
    const std::regex line(R"(NCCL send comm with .*: lo carried (\d+) bytes)");
    std::lock_guard<std::mutex> lock(test::logMutex());
    for (size_t i = lines; i < test::logLines().size(); ++i) {
      std::smatch m;
      if (std::regex_search(test::logLines()[i], m, line)) lo += std::stoull(m[1].str());
    }
    return lo;
  }

  // Streams 96 x 1 MiB on `dev`, exact; the loopback and the HCA each carried a real share,
  // and together at least all of it.
  void expectBothRailsCarry(int dev) {
    const uint64_t before = bytes_written_("fake0");
    constexpr int kCount = 96;
    constexpr size_t kBytes = 1 << 20;
    const uint64_t lo = stream(dev, kCount, kBytes);
    const uint64_t rdma = bytes_written_("fake0") - before;
    EXPECT_GT(lo, uint64_t{4} << 20) << test::allLogged();
    EXPECT_GT(rdma, uint64_t{4} << 20);
    EXPECT_GE(lo + rdma, uint64_t{kCount} * kBytes);
  }

  static LoadedPlugin* plugin_;
  BytesWritten bytes_written_ = nullptr;
};

LoadedPlugin* NcclPluginRdma::plugin_ = nullptr;

TEST_F(NcclPluginRdma, OffersTheHcaPortAloneAndInTheFusedDevice) {
  int ndev = 0;
  ASSERT_EQ(plugin_->net->devices(&ndev), nccl::Result::kSuccess);
  ASSERT_EQ(ndev, 3) << test::allLogged();
  EXPECT_EQ(device("railshard-lo"), 0);
  EXPECT_EQ(device("railshard-fake0:1"), 1);
  EXPECT_EQ(device("railshard-fused(lo+fake0:1)"), 2);
  nccl::PropertiesV11 props{};
  ASSERT_EQ(plugin_->net->getProperties(1, &props), nccl::Result::kSuccess);
  // The emulation's port: 4X EDR, 100 Gbit/s; the loopback (control only) adds nothing.
  EXPECT_EQ(props.base.speed, 100000);
  EXPECT_EQ(props.base.ptr_support, nccl::kPtrHost);
  ASSERT_EQ(plugin_->net->getProperties(2, &props), nccl::Result::kSuccess);
  EXPECT_GE(props.base.speed, 100000);
}

TEST_F(NcclPluginRdma, TheFusedDeviceStripesOverTheHcaAndTcpAndEveryByteIsExact) {
  const int dev = device("railshard-fused(lo+fake0:1)");
  ASSERT_GE(dev, 0);
  expectBothRailsCarry(dev);
}

TEST_F(NcclPluginRdma, TheHcaPortAloneCarriesTheDataAndTcpOnlyItsRecords) {
  const int dev = device("railshard-fake0:1");
  ASSERT_GE(dev, 0);
  const uint64_t before = bytes_written_("fake0");
  constexpr int kCount = 32;
  constexpr size_t kBytes = 1 << 20;
  const uint64_t lo = stream(dev, kCount, kBytes);
  EXPECT_GE(bytes_written_("fake0") - before, uint64_t{kCount} * kBytes);
  EXPECT_EQ(lo, 0u) << "the TCP rail carried data on an RDMA-only device";
}

// GPU memory (ptrSupport CUDA|DMABUF) only on a device whose every data link is an RDMA lane,
// and only where libcuda loads (never here: no NVIDIA driver; scripts/gpu_check.sh runs it on
// a GPU). A fused device's comm refuses GPU memory with a line saying why; host memory goes
// through both registration entry points.
TEST_F(NcclPluginRdma, GpuMemoryIsOfferedOnlyWhereEveryDataLinkIsALane) {
  const bool cuda = test::logged("GPU memory on the RDMA-only devices: yes");
  ASSERT_TRUE(cuda || test::logged("GPU memory on the RDMA-only devices: no")) << test::allLogged();
  nccl::PropertiesV11 props{};
  ASSERT_EQ(plugin_->net->getProperties(device("railshard-fake0:1"), &props),
            nccl::Result::kSuccess);
  EXPECT_EQ(props.base.ptr_support,
            cuda ? nccl::kPtrHost | nccl::kPtrCuda | nccl::kPtrDmaBuf : nccl::kPtrHost);
  const int fused = device("railshard-fused(lo+fake0:1)");
  ASSERT_EQ(plugin_->net->getProperties(fused, &props), nccl::Result::kSuccess);
  EXPECT_EQ(props.base.ptr_support, nccl::kPtrHost) << "a TCP rail cannot take GPU memory";

  void* send_comm = nullptr;
  void* recv_comm = nullptr;
  ASSERT_TRUE(test::connectPair(*plugin_, fused, &send_comm, &recv_comm)) << test::allLogged();
  char region[64];
  void* mhandle = nullptr;
  EXPECT_EQ(plugin_->net->regMr(send_comm, region, sizeof(region), nccl::kPtrCuda, &mhandle),
            nccl::Result::kInternalError);
  EXPECT_EQ(mhandle, nullptr);
  EXPECT_TRUE(test::logged("regMr: GPU memory (NCCL_PTR_CUDA) on a device with TCP rails"))
      << test::allLogged();
  ASSERT_EQ(
      plugin_->net->regMrDmaBuf(send_comm, region, sizeof(region), nccl::kPtrHost, 0, -1, &mhandle),
      nccl::Result::kSuccess);
  EXPECT_NE(mhandle, nullptr);
  EXPECT_EQ(plugin_->net->deregMr(send_comm, mhandle), nccl::Result::kSuccess);
  EXPECT_EQ(plugin_->net->closeSend(send_comm), nccl::Result::kSuccess);
  EXPECT_EQ(plugin_->net->closeRecv(recv_comm), nccl::Result::kSuccess);
}

// NCCL merging devices (makeVDevice, NCCL_NET_MERGE_LEVEL): the loopback and the HCA port as
// one virtual device, which stripes by measured rate as the fused device does. Last: it adds
// a device to the process's plugin.
TEST_F(NcclPluginRdma, AVirtualDeviceOverTheHcaAndTheLoopbackStripesOverBoth) {
  nccl::VirtualDeviceProps members{};
  members.ndevs = 2;
  members.devs[0] = device("railshard-lo");
  members.devs[1] = device("railshard-fake0:1");
  int dev = -1;
  ASSERT_EQ(plugin_->net->makeVDevice(&dev, &members), nccl::Result::kSuccess) << test::allLogged();
  EXPECT_EQ(dev, device("railshard-vdev(lo+fake0:1)"));
  nccl::PropertiesV11 props{};
  ASSERT_EQ(plugin_->net->getProperties(dev, &props), nccl::Result::kSuccess);
  EXPECT_EQ(props.base.vprops.ndevs, 2);
  EXPECT_EQ(props.base.vprops.devs[0], members.devs[0]);
  EXPECT_EQ(props.base.vprops.devs[1], members.devs[1]);
  EXPECT_EQ(props.base.ptr_support, nccl::kPtrHost);
  // A device that is not the plugin's is refused, saying which.
  nccl::VirtualDeviceProps bad{};
  bad.ndevs = 1;
  bad.devs[0] = 42;
  int none = -1;
  EXPECT_EQ(plugin_->net->makeVDevice(&none, &bad), nccl::Result::kInternalError);
  EXPECT_TRUE(test::logged("a virtual device over device 42")) << test::allLogged();

  expectBothRailsCarry(dev);
}

#else

TEST(NcclPluginRdma, NeedsTheRdmaTransport) {
  GTEST_SKIP() << "built without infiniband/verbs.h: no RDMA rails and no emulation";
}

#endif

}  // namespace
}  // namespace railshard
