// The RDMA transport's device-free logic: connection records, immediates, credit windows, the
// registration cache, GID selection from a captured sysfs table, queue-pair parameters.
#include <gtest/gtest.h>

#ifdef RAILSHARD_TEST_IBVERBS

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "base/error.h"
#include "tests/test_util.h"
#include "transport/cuda_driver.h"
#include "transport/links/ibverbs/credit_window.h"
#include "transport/links/ibverbs/device_registration.h"
#include "transport/links/ibverbs/gid_table.h"
#include "transport/links/ibverbs/hca_discovery.h"
#include "transport/links/ibverbs/qp_params.h"
#include "transport/links/ibverbs/registration_cache.h"
#include "transport/links/ibverbs/wire_format.h"

namespace railshard::transport::links::ibverbs {
namespace {

LaneInfo sampleInfo() {
  LaneInfo info;
  info.rank = 3;
  info.rail = 1;
  info.port = 1;
  info.mtu = IBV_MTU_4096;
  info.link_layer = IBV_LINK_LAYER_ETHERNET;
  info.gid_index = 3;
  info.lid = 0;
  info.rd_atomic = 5;
  info.qpn = 0x1234;
  info.psn = 0xabcdef;
  for (size_t i = 0; i < 16; ++i) info.gid[i] = static_cast<uint8_t>(i * 7);
  info.ring_addr = 0x7f0000001000;
  info.ring_rkey = 0xdeadbeef;
  info.slots = 16;
  info.slot_bytes = 256 << 10;
  return info;
}

TEST(LaneInfo, RoundTripsEveryField) {
  const LaneInfo in = sampleInfo();
  const auto bytes = in.encode();
  ASSERT_EQ(bytes.size(), LaneInfo::kEncodedBytes);
  const LaneInfo out = LaneInfo::decode(bytes);
  EXPECT_EQ(out.rank, in.rank);
  EXPECT_EQ(out.rail, in.rail);
  EXPECT_EQ(out.port, in.port);
  EXPECT_EQ(out.mtu, in.mtu);
  EXPECT_EQ(out.link_layer, in.link_layer);
  EXPECT_EQ(out.gid_index, in.gid_index);
  EXPECT_EQ(out.rd_atomic, in.rd_atomic);
  EXPECT_EQ(out.qpn, in.qpn);
  EXPECT_EQ(out.psn, in.psn);
  EXPECT_EQ(out.gid, in.gid);
  EXPECT_EQ(out.ring_addr, in.ring_addr);
  EXPECT_EQ(out.ring_rkey, in.ring_rkey);
  EXPECT_EQ(out.slots, in.slots);
  EXPECT_EQ(out.slot_bytes, in.slot_bytes);
  // Little-endian on the wire whatever the host: the magic spells "RSIB".
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 4), "RSIB");
}

void expectRejected(const std::vector<uint8_t>& bytes, const std::string& field) {
  try {
    LaneInfo::decode(bytes);
    ADD_FAILURE() << "accepted a record with a bad " << field;
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find(field + " = "), std::string::npos) << e.what();
  }
}

TEST(LaneInfo, RejectsEachBadFieldByName) {
  auto bytes = sampleInfo().encode();
  auto corrupt = [&](size_t at, uint8_t value) {
    auto copy = bytes;
    copy[at] = value;
    return copy;
  };
  expectRejected(corrupt(0, 'X'), "magic");
  expectRejected(corrupt(4, 9), "version");
  expectRejected(corrupt(12, 0), "port");
  expectRejected(corrupt(13, 7), "mtu");
  expectRejected(corrupt(14, 9), "link_layer");
  auto no_qp = sampleInfo();
  no_qp.qpn = 0;
  expectRejected(no_qp.encode(), "qpn");
  auto big_qp = sampleInfo();
  big_qp.qpn = 1u << 24;
  expectRejected(big_qp.encode(), "qpn");
  auto psn = sampleInfo();
  psn.psn = 1u << 24;
  expectRejected(psn.encode(), "psn");
  auto slots = sampleInfo();
  slots.slots = 1;
  expectRejected(slots.encode(), "slots");
  auto slot_bytes = sampleInfo();
  slot_bytes.slot_bytes = 4096 + 1;
  expectRejected(slot_bytes.encode(), "slot_bytes");
  auto ring = sampleInfo();
  ring.ring_addr = 0;
  expectRejected(ring.encode(), "ring_addr");
  auto short_record = bytes;
  short_record.pop_back();
  expectRejected(short_record, "size");
}

