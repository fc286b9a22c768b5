// The NCCL network plugin (plugins/nccl) driven through its C ABI the way NCCL's proxy drives
// it (tests/nccl_plugin_harness.h), on this host's loopback: what it exports, what it says of
// its devices, messages with tags, grouped receives, short and empty messages, the most
// requests NCCL keeps in flight, and what it refuses. Bytes are checked against the pattern
// each sender wrote. Multi-host runs over shaped rails are in nccl_plugin_netns_test.cc.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "plugins/nccl/handle.h"
#include "tests/nccl_plugin_harness.h"

namespace railshard {
namespace {

using test::LoadedPlugin;
using test::pattern;
namespace nccl = plugins::nccl;

class NcclPlugin : public ::testing::Test {
 protected:
  void SetUp() override {
    // One rail: this host's loopback, named explicitly (the plugin never takes it otherwise).
    ::setenv("RAILSHARD_NCCL_RAILS", "=lo", 1);
    plugin_ = test::loadPlugin();
    ASSERT_NE(plugin_.net, nullptr);
  }
  LoadedPlugin plugin_;
};

TEST_F(NcclPlugin, ExportsEveryVersionNcclLooksForAndDescribesItsDevice) {
  for (const char* symbol :
       {"ncclNetPlugin_v8", "ncclNetPlugin_v9", "ncclNetPlugin_v10", "ncclNetPlugin_v11"}) {
    auto* name = static_cast<const char* const*>(::dlsym(plugin_.library, symbol));
    ASSERT_NE(name, nullptr) << symbol;
    EXPECT_STREQ(*name, "railshard") << symbol;
  }
  // Nothing else leaves the library (exports.map).
  EXPECT_EQ(::dlsym(plugin_.library, "_ZN9railshard5Error"), nullptr);
  int ndev = 0;
  ASSERT_EQ(plugin_.net->devices(&ndev), nccl::Result::kSuccess);
  ASSERT_EQ(ndev, 1);
  nccl::PropertiesV11 props{};
  ASSERT_EQ(plugin_.net->getProperties(0, &props), nccl::Result::kSuccess);
  EXPECT_STREQ(props.base.name, "railshard-lo");
  EXPECT_EQ(props.base.ptr_support, nccl::kPtrHost);
  EXPECT_EQ(props.base.max_recvs, 8);
  EXPECT_GT(props.base.speed, 0);
  EXPECT_EQ(props.base.net_device_type, 0);
  EXPECT_EQ(props.base.vprops.ndevs, 1);
  EXPECT_EQ(props.base.vprops.devs[0], 0);
  EXPECT_GT(props.base.max_p2p_bytes, 0u);
  EXPECT_LE(props.base.max_p2p_bytes, nccl::kMaxNetSizeBytes);
  EXPECT_EQ(props.max_multi_request_size, 1);
  EXPECT_NE(plugin_.net->getProperties(1, &props), nccl::Result::kSuccess);
  // The older structs read the same device.
  auto* v8 = static_cast<nccl::NetV8*>(::dlsym(plugin_.library, "ncclNetPlugin_v8"));
  nccl::PropertiesV8 old{};
  ASSERT_EQ(v8->getProperties(0, &old), nccl::Result::kSuccess);
  EXPECT_STREQ(old.name, "railshard-lo");
  EXPECT_EQ(old.max_recvs, 8);
  EXPECT_EQ(plugin_.net->finalize(plugin_.ctx), nccl::Result::kSuccess);
}

// NCCL's proxy: up to 32 requests in flight per comm, grouped receives whose buffers are told
// apart by tag (the sends come in another order), buffers larger than what arrives, empty
// messages, receives posted before and after their sends.
TEST_F(NcclPlugin, MessagesLandExactlyWithTagsGroupsShortAndEmptyMessages) {
  void* send_comm = nullptr;
  void* recv_comm = nullptr;
  ASSERT_TRUE(test::connectPair(plugin_, 0, &send_comm, &recv_comm)) << test::allLogged();
  void* mhandle = nullptr;
  char region[64];
  ASSERT_EQ(plugin_.net->regMr(send_comm, region, sizeof(region), nccl::kPtrHost, &mhandle),
            nccl::Result::kSuccess);
  for (int round = 0; round < 4; ++round) {
    // 8 groups of 3 messages (tags 3g, 3g+1, 3g+2) and 8 single ones: 32 requests per side.
    struct Sent {
      std::vector<uint8_t> bytes;
      int tag;
    };
    std::vector<Sent> sent;
    std::vector<void*> sends;
    const bool receives_first = round % 2 == 0;
    std::vector<std::vector<std::vector<uint8_t>>> received(16);
    std::vector<void*> recvs(16, nullptr);
    auto postReceives = [&] {
      for (int g = 0; g < 16; ++g) {
        const int n = g < 8 ? 3 : 1;
        received[static_cast<size_t>(g)].assign(static_cast<size_t>(n),
                                                std::vector<uint8_t>(70000, 0xEE));
        void* data[3];
        size_t sizes[3];
        int tags[3];
        void* handles[3] = {mhandle, mhandle, mhandle};
        for (int i = 0; i < n; ++i) {
          data[i] = received[static_cast<size_t>(g)][static_cast<size_t>(i)].data();
          sizes[i] = 70000;
          tags[i] = g < 8 ? 3 * g + i : 100 + g;
        }
        ASSERT_EQ(plugin_.net->irecv(recv_comm, n, data, sizes, tags, handles, nullptr,
                                     &recvs[static_cast<size_t>(g)]),
                  nccl::Result::kSuccess);
        ASSERT_NE(recvs[static_cast<size_t>(g)], nullptr);
      }
    };
    if (receives_first) postReceives();
    for (int g = 0; g < 16; ++g) {
      const int n = g < 8 ? 3 : 1;
      for (int k = 0; k < n; ++k) {
        // Within a group the sends go last tag first; sizes 0, short, up to the buffer.
        const int i = n - 1 - k;
        const int tag = g < 8 ? 3 * g + i : 100 + g;
        const size_t bytes = (g + i + round) % 5 == 0
                                 ? 0
                                 : 1 + (static_cast<size_t>(g * 7919 + i * 104729 + round) % 70000);
        sent.push_back(Sent{pattern(bytes, g * 10 + i + round * 1000), tag});
        void* request = nullptr;
        ASSERT_EQ(plugin_.net->isend(send_comm, sent.back().bytes.data(), bytes, tag, mhandle,
                                     nullptr, &request),
                  nccl::Result::kSuccess);
        ASSERT_NE(request, nullptr);
        sends.push_back(request);
      }
    }
    if (!receives_first) postReceives();
    for (void* request : sends) {
      int size = -1;
      ASSERT_EQ(test::testUntilDone(plugin_, request, &size), nccl::Result::kSuccess)
          << test::allLogged();
    }
    for (int g = 0; g < 16; ++g) {
      const int n = g < 8 ? 3 : 1;
      int sizes[3] = {-1, -1, -1};
      ASSERT_EQ(test::testUntilDone(plugin_, recvs[static_cast<size_t>(g)], sizes),
                nccl::Result::kSuccess)
          << test::allLogged();
      for (int i = 0; i < n; ++i) {
        const int tag = g < 8 ? 3 * g + i : 100 + g;
        const Sent* match = nullptr;
        for (const auto& s : sent) match = s.tag == tag ? &s : match;
        ASSERT_NE(match, nullptr);
        const auto& got = received[static_cast<size_t>(g)][static_cast<size_t>(i)];
        ASSERT_EQ(sizes[i], static_cast<int>(match->bytes.size()))
            << "group " << g << " tag " << tag;
        EXPECT_TRUE(std::equal(match->bytes.begin(), match->bytes.end(), got.begin()))
            << "group " << g << " tag " << tag;
        EXPECT_EQ(got[match->bytes.size()], 0xEE) << "a byte beyond the message, tag " << tag;
      }
    }
  }
  EXPECT_EQ(plugin_.net->deregMr(send_comm, mhandle), nccl::Result::kSuccess);
  EXPECT_EQ(plugin_.net->closeSend(send_comm), nccl::Result::kSuccess);
  EXPECT_EQ(plugin_.net->closeRecv(recv_comm), nccl::Result::kSuccess);
}

// Garbage and silence on the listening port, a hello with a stranger's nonce, a corrupt
// handle: each refused with a line in NCCL's log, and a real connection made beside them
// works.
TEST_F(NcclPlugin, StrangersGarbageAndCorruptHandlesAreRefusedAndDisturbNothing) {
  char handle[nccl::kHandleBytes] = {};
  void* listen_comm = nullptr;
  ASSERT_EQ(plugin_.net->listen(plugin_.ctx, 0, handle, &listen_comm), nccl::Result::kSuccess);
  nccl::ListenHandle h;
  std::memcpy(&h, handle, sizeof(h));
  auto dial = [&] {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = h.rail[0].ipv4;
    to.sin_port = htons(h.rail[0].port);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
    return fd;
  };
  const int garbage = dial();
  const std::string junk(100, 'x');
  ASSERT_EQ(::send(garbage, junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
  const int silent = dial();
  // A well-formed handle with another nonce: its hello is refused by the listener.
  char stranger[nccl::kHandleBytes];
  std::memcpy(stranger, handle, sizeof(stranger));
  reinterpret_cast<nccl::ListenHandle*>(stranger)->nonce ^= 0x5a5a;
  void* refused = nullptr;
  // A corrupt handle: refused at once, nothing dialled.
  char corrupt[nccl::kHandleBytes];
  std::memcpy(corrupt, handle, sizeof(corrupt));
  reinterpret_cast<nccl::ListenHandle*>(corrupt)->magic = 0x12345678;
  void* none = nullptr;
  EXPECT_EQ(plugin_.net->connect(plugin_.ctx, 0, corrupt, &none, nullptr),
            nccl::Result::kInvalidUsage);
  EXPECT_EQ(none, nullptr);
  EXPECT_TRUE(test::logged("the handle cannot be used: not a railshard handle"))
      << test::allLogged();
  void* send_comm = nullptr;
  void* recv_comm = nullptr;
  nccl::Result stranger_result = nccl::Result::kSuccess;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((send_comm == nullptr || recv_comm == nullptr) &&
         std::chrono::steady_clock::now() < until) {
    if (send_comm == nullptr) {
      ASSERT_EQ(plugin_.net->connect(plugin_.ctx, 0, handle, &send_comm, nullptr),
                nccl::Result::kSuccess);
    }
    if (refused == nullptr && stranger_result == nccl::Result::kSuccess) {
      stranger_result = plugin_.net->connect(plugin_.ctx, 0, stranger, &refused, nullptr);
    }
    if (recv_comm == nullptr) {
      ASSERT_EQ(plugin_.net->accept(listen_comm, &recv_comm, nullptr), nccl::Result::kSuccess);
    }
  }
  ASSERT_NE(send_comm, nullptr) << test::allLogged();
  ASSERT_NE(recv_comm, nullptr) << test::allLogged();
  // The stranger is turned away (its connection closed after the hello), never accepted.
  while (stranger_result == nccl::Result::kSuccess && refused == nullptr &&
         std::chrono::steady_clock::now() < until) {
    void* extra = nullptr;
    ASSERT_EQ(plugin_.net->accept(listen_comm, &extra, nullptr), nccl::Result::kSuccess);
    EXPECT_EQ(extra, nullptr);
    stranger_result = plugin_.net->connect(plugin_.ctx, 0, stranger, &refused, nullptr);
  }
  EXPECT_EQ(refused, nullptr);
  EXPECT_EQ(stranger_result, nccl::Result::kSystemError);
  EXPECT_TRUE(test::logged("stale or foreign nonce")) << test::allLogged();
  EXPECT_TRUE(test::logged("bad hello magic")) << test::allLogged();
  // The real connection carries a message.
  const auto bytes = pattern(5000, 3);
  std::vector<uint8_t> got(5000, 0);
  void* s = nullptr;
  void* r = nullptr;
  void* data[1] = {got.data()};
  size_t sizes[1] = {got.size()};
  int tags[1] = {9};
  void* handles[1] = {nullptr};
  ASSERT_EQ(plugin_.net->irecv(recv_comm, 1, data, sizes, tags, handles, nullptr, &r),
            nccl::Result::kSuccess);
  ASSERT_EQ(plugin_.net->isend(send_comm, const_cast<uint8_t*>(bytes.data()), bytes.size(), 9,
                               nullptr, nullptr, &s),
            nccl::Result::kSuccess);
  int size = 0;
  ASSERT_EQ(test::testUntilDone(plugin_, s, &size), nccl::Result::kSuccess);
  ASSERT_EQ(test::testUntilDone(plugin_, r, &size), nccl::Result::kSuccess);
  EXPECT_EQ(size, 5000);
  EXPECT_EQ(got, bytes);
  ::close(garbage);
  ::close(silent);
  plugin_.net->closeSend(send_comm);
  plugin_.net->closeRecv(recv_comm);
  plugin_.net->closeListen(listen_comm);
}

}  // namespace
}  // namespace railshard
