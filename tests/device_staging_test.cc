// Collectives on device buffers staged through pinned host memory (core/collectives/
// device_staging.h), run among ranks that are threads over real loopback TCP, with the two CPU
// devices: HostDeviceOps (work runs at once) and DeferredDeviceOps (work runs only when waited
// for, so a missing or misplaced wait in the pipeline gives wrong results). Results are
// compared with tests/reference.h, which is independent of kernels/.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "base/memory_store.h"
#include "core/collective_tag.h"
#include "core/collectives/cuda_device_ops.h"
#include "core/collectives/device_staging.h"
#include "core/collectives/device_staging_plan.h"
#include "core/collectives/host_device_ops.h"
#include "tests/reference.h"
#include "tests/tcp_mesh_util.h"
#include "tests/test_util.h"

namespace railshard {
namespace {

using collectives::ChunkStream;
using collectives::Context;
using collectives::DeferredDeviceOps;
using collectives::DeviceOps;
using collectives::HostDeviceOps;
using collectives::RingStaging;
using collectives::SegmentLayout;
using collectives::Workspace;
using test::expectedValue;
using test::inputValue;
using test::loadValue;
using test::storeValue;

// Small chunks: a few hundred elements make many chunks per segment and several slices
// (sliceSegmentElements is 16 chunks per segment).
constexpr size_t kChunkBytes = 64;
constexpr size_t kGuardBytes = 16;  // after every result buffer, must stay untouched
constexpr uint8_t kUnset = 0xee;

const DataType kDataTypes[] = {DataType::kFloat32,  DataType::kFloat64, DataType::kFloat16,
                               DataType::kBFloat16, DataType::kInt32,   DataType::kInt64,
                               DataType::kUInt8};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
                         ReduceOp::kAvg};

// `size` ranks over loopback TCP, each with its own transport and workspace, kept for all the
// collectives of one test.
class Ranks {
 public:
  Ranks(int size, std::chrono::milliseconds timeout) : size_(size), timeout_(timeout) {
    transports_.resize(static_cast<size_t>(size));
    workspaces_.resize(static_cast<size_t>(size));
    test::rethrowFirst(test::runRanks(size, [&](int rank) {
      transports_[static_cast<size_t>(rank)] = transport::links::tcp::connectMesh(
          store_, test::tcpMeshOptions(rank, size, "device-staging-test"));
    }));
  }

  // In parallel: a transport's destructor waits (boundedly) for its peers to say goodbye.
  ~Ranks() {
    test::runRanks(size_, [&](int rank) { transports_[static_cast<size_t>(rank)].reset(); });
  }

  int size() const { return size_; }

  // Runs body(rank, make_context) on every rank's thread; make_context(tag) enters the
  // collective of `tag` and returns its Context. A rank that fails aborts its transport, as
  // the Communicator does, so that the others fail fast.
  std::vector<std::exception_ptr> run(
      const std::function<void(int rank, const std::function<Context(transport::MessageTag)>&)>&
          body) {
    return test::runRanks(size_, [&](int rank) {
      auto& transport = *transports_[static_cast<size_t>(rank)];
      auto makeContext = [&](transport::MessageTag tag) {
        transport.enterCollective(tag);
        return Context{transport,
                       rank,
                       size_,
                       kChunkBytes,
                       timeout_,
                       tag,
                       workspaces_[static_cast<size_t>(rank)]};
      };
      try {
        body(rank, makeContext);
      } catch (...) {
        transport.abort(std::current_exception(), true);
        throw;
      }
    });
  }