TEST(Immediate, EncodesKindAndValue) {
  for (uint32_t value : {0u, 1u, 4095u, 0xffffffu}) {
    for (ImmKind kind : {ImmKind::kData, ImmKind::kCredit}) {
      const Immediate out = decodeImmediate(encodeImmediate(Immediate{kind, value}));
      EXPECT_EQ(out.kind, kind);
      EXPECT_EQ(out.value, value);
    }
  }
  EXPECT_THROW(decodeImmediate(0x02000001u), ProtocolError);
}

TEST(SendWindow, SlotsNeedCreditAndFreeStaging) {
  SendWindow window(4);
  std::vector<uint32_t> got;
  while (auto slot = window.acquire()) got.push_back(*slot);
  EXPECT_EQ(got, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(window.credits(), 0u);
  window.grant(2);  // the receiver consumed slots 0 and 1 ...
  // ... but their staging copies are still in flight: no slot yet.
  EXPECT_FALSE(window.acquire().has_value());
  window.completed(0);
  EXPECT_EQ(window.acquire(), std::optional<uint32_t>(0));
  EXPECT_FALSE(window.acquire().has_value());  // slot 1 still in flight
  window.completed(1);
  EXPECT_EQ(window.acquire(), std::optional<uint32_t>(1));
  EXPECT_EQ(window.credits(), 0u);
  EXPECT_THROW(window.completed(1 + 4), ProtocolError);
  EXPECT_THROW(window.grant(5), ProtocolError);  // more than it holds
}

TEST(ReceiveWindow, ChecksOrderAndReturnsCreditsInRingOrder) {
  ReceiveWindow window(4);
  window.arrived(0);
  window.arrived(1);
  window.arrived(2);
  EXPECT_THROW(window.arrived(0), ProtocolError);  // expected slot 3
  window.release(1);                               // out of order: held back behind slot 0
  EXPECT_EQ(window.takeCredits(1), 0u);
  window.release(0);
  EXPECT_EQ(window.takeCredits(3), 0u);  // 2 pending, batch 3
  EXPECT_EQ(window.takeCredits(2), 2u);
  EXPECT_EQ(window.takeCredits(1), 0u);
  window.arrived(3);
  window.arrived(0);  // wrapped: slots 0 and 1 were returned
  window.arrived(1);
  EXPECT_THROW(window.arrived(2), ProtocolError);  // slot 2 still holds its piece
}

TEST(ReceiveWindow, OverrunIsAProtocolError) {
  ReceiveWindow window(2);
  window.arrived(0);
  window.arrived(1);
  try {
    window.arrived(0);
    ADD_FAILURE() << "a write into an occupied slot was accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("overran its credits"), std::string::npos) << e.what();
  }
  EXPECT_THROW(window.release(1 + 2), ProtocolError);
}

// A registrar that records what the HCA would be asked to do.
struct FakeRegistrar {
  std::vector<std::pair<uintptr_t, size_t>> registered;
  std::vector<std::pair<uintptr_t, size_t>> deregistered;
  uint32_t next_key = 1;
  RegistrationCache make(size_t max_bytes) {
    return RegistrationCache(
        [this](uintptr_t start, size_t length) {
          registered.emplace_back(start, length);
          Registration r;
          r.start = start;
          r.length = length;
          r.lkey = next_key++;
          r.rkey = next_key++;
          return r;
        },
        [this](const Registration& r) { deregistered.emplace_back(r.start, r.length); }, max_bytes,
        4096);
  }
};

TEST(RegistrationCache, HitsInsideARangeAndWidensToPages) {
  FakeRegistrar hca;
  auto cache = hca.make(1 << 30);
  alignas(4096) static uint8_t memory[8 * 4096];
  auto a = cache.acquire(memory + 100, 5000);
  ASSERT_EQ(hca.registered.size(), 1u);
  EXPECT_EQ(hca.registered[0].first, reinterpret_cast<uintptr_t>(memory));
  EXPECT_EQ(hca.registered[0].second, 2u * 4096);  // [100, 5100) widened to two pages
  auto b = cache.acquire(memory + 4096, 100);      // inside: a hit, same keys
  EXPECT_EQ(b->lkey, a->lkey);
  EXPECT_EQ(hca.registered.size(), 1u);
  EXPECT_EQ(cache.stats().hits, 1u);
  EXPECT_EQ(cache.stats().misses, 1u);
  EXPECT_THROW(cache.acquire(nullptr, 10), InvalidArgument);
}

TEST(RegistrationCache, OverlapsMergeIdleEntriesButNeverLeasedOnes) {
  FakeRegistrar hca;
  auto cache = hca.make(1 << 30);
  alignas(4096) static uint8_t memory[16 * 4096];
  { auto first = cache.acquire(memory, 4096); }         // idle afterwards
  auto grown = cache.acquire(memory + 2048, 3 * 4096);  // overlaps the idle one
  EXPECT_EQ(cache.stats().merges, 1u);
  ASSERT_EQ(hca.deregistered.size(), 1u);
  EXPECT_EQ(grown->start, reinterpret_cast<uintptr_t>(memory));
  EXPECT_GE(grown->start + grown->length, reinterpret_cast<uintptr_t>(memory) + 2048 + 3 * 4096);
  // `grown` is leased: a request overlapping it but reaching further registers beside it.
  auto further = cache.acquire(memory + 3 * 4096, 4 * 4096);
  EXPECT_EQ(hca.deregistered.size(), 1u);  // the leased entry stayed registered
  EXPECT_EQ(cache.stats().entries, 2u);
}

TEST(RegistrationCache, EvictsLeastRecentlyUsedIdleEntries) {
  FakeRegistrar hca;
  auto cache = hca.make(3 * 4096);  // room for three pages
  alignas(4096) static uint8_t memory[16 * 4096];
  for (int i = 0; i < 3; ++i) cache.acquire(memory + i * 2 * 4096, 4096);
  cache.acquire(memory, 4096);  // touch the first: now the second is the oldest
  cache.acquire(memory + 6 * 4096, 4096);
  EXPECT_EQ(cache.stats().evictions, 1u);
  ASSERT_EQ(hca.deregistered.size(), 1u);
  EXPECT_EQ(hca.deregistered[0].first, reinterpret_cast<uintptr_t>(memory + 2 * 4096));
  EXPECT_LE(cache.stats().bytes, 3u * 4096);
  // A leased entry is never evicted, even over the limit.
  auto held = cache.acquire(memory + 10 * 4096, 4 * 4096);
  EXPECT_EQ(held->length, 4u * 4096);
  EXPECT_GT(cache.stats().bytes, 3u * 4096);
}

TEST(RegistrationCache, InvalidateDeregistersIdleNowAndLeasedWhenReleased) {
  FakeRegistrar hca;
  auto cache = hca.make(1 << 30);
  alignas(4096) static uint8_t memory[16 * 4096];
  cache.acquire(memory, 4096);
  auto leased = cache.acquire(memory + 4 * 4096, 4096);
  EXPECT_EQ(cache.invalidate(memory, 8 * 4096), 2u);
  EXPECT_EQ(hca.deregistered.size(), 1u);  // the idle one
  EXPECT_EQ(leased->lkey, 3u);             // still valid for the write in flight
  leased.reset();
  // The next call reaps it; a fresh acquire of the range registers anew.
  auto again = cache.acquire(memory + 4 * 4096, 4096);
  EXPECT_EQ(hca.deregistered.size(), 2u);
  EXPECT_EQ(hca.registered.size(), 3u);
  EXPECT_NE(again->lkey, 3u);
}

// A ConnectX-style RoCE port's GID table as sysfs shows it, written to a temporary tree.
std::string writeGidTree() {
  namespace fs = std::filesystem;
  const fs::path root = test::tempPath("gid_sysfs");
  fs::remove_all(root);
  const fs::path port = root / "class/infiniband/mlx5_0/ports/1";
  fs::create_directories(port / "gids");
  fs::create_directories(port / "gid_attrs/types");
  fs::create_directories(port / "gid_attrs/ndevs");
  std::ofstream(port / "link_layer") << "Ethernet\n";
  struct Row {
    int index;
    const char* gid;
    const char* type;
    const char* ndev;
  };
  const Row rows[] = {
      {0, "fe80:0000:0000:0000:0e42:a1ff:fe2b:3c4d", "IB/RoCE v1", "eth2"},
      {1, "fe80:0000:0000:0000:0e42:a1ff:fe2b:3c4d", "RoCE v2", "eth2"},
      {2, "0000:0000:0000:0000:0000:ffff:c0a8:0105", "IB/RoCE v1", "eth2"},
      {3, "0000:0000:0000:0000:0000:ffff:c0a8:0105", "RoCE v2", "eth2"},
      {4, "2001:0db8:0000:0000:0000:0000:0000:0005", "RoCE v2", "eth2"},
      {5, "0000:0000:0000:0000:0000:ffff:0a00:0007", "RoCE v2", "eth3.100"},
      {6, "0000:0000:0000:0000:0000:0000:0000:0000", "", ""},
  };
  for (const auto& row : rows) {
    std::ofstream(port / "gids" / std::to_string(row.index)) << row.gid << "\n";
    if (*row.type) std::ofstream(port / "gid_attrs/types" / std::to_string(row.index)) << row.type;
    if (*row.ndev) std::ofstream(port / "gid_attrs/ndevs" / std::to_string(row.index)) << row.ndev;
  }
  return root.string();
}

TEST(GidTable, ReadsSysfsAndPicksRoceV2ByFamily) {
  const std::string root = writeGidTree();
  const auto table = readGidTable(root, "mlx5_0", 1);
  ASSERT_EQ(table.size(), 6u);  // the zero entry is left out
  EXPECT_EQ(table[1].type, GidType::kRoceV2);
  EXPECT_EQ(table[2].type, GidType::kRoceV1);
  EXPECT_TRUE(table[3].isIpv4Mapped());
  EXPECT_TRUE(table[0].isLinkLocal());
  EXPECT_EQ(table[5].netdev, "eth3.100");

  const GidChoice v4 = selectGid(table, false, AddressFamily::kIpv4);
  EXPECT_EQ(v4.index, 3) << v4.reason;  // v2 beats the v1 entry 2 of the same address
  EXPECT_NE(v4.reason.find("RoCE v2 IPv4"), std::string::npos) << v4.reason;
  const GidChoice v6 = selectGid(table, false, AddressFamily::kIpv6);
  EXPECT_EQ(v6.index, 4) << v6.reason;  // global, not the link-local 0/1
  const GidChoice vlan = selectGid(table, false, AddressFamily::kIpv4, "eth3.100");
  EXPECT_EQ(vlan.index, 5) << vlan.reason;
  EXPECT_EQ(selectGid(table, true, AddressFamily::kIpv4).index, 0);  // InfiniBand: port GID

  std::vector<GidEntry> only_link_local(table.begin(), table.begin() + 2);
  const GidChoice none = selectGid(only_link_local, false, AddressFamily::kIpv4);
  EXPECT_EQ(none.index, -1);
  EXPECT_NE(none.reason.find("RAILSHARD_IB_GID_INDEX"), std::string::npos) << none.reason;
  EXPECT_TRUE(readGidTable(root, "mlx5_9", 1).empty());
}

TEST(QpParams, TransitionsCarryTheRequiredAttributes) {
  LaneInfo local = sampleInfo();
  LaneInfo remote = sampleInfo();
  remote.qpn = 0x777;
  remote.psn = 0x42;
  remote.mtu = IBV_MTU_1024;
  QpTiming timing;
  timing.timeout = 14;
  timing.retry_cnt = 5;

  const QpTransition init = initTransition(1);
  EXPECT_EQ(init.attr.qp_state, IBV_QPS_INIT);
  EXPECT_EQ(init.mask, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  EXPECT_TRUE(init.attr.qp_access_flags & IBV_ACCESS_REMOTE_WRITE);
  EXPECT_TRUE(init.attr.qp_access_flags & IBV_ACCESS_REMOTE_READ);  // the rendezvous
  EXPECT_FALSE(init.attr.qp_access_flags & IBV_ACCESS_REMOTE_ATOMIC);

  // RoCE: global route to the peer's GID from our GID index; MTU the smaller of the two.
  const QpTransition rtr = rtrTransition(local, remote, timing);
  EXPECT_EQ(rtr.attr.qp_state, IBV_QPS_RTR);
  EXPECT_EQ(rtr.attr.dest_qp_num, 0x777u);
  EXPECT_EQ(rtr.attr.rq_psn, 0x42u);
  EXPECT_EQ(rtr.attr.path_mtu, IBV_MTU_1024);
  EXPECT_EQ(rtr.attr.ah_attr.is_global, 1);
  EXPECT_EQ(rtr.attr.ah_attr.grh.sgid_index, local.gid_index);
  EXPECT_EQ(0, std::memcmp(rtr.attr.ah_attr.grh.dgid.raw, remote.gid.data(), 16));
  EXPECT_EQ(rtr.mask, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);

  // InfiniBand: by LID, no GRH.
  local.link_layer = remote.link_layer = IBV_LINK_LAYER_INFINIBAND;
  remote.lid = 17;
  const QpTransition ib = rtrTransition(local, remote, timing);
  EXPECT_EQ(ib.attr.ah_attr.is_global, 0);
  EXPECT_EQ(ib.attr.ah_attr.dlid, 17);

  // Reads: we serve as many as we said; we issue as many as both ends allow.
  local.rd_atomic = 8;
  remote.rd_atomic = 4;
  EXPECT_EQ(rtrTransition(local, remote, timing).attr.max_dest_rd_atomic, 8);
  EXPECT_EQ(rtsTransition(local, remote, timing).attr.max_rd_atomic, 4);
  EXPECT_EQ(readDepth(local, remote), 4);
  remote.rd_atomic = 0;  // a peer that never reads: none issued, the QP still valid
  EXPECT_EQ(readDepth(local, remote), 0);
  EXPECT_EQ(rtsTransition(local, remote, timing).attr.max_rd_atomic, 1);

  const QpTransition rts = rtsTransition(local, remote, timing);
  EXPECT_EQ(rts.attr.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(rts.attr.sq_psn, local.psn);
  EXPECT_EQ(rts.attr.timeout, 14);
  EXPECT_EQ(rts.attr.retry_cnt, 5);
  EXPECT_EQ(rts.mask, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  // 4.096 us * 2^18 * (1 + 7) = 8.59 s: the documented default.
  EXPECT_NEAR(retryExhaustedSeconds(QpTiming{}), 8.59, 0.01);
}

TEST(HcaDiscovery, PortRatesAndFilters) {
  EXPECT_DOUBLE_EQ(portGbps(2, 32), 100.0);   // 4X EDR
  EXPECT_DOUBLE_EQ(portGbps(2, 64), 200.0);   // 4X HDR
  EXPECT_DOUBLE_EQ(portGbps(2, 128), 400.0);  // 4X NDR
  EXPECT_DOUBLE_EQ(portGbps(1, 32), 25.0);
  EXPECT_DOUBLE_EQ(portGbps(3, 32), 0.0);  // unknown width code
  EXPECT_TRUE(hcaSelected("", "mlx5_0", 1));
  EXPECT_TRUE(hcaSelected("mlx5_0,mlx5_1:2", "mlx5_1", 2));
  EXPECT_FALSE(hcaSelected("mlx5_0,mlx5_1:2", "mlx5_1", 1));
  EXPECT_FALSE(hcaSelected("mlx5_0", "mlx5_10", 1));
}

TEST(DeviceRegistration, TriesEachWayInOrderAndNamesEveryReasonWhenAllFail) {
  ibv_mr fake_mr{};
  std::vector<std::string> tried;
  std::string method;
  auto failing = [&](const std::string& name, const std::string& reason) {
    return std::make_pair(name, RegistrationStep([&tried, name, reason](std::string& why) {
                            tried.push_back(name);
                            why = reason;
                            return static_cast<ibv_mr*>(nullptr);
                          }));
  };
  auto working = std::make_pair(std::string("peer memory"), RegistrationStep([&](std::string&) {
                                  tried.push_back("peer memory");
                                  return &fake_mr;
                                }));
  EXPECT_EQ(registerFirstThatWorks({failing("dmabuf", "no dmabuf support"), working}, method),
            &fake_mr);
  EXPECT_EQ(method, "peer memory");
  EXPECT_EQ(tried, (std::vector<std::string>{"dmabuf", "peer memory"}));
  try {
    registerFirstThatWorks({failing("dmabuf", "EOPNOTSUPP"), failing("peer memory", "EFAULT")},
                           method);
    ADD_FAILURE() << "registration without any working way succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dmabuf: EOPNOTSUPP; peer memory: EFAULT"),
              std::string::npos)
        << e.what();
  }
}

TEST(CudaDriver, AbsentDriverIsReportedNotFatal) {
  if (CudaDriver::get() != nullptr) GTEST_SKIP() << "an NVIDIA driver is installed here";
  // No GPU here: every buffer is host memory, and the reason names the library.
  EXPECT_NE(CudaDriver::unavailableReason().find("libcuda"), std::string::npos)
      << CudaDriver::unavailableReason();
}

}  // namespace
}  // namespace railshard::transport::links::ibverbs

#else
TEST(Ibverbs, NotBuilt) {
  GTEST_SKIP() << "built without infiniband/verbs.h";
}
#endif
