// The RDMA transport over a real kernel verbs stack: Soft-RoCE (rdma_rxe) devices of emulated
// hosts inside the qemu guest of benchmarks/testbed/rdma/ (this machine's kernel has no
// InfiniBand support). The real libibverbs and its rxe provider, real queue pairs, real
// packets over veth rails; ranks are threads of this process, each opening its own host's rxe
// devices (Config::ib_hca), so every byte between two ranks crosses a veth as RoCE v2.
//
// RAILSHARD_TEST_RXE lists each host's devices, hosts separated by ';' and rails by ','
// ("h0r0,h0r1;h1r0,h1r1;h2r0,h2r1"); benchmarks/testbed/rdma/suite.sh sets it after
// `rxe_hosts.sh up`. Without it every test skips saying so. RAILSHARD_TEST_RXE_LINKS, the path
// of rxe_hosts.sh, also allows the tests that take a host's rail down and up again with its
// `link` command (they rewire the guest's links; never on a real host).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/memory_store.h"
#include "core/communicator.h"
#include "tests/collective_check.h"
#include "tests/test_util.h"
#include "transport/transport.h"

namespace railshard {
namespace {

// Each host's rxe devices, from RAILSHARD_TEST_RXE.
std::vector<std::vector<std::string>> rxeHosts() {
  std::vector<std::vector<std::string>> hosts;
  const char* value = std::getenv("RAILSHARD_TEST_RXE");
  if (value == nullptr) return hosts;
  std::string text = value;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(';', start), text.size());
    std::vector<std::string> devices;
    const std::string host = text.substr(start, end - start);
    size_t at = 0;
    while (at < host.size()) {
      const size_t comma = std::min(host.find(',', at), host.size());
      if (comma > at) devices.push_back(host.substr(at, comma - at));
      at = comma + 1;
    }
    if (!devices.empty()) hosts.push_back(devices);
    start = end + 1;
  }
  return hosts;
}

std::string join(const std::vector<std::string>& parts, size_t count) {
  std::string out;
  for (size_t i = 0; i < count && i < parts.size(); ++i) out += (i ? "," : "") + parts[i];
  return out;
}

class OverRxe : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* links = std::getenv("RAILSHARD_TEST_RXE_LINKS");
    if (links != nullptr) links_ = links;
    hosts_ = rxeHosts();
    if (hosts_.size() < 2) {
      GTEST_SKIP() << "needs Soft-RoCE devices of at least two emulated hosts in "
                      "RAILSHARD_TEST_RXE; this kernel has none: run "
                      "benchmarks/testbed/rdma/suite.sh (a qemu guest with rdma_rxe)";
    }
  }

  // The transport as a user runs it, with its default retry budget (1.07 s x 7): rxe under
  // qemu's CPU emulation answers in milliseconds, not microseconds, and a shorter budget
  // (268 ms x 3) ran out now and then with nothing wrong on the link (a CI run lost rank 1
  // in AutoStagesLargeMessagesOnSoftRoce that way: 4 MiB bursts, packets dropped on the
  // veth, sequence-error NAKs spending the retries).
  static Config rxeConfig() {
    Config config;
    config.transport = TransportKind::kIbverbs;
    config.timeout = std::chrono::seconds(120);
    config.connect_timeout = std::chrono::seconds(60);
    // A failed lane stays out, as the failover tests expect; the re-admission test turns it on.
    config.rdma.readmit = std::chrono::milliseconds(0);
    return config;
  }

  // For the tests that cut a link: a short retry budget so the dead rail is found in about a
  // second, not 8.6 s.
  static Config cutLinkConfig(Config config = rxeConfig()) {
    config.rdma.ack_timeout = 16;  // 4.096 us * 2^16 = 268 ms
    config.rdma.retry_cnt = 3;
    return config;
  }

  // `size` ranks, rank r on host r with that host's first `rails` rxe devices.
  std::vector<std::exception_ptr> withRanks(int size, size_t rails, const Config& config,
                                            const std::function<void(Communicator&)>& body) {
    MemoryStore store;
    return test::runRanks(size, [&](int rank) {
      Communicator::Options options;
      options.rank = rank;
      options.size = size;
      options.config = config;
      options.config.rdma.hca = join(hosts_[rank], rails);
      auto comm = Communicator::create(store, options);
      body(*comm);
    });
  }

  size_t rails() const {
    size_t least = hosts_[0].size();
    for (const auto& host : hosts_) least = std::min(least, host.size());
    return least;
  }

  // Host `host`'s rail `rail` up or down (rxe_hosts.sh link: the veth, and its routes after).
  void setLink(int host, int rail, const std::string& state) {
    const auto result =
        test::runProcess({links_, "link", std::to_string(host), std::to_string(rail), state});
    EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  }

  std::vector<std::vector<std::string>> hosts_;
  std::string links_;
};