 private:
  int size_;
  Duration timeout_;
  MemoryStore store_;
  std::vector<std::unique_ptr<test::Mesh>> transports_;
  std::vector<Workspace> workspaces_;
};

enum class Device { kHost, kDeferred };

std::unique_ptr<DeviceOps> makeDevice(Device device) {
  if (device == Device::kHost) return std::make_unique<HostDeviceOps>();
  return std::make_unique<DeferredDeviceOps>();
}

// Every queued operation must have run when a collective returns.
std::string pendingWork(const DeviceOps& device) {
  const auto* deferred = dynamic_cast<const DeferredDeviceOps*>(&device);
  if (deferred == nullptr || deferred->pending() == 0) return "";
  return " returned with " + std::to_string(deferred->pending()) + " device operations queued;";
}

size_t chunkElements(DataType dtype) {
  return std::max<size_t>(1, kChunkBytes / sizeOf(dtype));
}

struct Shape {
  size_t count;
  bool in_place;
};

// Element counts (per rank's contribution for allreduce, per block for the others), in place
// and not: the edge cases and both sides of a chunk boundary; and, for half of the dtype x op
// pairs (the loopback transport makes each call cost milliseconds), enough for three slices.
std::vector<Shape> shapes(int size, DataType dtype, ReduceOp op, bool per_rank) {
  const size_t n = per_rank ? 1 : static_cast<size_t>(size);
  const size_t chunk = chunkElements(dtype);
  std::vector<size_t> counts = {
      0, 1, static_cast<size_t>(size - 1), 17, n * chunk - 1, n * chunk + 1};
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  std::vector<Shape> result;
  for (size_t count : counts) {
    result.push_back({count, false});
    result.push_back({count, true});
  }
  const int pair = static_cast<int>(dtype) + static_cast<int>(op);
  if (pair % 2 == 0) result.push_back({n * 16 * chunk * 2 + 5, (pair / 2) % 2 == 0});
  return result;
}

// A buffer of `bytes` with a guard after it.
std::vector<uint8_t> guarded(size_t bytes) {
  return std::vector<uint8_t>(bytes + kGuardBytes, kUnset);
}

bool guardIntact(const std::vector<uint8_t>& buffer) {
  return std::all_of(buffer.end() - kGuardBytes, buffer.end(),
                     [](uint8_t b) { return b == kUnset; });
}

double tolerance(DataType dtype, ReduceOp op, double expected) {
  return (op == ReduceOp::kAvg && test::isFloat(dtype)) ? 1e-2 * std::fabs(expected) + 1e-6 : 0.0;
}

// Appends the first few differences between `got` (count elements) and expected(i).
void compare(std::string& failures, const std::string& what, const void* got, size_t count,
             DataType dtype, ReduceOp op, const std::function<double(size_t)>& expected) {
  int reported = 0;
  for (size_t i = 0; i < count && reported < 3; ++i) {
    const double want = expected(i);
    const double have = loadValue(got, i, dtype);
    if (!(std::fabs(have - want) <= tolerance(dtype, op, want))) {
      ++reported;
      failures += what + " [" + std::to_string(i) + "] got " + std::to_string(have) + " expected " +
                  std::to_string(want) + ";\n";
    }
  }
}

std::string caseName(const char* collective, int rank, DataType dtype, ReduceOp op, size_t count,
                     bool in_place) {
  return std::string(collective) + " rank " + std::to_string(rank) + " " +
         std::string(name(dtype)) + " " + std::string(name(op)) + " count " +
         std::to_string(count) + (in_place ? " in-place" : " out-of-place");
}

class DeviceStaging : public ::testing::TestWithParam<std::tuple<Device, int>> {
 protected:
  Device device() const { return std::get<0>(GetParam()); }
  int size() const { return std::get<1>(GetParam()); }