// Every lane of `comm` is a real rxe device of this rank's host and up; each device carried
// bytes (a ring sends to one neighbour only, so not every lane does).
void expectLanesOn(Communicator& comm, const std::vector<std::string>& devices, size_t rails) {
  size_t lanes = 0;
  std::vector<uint64_t> bytes(rails, 0);
  for (const auto& rail : comm.transport().rails()) {
    bool ours = false;
    for (size_t i = 0; i < rails; ++i) {
      if (rail.name != devices[i] + ":1") continue;
      ours = true;
      bytes[i] += rail.bytes_sent;
    }
    EXPECT_TRUE(ours) << "rank " << comm.rank() << ": lane " << rail.name;
    EXPECT_TRUE(rail.up) << rail.name << ": " << rail.down_reason;
    ++lanes;
  }
  EXPECT_EQ(lanes, rails * static_cast<size_t>(comm.size() - 1));
  for (size_t i = 0; i < rails; ++i) EXPECT_GT(bytes[i], 0u) << devices[i] << " carried nothing";
  // No rank closes (its queue pairs gone: a last credit write to it fails, the lane goes
  // down) before every rank has looked.
  comm.barrier();
}

const auto kAnyAlgorithm = [](const std::string&) {};

// One `count`-float sum all-reduce of iteration `iteration`, every element checked against
// the scalar sum over the ranks.
void checkSum(Communicator& comm, size_t count, int iteration) {
  std::vector<float> data(count);
  const auto value = [&](int rank, size_t i) {
    return static_cast<float>(rank + 1 + (i % 89) + iteration);
  };
  for (size_t i = 0; i < count; ++i) data[i] = value(comm.rank(), i);
  comm.allreduce(data.data(), count, DataType::kFloat32, ReduceOp::kSum);
  for (size_t i = 0; i < count; ++i) {
    float expected = 0;
    for (int r = 0; r < comm.size(); ++r) expected += value(r, i);
    ASSERT_EQ(data[i], expected) << "iteration " << iteration << " element " << i;
  }
}

void checkEveryCollective(Communicator& comm) {
  test::checkEveryAllreduce(comm, {0, 1, 1000, 70000, 600000}, kAnyAlgorithm);
  if (::testing::Test::HasFatalFailure()) return;
  test::checkEveryReduceScatter(comm, {1, 5000, 70000});
  if (::testing::Test::HasFatalFailure()) return;
  test::checkEveryAllgather(comm, {1, 5000, 70000});
  if (::testing::Test::HasFatalFailure()) return;
  for (int root = 0; root < comm.size(); ++root) {
    std::vector<int64_t> data(300000);
    for (size_t i = 0; i < data.size(); ++i) {
      data[i] = comm.rank() == root ? static_cast<int64_t>(i * 3 + root) : -1;
    }
    comm.broadcast(data.data(), data.size(), DataType::kInt64, root);
    for (size_t i = 0; i < data.size(); ++i) {
      ASSERT_EQ(data[i], static_cast<int64_t>(i * 3 + root)) << "broadcast element " << i;
    }
  }
  comm.barrier();
}