  // Runs body(rank, device, next_context, failures) on every rank and reports every rank's
  // failures.
  void runCases(const std::function<void(int, DeviceOps&,
                                         const std::function<Context(transport::MessageTag)>&,
                                         std::string&)>& body) {
    Ranks ranks(size(), std::chrono::seconds(20));
    std::vector<std::string> failures(static_cast<size_t>(size()));
    test::rethrowFirst(ranks.run([&](int rank, const auto& makeContext) {
      auto device = makeDevice(this->device());
      body(rank, *device, makeContext, failures[static_cast<size_t>(rank)]);
    }));
    for (int rank = 0; rank < size(); ++rank) {
      EXPECT_EQ(failures[static_cast<size_t>(rank)], "") << "rank " << rank;
    }
  }
};

TEST_P(DeviceStaging, AllreduceMatchesReference) {
  const int n = size();
  runCases([&](int rank, DeviceOps& device, const auto& makeContext, std::string& failures) {
    uint64_t sequence = 0;
    for (DataType dtype : kDataTypes) {
      for (ReduceOp op : kOps) {
        for (const Shape& shape : shapes(n, dtype, op, false)) {
          const size_t count = shape.count;
          const bool in_place = shape.in_place;
          const size_t salt = sequence;  // new data every call: stale buffers cannot pass
          const size_t bytes = count * sizeOf(dtype);
          std::vector<uint8_t> send = guarded(bytes);
          for (size_t i = 0; i < count; ++i) {
            storeValue(send.data(), i, dtype, inputValue(rank, i + salt, dtype, op));
          }
          const std::vector<uint8_t> original = send;
          std::vector<uint8_t> separate = guarded(bytes);
          std::vector<uint8_t>& result = in_place ? send : separate;
          const Context ctx =
              makeContext(makeTag(CollectiveKind::kAllreduce, ++sequence, dtype, op, count, 0));
          collectives::deviceRingAllreduce(ctx, device, send.data(), result.data(), count, dtype,
                                           op);
          const std::string what = caseName("allreduce", rank, dtype, op, count, in_place);
          compare(failures, what, result.data(), count, dtype, op,
                  [&](size_t i) { return expectedValue(n, i + salt, dtype, op); });
          if (!guardIntact(result)) failures += what + ": wrote past the end;\n";
          if (!in_place && send != original) failures += what + ": changed send;\n";
          const std::string pending = pendingWork(device);
          if (!pending.empty()) failures += what + pending + "\n";
        }
      }
    }
  });
}

TEST_P(DeviceStaging, ReduceScatterMatchesReference) {
  const int n = size();
  runCases([&](int rank, DeviceOps& device, const auto& makeContext, std::string& failures) {
    uint64_t sequence = 0;
    for (DataType dtype : kDataTypes) {
      for (ReduceOp op : kOps) {
        for (const Shape& shape : shapes(n, dtype, op, true)) {
          const size_t block = shape.count;
          const bool in_place = shape.in_place;
          const size_t salt = sequence;
          const size_t es = sizeOf(dtype);
          const size_t total = block * static_cast<size_t>(n);
          std::vector<uint8_t> send = guarded(total * es);
          for (size_t i = 0; i < total; ++i) {
            storeValue(send.data(), i, dtype, inputValue(rank, i + salt, dtype, op));
          }
          const std::vector<uint8_t> original = send;
          std::vector<uint8_t> separate = guarded(block * es);
          uint8_t* result =
              in_place ? send.data() + static_cast<size_t>(rank) * block * es : separate.data();
          const Context ctx =
              makeContext(makeTag(CollectiveKind::kReduceScatter, ++sequence, dtype, op, block, 0));
          collectives::deviceRingReduceScatter(ctx, device, send.data(), result, block, dtype, op);
          const std::string what = caseName("reduce_scatter", rank, dtype, op, block, in_place);
          const size_t first = static_cast<size_t>(rank) * block;
          compare(failures, what, result, block, dtype, op,
                  [&](size_t i) { return expectedValue(n, first + i + salt, dtype, op); });
          if (!guardIntact(in_place ? send : separate)) failures += what + ": past the end;\n";
          if (!in_place && send != original) failures += what + ": changed send;\n";
          const std::string pending = pendingWork(device);
          if (!pending.empty()) failures += what + pending + "\n";
        }
      }
    }
  });
}

TEST_P(DeviceStaging, AllgatherMatchesReference) {
  const int n = size();
  runCases([&](int rank, DeviceOps& device, const auto& makeContext, std::string& failures) {
    uint64_t sequence = 0;
    for (DataType dtype : kDataTypes) {
      for (const Shape& shape : shapes(n, dtype, ReduceOp::kSum, true)) {
        const size_t block = shape.count;
        const bool in_place = shape.in_place;
        const size_t salt = sequence;
        const size_t es = sizeOf(dtype);
        const size_t total = block * static_cast<size_t>(n);
        auto value = [&](int owner, size_t i) {
          return inputValue(owner, i + salt, dtype, ReduceOp::kSum);
        };
        std::vector<uint8_t> recv = guarded(total * es);
        std::vector<uint8_t> separate = guarded(block * es);
        uint8_t* send =
            in_place ? recv.data() + static_cast<size_t>(rank) * block * es : separate.data();
        for (size_t i = 0; i < block; ++i) storeValue(send, i, dtype, value(rank, i));
        const Context ctx = makeContext(
            makeTag(CollectiveKind::kAllgather, ++sequence, dtype, ReduceOp::kSum, block, 0));
        collectives::deviceAllgather(ctx, device, send, recv.data(), block, dtype);
        const std::string what =
            caseName("allgather", rank, dtype, ReduceOp::kSum, block, in_place);
        // Inputs are small integers, exact in every dtype.
        compare(failures, what, recv.data(), total, dtype, ReduceOp::kSum,
                [&](size_t i) { return value(static_cast<int>(i / block), i % block); });
        if (!guardIntact(recv)) failures += what + ": wrote past the end;\n";
        const std::string pending = pendingWork(device);
        if (!pending.empty()) failures += what + pending + "\n";
      }
    }
  });
}

TEST_P(DeviceStaging, BroadcastFromFirstAndLastRankMatchesRoot) {
  const int n = size();
  runCases([&](int rank, DeviceOps& device, const auto& makeContext, std::string& failures) {
    uint64_t sequence = 0;
    for (DataType dtype : {DataType::kFloat32, DataType::kUInt8, DataType::kFloat64}) {
      const size_t chunk = chunkElements(dtype);
      // 3 * kSlots chunks: every pinned chunk slot is reused twice.
      for (size_t count : {size_t{0}, size_t{1}, size_t{17}, chunk - 1, chunk + 1,
                           3 * ChunkStream::kSlots * chunk + 3}) {
        for (int root : {0, n - 1}) {
          for (bool in_place : {false, true}) {
            const size_t salt = sequence;
            const size_t bytes = count * sizeOf(dtype);
            auto value = [&](size_t i) {
              return inputValue(root, i + salt, dtype, ReduceOp::kSum);
            };
            std::vector<uint8_t> recv = guarded(bytes);
            std::vector<uint8_t> separate = guarded(bytes);
            uint8_t* send = in_place ? recv.data() : separate.data();
            if (rank == root) {
              for (size_t i = 0; i < count; ++i) storeValue(send, i, dtype, value(i));
            }
            const Context ctx =
                makeContext(makeTag(CollectiveKind::kBroadcast, ++sequence, dtype, ReduceOp::kSum,
                                    count, static_cast<uint32_t>(root)));
            collectives::deviceBroadcast(ctx, device, send, recv.data(), count, dtype, root);
            const std::string what =
                caseName("broadcast", rank, dtype, ReduceOp::kSum, count, in_place) + " root " +
                std::to_string(root);
            compare(failures, what, recv.data(), count, dtype, ReduceOp::kSum, value);
            if (!guardIntact(recv)) failures += what + ": wrote past the end;\n";
            const std::string pending = pendingWork(device);
            if (!pending.empty()) failures += what + pending + "\n";
          }
        }
      }
    }
  });
}

std::string paramName(const ::testing::TestParamInfo<std::tuple<Device, int>>& info) {
  return std::string(std::get<0>(info.param) == Device::kHost ? "Host" : "Deferred") + "_" +
         std::to_string(std::get<1>(info.param)) + "ranks";
}

INSTANTIATE_TEST_SUITE_P(DevicesAndSizes, DeviceStaging,
                         ::testing::Combine(::testing::Values(Device::kHost, Device::kDeferred),
                                            ::testing::Values(1, 2, 3, 4)),
                         paramName);

// --- The deferred device itself: it must catch what it is there to catch. ---

TEST(DeferredDeviceOps, RunsWorkOnlyWhenWaitedForAndPoisonsPinnedDestinations) {
  DeferredDeviceOps device;
  std::vector<uint8_t> source(8, 7);
  auto* host = static_cast<uint8_t*>(device.pinned(0, 8));
  std::memset(host, 1, 8);
  device.copyToHost(host, source.data(), 8);
  // Not run yet, and what was there before is gone: sending it now would send garbage.
  EXPECT_EQ(host[0], DeferredDeviceOps::kGarbage);
  EXPECT_EQ(device.pending(), 1u);
  const DeviceOps::Ticket ticket = device.mark();
  device.waitFor(ticket, deadlineAfter(std::chrono::seconds(1)), "copy");
  EXPECT_EQ(host[0], 7);
  EXPECT_EQ(device.pending(), 0u);
  EXPECT_THROW(device.waitFor(ticket + 1, deadlineAfter(std::chrono::seconds(1)), "x"),
               InvalidArgument);
}

TEST(DeferredDeviceOps, ACopyOutOfPinnedMemoryReadsItWhenItRuns) {
  DeferredDeviceOps device;
  auto* host = static_cast<uint8_t*>(device.pinned(0, 4));
  auto* scratch = static_cast<uint8_t*>(device.deviceScratch(0, 4));
  std::memset(host, 1, 4);
  device.copyToDevice(scratch, host, 4);
  std::memset(host, 2, 4);  // a receive into the slot before the copy was waited for
  // A copy into memory that queued work still reads is not poisoned (that would change it).
  device.copyToHost(host, scratch, 4);
  device.flush();
  EXPECT_EQ(scratch[0], 2);
}

// --- Bookkeeping ---

TEST(StagingPlan, RingChunksTileEverySegmentWithinTheChunkSize) {
  for (size_t element_size : {size_t{1}, size_t{2}, size_t{4}, size_t{8}}) {
    for (size_t chunk_bytes : {size_t{1}, size_t{7}, size_t{64}, size_t{1000}}) {
      for (int n : {2, 3, 5}) {
        for (size_t count = 0; count < 150; count += 7) {
          const SegmentLayout layout = SegmentLayout::balanced(count, n);
          const RingStaging plan(layout, element_size, chunk_bytes);
          const size_t limit = (chunk_bytes + element_size - 1) / element_size * element_size;
          for (int segment = 0; segment < n; ++segment) {
            size_t next = 0;
            for (size_t c = 0; c < plan.chunks(); ++c) {
              EXPECT_EQ(plan.chunkOffset(segment, c), next);
              EXPECT_LE(plan.chunkBytes(segment, c), limit);
              EXPECT_EQ(plan.chunkBytes(segment, c) % element_size, 0u);
              next += plan.chunkBytes(segment, c);
            }
            EXPECT_EQ(next, layout.length[static_cast<size_t>(segment)] * element_size);
            EXPECT_LE(next, plan.segmentBytes());
          }
          std::set<uint32_t> steps;
          for (int step = 0; step <= n - 2; ++step) {
            for (size_t c = 0; c < plan.chunks(); ++c) steps.insert(plan.tagStep(100, step, c));
          }
          EXPECT_EQ(steps.size(), static_cast<size_t>(n - 1) * plan.chunks());
          EXPECT_GE(*steps.begin(), 100u);
        }
      }
    }
  }
}

TEST(StagingPlan, SlicesAndSegmentsCoverEveryElementExactlyOnce) {
  for (int n : {2, 3, 4}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{255}, size_t{256}, size_t{1000}}) {
      // Allreduce: slices of the buffer, each split into balanced segments.
      std::vector<int> hits(count, 0);
      for (const auto& slice : collectives::slices(count, 64 * static_cast<size_t>(n))) {
        const SegmentLayout layout = SegmentLayout::balanced(slice.length, n);
        const RingStaging plan(layout, 4, 16);
        for (int s = 0; s < n; ++s) {
          for (size_t c = 0; c < plan.chunks(); ++c) {
            const size_t first =
                slice.begin + layout.offset[static_cast<size_t>(s)] + plan.chunkOffset(s, c) / 4;
            for (size_t i = 0; i < plan.chunkElements(s, c); ++i) ++hits.at(first + i);
          }
        }
      }
      EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }))
          << "allreduce, " << n << " ranks, count " << count;
      // Reduce-scatter/allgather: slices of each block.
      std::vector<int> block_hits(count * static_cast<size_t>(n), 0);
      for (const auto& slice : collectives::slices(count, 64)) {
        const SegmentLayout layout = SegmentLayout::blockSlice(count, slice.begin, slice.length, n);
        const RingStaging plan(layout, 4, 16);
        for (int s = 0; s < n; ++s) {
          for (size_t c = 0; c < plan.chunks(); ++c) {
            const size_t first = layout.offset[static_cast<size_t>(s)] + plan.chunkOffset(s, c) / 4;
            for (size_t i = 0; i < plan.chunkElements(s, c); ++i) ++block_hits.at(first + i);
          }
        }
      }
      EXPECT_TRUE(std::all_of(block_hits.begin(), block_hits.end(), [](int h) { return h == 1; }))
          << "blocks, " << n << " ranks, count " << count;
    }
  }
  EXPECT_EQ(collectives::slices(0, 8).size(), 1u);  // empty collectives still exchange headers
}

// The data of ring step s sits in buffer(s) from its arrival until it is forwarded in step
// s + 1, so step s + 1 must use another buffer, and the buffer a step takes over must be the one
// of reuses(s), finished at least a full step earlier.
TEST(StagingPlan, RingBuffersAreNeverReusedWhileTheirDataIsInFlight) {
  for (int step = -1; step < 40; ++step) {
    EXPECT_NE(RingStaging::buffer(step), RingStaging::buffer(step + 1)) << step;
    int previous = -1000;
    for (int earlier = step - 1; earlier >= -1; --earlier) {
      if (RingStaging::buffer(earlier) == RingStaging::buffer(step)) {
        previous = earlier;
        break;
      }
    }
    if (previous >= -1) {
      EXPECT_EQ(RingStaging::reuses(step), previous) << step;
    } else {
      EXPECT_LT(RingStaging::reuses(step), -1) << step;
    }
    EXPECT_LE(RingStaging::reuses(step), step - 2);
    EXPECT_GE(RingStaging::buffer(step), 0);
    EXPECT_LT(RingStaging::buffer(step), RingStaging::kBuffers);
  }
}

// Replays deviceBroadcast's schedule (start kLookahead chunks, then finish chunk i and start
// chunk i + kLookahead): a slot is only ever taken over from the chunk reuses() names, and only
// once that chunk is finished, and the chunks tile the message.
TEST(StagingPlan, ChunkSlotsAreTakenOverOnlyFromFinishedChunks) {
  for (size_t bytes : {size_t{0}, size_t{5}, size_t{64}, size_t{65}, size_t{64 * 100 + 3}}) {
    const ChunkStream stream(bytes, 64);
    std::vector<long> holder(ChunkStream::kSlots, -1);
    std::vector<bool> finished(stream.chunks(), false);
    size_t covered = 0;
    auto start = [&](size_t c) {
      const size_t slot = stream.slotOffset(c) / 64;
      EXPECT_EQ(holder[slot], std::max(-1L, ChunkStream::reuses(c))) << "chunk " << c;
      if (holder[slot] >= 0) {
        EXPECT_TRUE(finished[static_cast<size_t>(holder[slot])]) << "chunk " << c;
      }
      holder[slot] = static_cast<long>(c);
      EXPECT_EQ(stream.offset(c), covered);
      EXPECT_LE(stream.slotOffset(c) + stream.bytes(c), stream.pinnedBytes());
      covered += stream.bytes(c);
    };
    for (size_t c = 0; c < stream.chunks() && c < ChunkStream::kLookahead; ++c) start(c);
    for (size_t c = 0; c < stream.chunks(); ++c) {
      finished[c] = true;
      if (c + ChunkStream::kLookahead < stream.chunks()) start(c + ChunkStream::kLookahead);
    }
    EXPECT_EQ(covered, bytes);
  }
}