TEST_F(OverRxe, EveryCollectiveAndDtypeIsExactBetweenTwoHostsOnOneRail) {
  test::rethrowFirst(withRanks(2, 1, rxeConfig(), [&](Communicator& comm) {
    ASSERT_EQ(comm.transport().name(), "ibverbs");
    checkEveryCollective(comm);
    if (HasFatalFailure()) return;
    expectLanesOn(comm, hosts_[comm.rank()], 1);
  }));
}

TEST_F(OverRxe, EveryCollectiveAndDtypeIsExactStripedOverTwoRails) {
  if (rails() < 2) GTEST_SKIP() << "RAILSHARD_TEST_RXE gives each host one rail";
  test::rethrowFirst(withRanks(2, 2, rxeConfig(), [&](Communicator& comm) {
    checkEveryCollective(comm);
    if (HasFatalFailure()) return;
    expectLanesOn(comm, hosts_[comm.rank()], 2);
  }));
}

TEST_F(OverRxe, ThreeHostsOnTwoRailsStayExact) {
  if (hosts_.size() < 3) GTEST_SKIP() << "RAILSHARD_TEST_RXE lists two hosts";
  const size_t lanes = std::min<size_t>(rails(), 2);
  test::rethrowFirst(withRanks(3, lanes, rxeConfig(), [&](Communicator& comm) {
    checkEveryCollective(comm);
    if (HasFatalFailure()) return;
    expectLanesOn(comm, hosts_[comm.rank()], lanes);
  }));
}

// RAILSHARD_IB_CONNECT=lazy over real queue pairs: no lane exists before the first
// collective; the first one connects them (generation 1 through the store, probed), and every
// collective after is exact with every lane up and carrying bytes.
TEST_F(OverRxe, ThreeHostsConnectLanesOnFirstUse) {
  if (hosts_.size() < 3) GTEST_SKIP() << "RAILSHARD_TEST_RXE lists two hosts";
  const size_t lanes = std::min<size_t>(rails(), 2);
  Config config = rxeConfig();
  config.rdma.connect = LaneConnect::kLazy;
  test::rethrowFirst(withRanks(3, lanes, config, [&](Communicator& comm) {
    for (const auto& rail : comm.transport().rails()) {
      EXPECT_FALSE(rail.up) << rail.name << " up before any traffic";
      EXPECT_NE(rail.down_reason.find("not connected yet"), std::string::npos) << rail.down_reason;
    }
    checkEveryCollective(comm);
    if (HasFatalFailure()) return;
    expectLanesOn(comm, hosts_[comm.rank()], lanes);
  }));
}

TEST_F(OverRxe, RdmaAndTcpStripedTogetherStayExact) {
  Config config = rxeConfig();
  config.links.stripe_tcp = true;
  test::rethrowFirst(withRanks(2, 1, config, [&](Communicator& comm) {
    test::checkEveryAllreduce(comm, {1, 70000, 600000}, kAnyAlgorithm);
    if (HasFatalFailure()) return;
    bool tcp = false, rdma = false;
    for (const auto& rail : comm.transport().rails()) {
      (rail.name == hosts_[comm.rank()][0] + ":1" ? rdma : tcp) |= rail.bytes_sent > 0;
    }
    EXPECT_TRUE(rdma) << "no bytes over the rxe lane";
    EXPECT_TRUE(tcp) << "no bytes over the TCP rail";
  }));
}

struct Moved {
  uint64_t bytes = 0;     // payload this rank's lanes moved
  uint64_t in_place = 0;  // of which by the rendezvous's reads or writes
};

Moved bytesMoved(Communicator& comm) {
  Moved total;
  for (const auto& rail : comm.transport().rails()) {
    total.bytes += rail.bytes_sent;
    total.in_place += rail.bytes_in_place;
  }
  return total;
}

// Rank 0 sends `messages` of `bytes` to rank 1, each checked; returns what this rank's lanes
// moved meanwhile (a rendezvous message counts on the rank that reads or writes it).
Moved sendAndCount(Communicator& comm, size_t bytes, int messages) {
  const Moved before = bytesMoved(comm);
  const size_t count = bytes / 4;
  for (int m = 0; m < messages; ++m) {
    std::vector<int32_t> data(count);
    if (comm.rank() == 0) {
      for (size_t i = 0; i < count; ++i) data[i] = static_cast<int32_t>(i * 7 + m);
      comm.send(data.data(), count, DataType::kInt32, 1, 5);
    } else {
      comm.recv(data.data(), count, DataType::kInt32, 0, 5);
      for (size_t i = 0; i < count; ++i) {
        if (data[i] != static_cast<int32_t>(i * 7 + m)) {
          ADD_FAILURE() << "message " << m << " element " << i;
          break;
        }
      }
    }
  }
  comm.barrier();
  const Moved after = bytesMoved(comm);
  return Moved{after.bytes - before.bytes, after.in_place - before.in_place};
}

// The read rendezvous over rxe: before the per-lane kFin, a queue pair was lost in most runs
// (docs/rdma.md "Found over rxe"); since, none in 8 runs. It is not what rxe would use (a
// rendezvous forced on there writes by default: rxe's READ is slow), so it runs only when
// asked for (RAILSHARD_TEST_RXE_RENDEZVOUS=1); the write rendezvous runs in the CI suite.
bool readRendezvousAskedFor() {
  const char* asked = std::getenv("RAILSHARD_TEST_RXE_RENDEZVOUS");
  return asked != nullptr && std::string(asked) == "1";
}
constexpr const char* kReadRendezvousSkip =
    "the read rendezvous over rxe runs only when asked for (docs/rdma.md, \"Found over rxe\"): "
    "set RAILSHARD_TEST_RXE_RENDEZVOUS=1";

// Staged (RAILSHARD_IB_RENDEZVOUS=0), or large messages moved in place by the rendezvous
// forced to read or to write.
enum class Path { kStaged, kRead, kWrite };
std::string pathName(const ::testing::TestParamInfo<Path>& info) {
  return info.param == Path::kStaged ? "Staged" : info.param == Path::kRead ? "Read" : "Write";
}

class RendezvousOverRxe : public OverRxe, public ::testing::WithParamInterface<Path> {
 protected:
  // A threshold below the collectives' messages, and the verb asked for.
  Config pathConfig() const {
    Config config = rxeConfig();
    config.rdma.rendezvous_auto = false;
    config.rdma.rendezvous_bytes = GetParam() == Path::kStaged ? 0 : 256 << 10;
    config.rdma.rendezvous_verb =
        GetParam() == Path::kRead ? RendezvousVerb::kRead : RendezvousVerb::kWrite;
    return config;
  }
  bool skipped() const { return GetParam() == Path::kRead && !readRendezvousAskedFor(); }
};

// Every all-reduce exact over two rails, and 4 MiB messages moved by the receiver's reads,
// the sender's writes in place, or the sender's staged writes, as asked.
TEST_P(RendezvousOverRxe, EveryAllreduceExactAndMessagesMovedAsAsked) {
  if (skipped()) GTEST_SKIP() << kReadRendezvousSkip;
  const size_t lanes = std::min<size_t>(rails(), 2);
  // No link is cut here: the default retry budget. With 268 ms x 3 a write queued behind the
  // peer's read responses now and then ran out of retries under emulation (the lane failed
  // over; on one rail that would be a PeerLostError).
  const Config config = pathConfig();
  std::vector<Moved> moved(2);
  test::rethrowFirst(withRanks(2, lanes, config, [&](Communicator& comm) {
    test::checkEveryAllreduce(comm, {70000, 600000}, kAnyAlgorithm);
    if (HasFatalFailure()) return;
    checkSum(comm, 3 << 20, 1);
    if (HasFatalFailure()) return;
    moved[static_cast<size_t>(comm.rank())] = sendAndCount(comm, 4 << 20, 3);
  }));
  const size_t mover = GetParam() == Path::kRead ? 1 : 0;
  EXPECT_GE(moved[mover].bytes, 12u << 20) << "rank " << mover << " did not move the payload";
  EXPECT_LT(moved[1 - mover].bytes, 64u << 10) << "rank " << 1 - mover << " moved payload";
  if (GetParam() == Path::kStaged) {
    EXPECT_EQ(moved[0].in_place + moved[1].in_place, 0u) << "a rendezvous with the threshold 0";
  } else {
    EXPECT_GE(moved[mover].in_place, 12u << 20) << "rank " << mover << " staged the payload";
    EXPECT_EQ(moved[1 - mover].in_place, 0u);
  }
}