// --- Failures ---

// A device that never finishes anything, waiting the way CudaDeviceOps waits for events.
class StuckDeviceOps : public HostDeviceOps {
 public:
  void waitFor(Ticket, Deadline deadline, const char* what) override {
    collectives::pollUntilDone([] { return false; }, deadline, what);
  }
};

TEST(DeviceStagingFailure, DeviceThatNeverFinishesRaisesTimeoutNamingTheWaitWithinTheDeadline) {
  constexpr auto kTimeout = std::chrono::milliseconds(300);
  Ranks ranks(2, kTimeout);
  const auto start = Clock::now();
  const auto errors = ranks.run([&](int rank, const auto& makeContext) {
    StuckDeviceOps device;
    std::vector<float> data(100, static_cast<float>(rank));
    const Context ctx = makeContext(
        makeTag(CollectiveKind::kAllreduce, 1, DataType::kFloat32, ReduceOp::kSum, 100, 0));
    collectives::deviceRingAllreduce(ctx, device, data.data(), data.data(), data.size(),
                                     DataType::kFloat32, ReduceOp::kSum);
  });
  const double seconds = secondsSince(start);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(errors[static_cast<size_t>(rank)]) << "rank " << rank << " did not fail";
    try {
      std::rethrow_exception(errors[static_cast<size_t>(rank)]);
    } catch (const TimeoutError& e) {
      // Its own device wait, or the peer's forwarded failure: either names the wait.
      EXPECT_NE(std::string(e.what()).find("copy of this rank's chunk to pinned memory"),
                std::string::npos)
          << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << rank << ": " << e.what();
    }
  }
  EXPECT_LT(seconds, 3.0);
}