// A veth taken down while all-reduces run: the rail's lanes fail (retry budget exceeded), their
// pieces move to the other rail, every result stays exact; the rail reads down, with a reason.
// Staged, and with the rendezvous's reads or writes in flight.
TEST_P(RendezvousOverRxe, ARailTakenDownMidAllreduceMovesToTheOther) {
  if (links_.empty()) GTEST_SKIP() << "RAILSHARD_TEST_RXE_LINKS (rxe_hosts.sh) is not set";
  if (rails() < 2) GTEST_SKIP() << "RAILSHARD_TEST_RXE gives each host one rail";
  if (skipped()) GTEST_SKIP() << kReadRendezvousSkip;
  std::atomic<int> done{0};
  // The default retry budget, as in ARailTakenDownAndUpIsReadmitted: the cut is seen through
  // its port's event and the report of the side that saw it.
  test::rethrowFirst(withRanks(2, 2, pathConfig(), [&](Communicator& comm) {
    std::thread cut;
    struct Join {
      std::thread& thread;
      ~Join() {
        if (thread.joinable()) thread.join();
      }
    } join{cut};
    if (comm.rank() == 0) {
      cut = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        setLink(1, 1, "down");
      });
    }
    for (int i = 0; i < 30 && !HasFatalFailure(); ++i) checkSum(comm, 1 << 20, i);
    if (cut.joinable()) cut.join();
    bool down = false;
    for (const auto& rail : comm.transport().rails()) {
      if (!rail.up) {
        down = true;
        EXPECT_FALSE(rail.down_reason.empty()) << rail.name;
      }
    }
    EXPECT_TRUE(down) << "rank " << comm.rank() << ": both rails still up after the cut";
    ++done;
  }));
  setLink(1, 1, "up");
  EXPECT_EQ(done.load(), 2);
}

INSTANTIATE_TEST_SUITE_P(OverRxe, RendezvousOverRxe,
                         ::testing::Values(Path::kStaged, Path::kRead, Path::kWrite), pathName);

// What `auto` does on rxe: 4 MiB messages staged (the rendezvous measured slower there with
// the default 1 MiB collective chunks, docs/rdma.md): written by the sender, none in place.
TEST_F(OverRxe, AutoStagesLargeMessagesOnSoftRoce) {
  std::vector<Moved> moved(2);
  test::rethrowFirst(withRanks(2, 1, rxeConfig(), [&](Communicator& comm) {
    moved[static_cast<size_t>(comm.rank())] = sendAndCount(comm, 4 << 20, 3);
  }));
  EXPECT_GE(moved[0].bytes, 12u << 20) << "the sender did not write the payload";
  EXPECT_EQ(moved[0].in_place + moved[1].in_place, 0u) << "auto on rxe should stage";
  EXPECT_LT(moved[1].bytes, 64u << 10);
}

// A rail's veth taken down and brought back while all-reduces run: its lanes fail over, and
// with re-admission on (RAILSHARD_IB_READMIT_MS) they are made again once the link is up (the
// port active again, the probe acknowledged) and carry bytes again; every result exact.
TEST_F(OverRxe, ARailTakenDownAndUpIsReadmitted) {
  if (links_.empty()) GTEST_SKIP() << "RAILSHARD_TEST_RXE_LINKS (rxe_hosts.sh) is not set";
  if (rails() < 2) GTEST_SKIP() << "RAILSHARD_TEST_RXE gives each host one rail";
  // The default retry budget: the rail taken down is seen at once (its port's event on one
  // side, that side's report on the other), and a short budget only lets qemu's emulation
  // under load time out the rail that stays up (CI: rank 1 lost over h0r0 with nothing wrong
  // on it, as fe43d24 saw in another test).
  Config config = rxeConfig();
  config.rdma.readmit = std::chrono::milliseconds(200);
  std::vector<int> seen_down(2), down_at_end(2);
  std::vector<uint64_t> bytes_back(2);
  test::rethrowFirst(withRanks(2, 2, config, [&](Communicator& comm) {
    const auto rank = static_cast<size_t>(comm.rank());
    const std::string second = hosts_[rank][1] + ":1";
    auto view = [&](uint64_t* bytes) {
      int down = 0;
      for (const auto& rail : comm.transport().rails()) {
        down += rail.up ? 0 : 1;
        if (bytes != nullptr && rail.name == second) *bytes = rail.bytes_sent;
      }
      return down;
    };
    std::thread flap;
    // Joined on every way out, a failed collective's exception included (a joinable thread
    // destroyed would end the whole test binary).
    struct Join {
      std::thread& thread;
      ~Join() {
        if (thread.joinable()) thread.join();
      }
    } join{flap};
    if (rank == 0) {
      flap = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        setLink(1, 1, "down");
        std::this_thread::sleep_for(std::chrono::seconds(4));
        setLink(1, 1, "up");
      });
    }
    // Until both ranks saw the rail go and come back, or 90 s passed on either (decided
    // together: an all-reduce of both conditions).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
    int iteration = 0;
    for (;; ++iteration) {
      checkSum(comm, 1 << 20, iteration);
      if (HasFatalFailure()) break;
      const int down = view(nullptr);
      if (down > 0) seen_down[rank] = 1;
      int state[2] = {seen_down[rank] == 1 && down == 0 ? 0 : 1,
                      std::chrono::steady_clock::now() >= deadline ? 1 : 0};
      comm.allreduce(state, 2, DataType::kInt32, ReduceOp::kMax);
      if (state[0] == 0 || state[1] == 1) break;
    }
    if (flap.joinable()) flap.join();
    uint64_t before = 0;
    view(&before);
    for (int i = 0; i < 10 && !HasFatalFailure(); ++i) checkSum(comm, 1 << 20, ++iteration);
    down_at_end[rank] = view(&bytes_back[rank]);
    bytes_back[rank] -= before;
  }));
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(seen_down[r], 1) << "rank " << r << " never saw the rail down";
    EXPECT_EQ(down_at_end[r], 0) << "rank " << r << ": the rail was not re-admitted";
    EXPECT_GT(bytes_back[r], 0u) << "rank " << r << ": no bytes on the re-admitted rail";
  }
}

// Every rail of one host down: no rail is left, both ranks raise PeerLostError naming the RDMA
// rail, within the retry budget and the collective deadline (rank 1 sees its port go down
// first, so rank 0's error is often rank 1's report: "lost a peer: rank 1: lost rank 0: RDMA
// rail h1r0:1 ...").
TEST_F(OverRxe, EveryRailDownIsPeerLostErrorNamingTheRailOnBothRanks) {
  if (links_.empty()) GTEST_SKIP() << "RAILSHARD_TEST_RXE_LINKS (rxe_hosts.sh) is not set";
  Config config = cutLinkConfig();
  config.timeout = std::chrono::seconds(30);
  const auto errors = withRanks(2, 1, config, [&](Communicator& comm) {
    checkSum(comm, 70000, 0);
    comm.barrier();
    if (comm.rank() == 0) setLink(1, 0, "down");
    comm.barrier();
    for (int i = 1; i < 50; ++i) checkSum(comm, 1 << 20, i);
  });
  setLink(1, 0, "up");
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " finished with its peer's rail down";
    try {
      std::rethrow_exception(errors[r]);
    } catch (const PeerLostError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("lost rank "), std::string::npos) << what;
      EXPECT_NE(what.find("RDMA rail h"), std::string::npos) << what;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": not a PeerLostError: " << e.what();
    }
  }
}

}  // namespace
}  // namespace railshard