TEST(DeviceStagingFailure, PollUntilDoneReturnsOnceDoneAndNamesWhatAndTimeWhenNot) {
  int polls = 0;
  collectives::pollUntilDone([&] { return ++polls == 200; }, deadlineAfter(std::chrono::seconds(5)),
                             "x");
  EXPECT_EQ(polls, 200);
  const auto start = Clock::now();
  try {
    collectives::pollUntilDone([] { return false; }, deadlineAfter(std::chrono::milliseconds(50)),
                               "the test's wait");
    ADD_FAILURE() << "no timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("the test's wait"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("waited 0.0"), std::string::npos) << e.what();
  }
  EXPECT_LT(secondsSince(start), 1.0);
}

TEST(DeviceStagingFailure, RankWithAnotherCountRaisesMismatchOnEveryRankWithoutWaiting) {
  constexpr int kSize = 3;
  Ranks ranks(kSize, std::chrono::seconds(20));
  const auto start = Clock::now();
  const auto errors = ranks.run([&](int rank, const auto& makeContext) {
    DeferredDeviceOps device;
    const size_t count = rank == 1 ? 1001 : 1000;
    std::vector<float> data(count, 1.0f);
    const Context ctx = makeContext(
        makeTag(CollectiveKind::kAllreduce, 1, DataType::kFloat32, ReduceOp::kSum, count, 0));
    collectives::deviceRingAllreduce(ctx, device, data.data(), data.data(), count,
                                     DataType::kFloat32, ReduceOp::kSum);
  });
  EXPECT_LT(secondsSince(start), 5.0);
  for (int rank = 0; rank < kSize; ++rank) {
    ASSERT_TRUE(errors[static_cast<size_t>(rank)]) << "rank " << rank << " did not fail";
    try {
      std::rethrow_exception(errors[static_cast<size_t>(rank)]);
    } catch (const MismatchError& e) {
      EXPECT_NE(std::string(e.what()).find("count: "), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << rank << ": " << e.what();
    }
  }
}

// Without a usable CUDA device, constructing the CUDA device says so instead of crashing.
TEST(CudaDeviceOps, WithoutCudaConstructionRaisesConfigError) {
  if (kernels::cuda::available()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_THROW(collectives::CudaDeviceOps ops(0), Error);
}

}  // namespace
}  // namespace railshard
