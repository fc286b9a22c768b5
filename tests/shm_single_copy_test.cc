// The single-copy all-reduce between ranks of one host (core/collectives/shm_single_copy.cc).
//
// In one process (ranks on threads, cross-memory reads of the process itself): every dtype x op,
// in and out of place, against the scalar reference, with the single copy on from 4 KiB and
// off; the trace's "shm_single_copy" phases prove which path ran (one per all-reduce at or
// above the threshold where every rank has a core; none below it, when off, or with more
// ranks than cores, where the ranks decline it after its first hand-off).
//
// Buffers from Communicator::allocateSharedBuffer (transport/links/shm/shared_buffers.h): the
// region registry's lookups and errors, a mapping that shows the owner's writes, and the mapped
// path
// ("shm_single_copy_mapped" phases) exact for every dtype x op.
//
// Between processes (tests/programs/collective_check started by hand): the peers' buffers
// really are in other processes; exact on the single copy (read across when asked for with
// RAILSHARD_SHM_CROSS_READ=1, and mapped from shared buffers), on the staged path that
// ordinary buffers take by default, with it off (RAILSHARD_SHM_SINGLE_COPY=0) and with
// cross-memory reads refused (RAILSHARD_P2P_SHM=0, what a ptrace_scope or container policy
// does); a peer killed mid-run is a PeerLostError naming it on every survivor.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "base/memory_store.h"
#include "base/trace.h"
#include "core/communicator.h"
#include "tests/collective_check.h"
#include "tests/reference.h"
#include "tests/test_util.h"
#include "transport/links/shm/shared_buffers.h"
#include "transport/messaging/machine_load.h"

namespace railshard {
namespace {

using json = nlohmann::json;

const std::string kCheck = std::string(RAILSHARD_BINARY_DIR) + "/tests/collective_check";

std::string readAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Phases named `name` in a rank's trace file.
size_t singleCopyPhases(const std::string& path, const std::string& name = "shm_single_copy") {
  size_t found = 0;
  const json file = json::parse(readAll(path));  // kept: a range-for over a member of a
                                                 // temporary would read a destroyed object
  for (const auto& e : file["traceEvents"]) {
    if (e.value("cat", "") == "phase" && e.value("name", "") == name) ++found;
  }
  return found;
}

// What the start-up probe chose ("cross_read" or "staged"); "" when it did not run.
std::string probeChoice(const std::string& path) {
  const json file = json::parse(readAll(path));
  for (const auto& e : file["traceEvents"]) {
    if (e.value("cat", "") == "phase" && e.value("name", "") == "shm_read_probe") {
      return e["args"].value("choice", "?");
    }
  }
  return "";
}

// (ranks, RAILSHARD_SHM_SINGLE_COPY in bytes)
class SingleCopyThreads : public ::testing::TestWithParam<std::tuple<int, size_t>> {
 protected:
  void SetUp() override {
    trace::disableAndClear();
    dir_ = test::tempPath("single_copy_trace");
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override {
    trace::disableAndClear();
    std::filesystem::remove_all(dir_);
  }
  std::string dir_;
};

TEST_P(SingleCopyThreads, EveryDtypeOpInAndOutOfPlaceMatchesTheScalarReference) {
  const int size = std::get<0>(GetParam());
  const size_t threshold = std::get<1>(GetParam());
  // 1000 elements: below 4 KiB for every dtype but the 8-byte ones; 5003: odd segments;
  // 300000: several 256 KiB pieces per segment.
  const std::vector<size_t> counts = {1000, 5003, 300000};
  MemoryStore store;
  test::rethrowFirst(test::runRanks(size, [&](int rank) {
    Communicator::Options options;
    options.rank = rank;
    options.size = size;
    options.config.timeout = std::chrono::seconds(60);
    options.config.transport = TransportKind::kShm;
    options.config.algorithm = "shm_rsag";
    options.config.shm.slot_bytes = 64 * 1024;
    options.config.shm.single_copy_bytes = threshold;
    options.config.shm.cross_read = CrossRead::kOn;  // ordinary buffers: read across where it may
    options.config.trace_dir = dir_;
    options.config.trace_events = 1 << 20;
    auto comm = Communicator::create(store, options);
    test::checkEveryAllreduce(*comm, counts, [](const std::string& ran) {
      if (ran != "shm_rsag") throw std::runtime_error("ran " + ran + ", not shm_rsag");
    });
  }));
  trace::flush();
  // All-reduces at or above the threshold, counted the scalar way; read across with
  // process_vm_readv only where every rank has a core (more ranks than cores: the staged
  // path, after the single copy's first hand-off, which this also checks).
  size_t expected = 0;
  const bool reads_across = static_cast<unsigned>(size) <= transport::messaging::allowedCores();
  for (size_t count : counts) {
    if (!reads_across) break;
    for (DataType dtype : test::allDataTypes()) {
      if (threshold > 0 && count * sizeOf(dtype) >= threshold) expected += test::allOps().size();
    }
  }
  if (threshold > 0 && reads_across) {
    ASSERT_GT(expected, 0u);  // the test must reach the path it checks
  }
  for (int rank = 0; rank < size; ++rank) {
    EXPECT_EQ(singleCopyPhases(trace::rankFile(dir_, rank)), expected) << "rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(RanksAndThreshold, SingleCopyThreads,
                         ::testing::Combine(::testing::Values(2, 3, 4),
                                            ::testing::Values(size_t{4096}, size_t{0})),
                         [](const auto& info) {
                           return "n" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) == 0 ? "_off" : "_from4K");
                         });

TEST(SharedBuffers, RegionsAreFoundByAddressAndBadCallsAreRefused) {
  try {
    Communicator::allocateSharedBuffer(0);
    ADD_FAILURE() << "no InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("allocateShared: 0 bytes"), std::string::npos) << e.what();
  }
  auto* region = static_cast<uint8_t*>(Communicator::allocateSharedBuffer(10000));
  EXPECT_EQ(region[9999], 0) << "zeroed";
  const auto whole = transport::links::shm::findShared(region, 10000);
  EXPECT_NE(whole.serial, 0u);
  EXPECT_EQ(whole.offset, 0u);
  EXPECT_GE(whole.region_bytes, 10000u);
  const auto inside = transport::links::shm::findShared(region + 100, 500);
  EXPECT_EQ(inside.serial, whole.serial);
  EXPECT_EQ(inside.offset, 100u);
  EXPECT_EQ(transport::links::shm::findShared(region + 100, whole.region_bytes).serial, 0u)
      << "runs past the region's end";
  std::vector<uint8_t> elsewhere(100);
  EXPECT_EQ(transport::links::shm::findShared(elsewhere.data(), 100).serial, 0u);
  try {
    Communicator::freeSharedBuffer(region + 8);
    ADD_FAILURE() << "no InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("is not a region allocateShared returned"),
              std::string::npos)
        << e.what();
  }
  Communicator::freeSharedBuffer(region);
  EXPECT_EQ(transport::links::shm::findShared(region, 1).serial, 0u) << "gone once freed";
}

TEST(SharedBuffers, AMappingShowsTheOwnersWritesAndOutlivesTheRegion) {
  auto* region = static_cast<uint64_t*>(Communicator::allocateSharedBuffer(1 << 20));
  const auto ref = transport::links::shm::findShared(region + 1000, 8 * 1000);
  const uint8_t* mapped;
  {
    transport::links::shm::PeerMappings mappings;
    mapped = mappings.map(::getpid(), ref);
    ASSERT_NE(mapped, nullptr) << "pidfd_getfd of this process refused";
    region[1000] = 0x1234567890abcdefull;  // written after mapping: the same pages
    uint64_t seen = 0;
    std::memcpy(&seen, mapped, sizeof(seen));
    EXPECT_EQ(seen, 0x1234567890abcdefull);
    EXPECT_EQ(mappings.map(::getpid(), ref), mapped) << "mapped once, then cached";
    Communicator::freeSharedBuffer(region);
    std::memcpy(&seen, mapped, sizeof(seen));  // the mapping keeps the pages
    EXPECT_EQ(seen, 0x1234567890abcdefull);
  }
}

TEST(SingleCopy, SharedBuffersAreReadMappedExactlyForEveryDtypeAndOp) {
  trace::disableAndClear();
  const std::string dir = test::tempPath("single_copy_mapped_trace");
  std::filesystem::remove_all(dir);
  constexpr int kSize = 3;
  constexpr size_t kCount = 100003;  // odd segments
  MemoryStore store;
  size_t calls = 0;
  test::rethrowFirst(test::runRanks(kSize, [&](int rank) {
    Communicator::Options options;
    options.rank = rank;
    options.size = kSize;
    options.config.timeout = std::chrono::seconds(60);
    options.config.transport = TransportKind::kShm;
    options.config.algorithm = "shm_rsag";
    options.config.shm.single_copy_bytes = 4096;
    options.config.trace_dir = dir;
    options.config.trace_events = 1 << 20;
    auto comm = Communicator::create(store, options);
    const size_t most = kCount * 8;
    auto* send = static_cast<uint8_t*>(Communicator::allocateSharedBuffer(most));
    auto* recv = static_cast<uint8_t*>(Communicator::allocateSharedBuffer(most));
    std::vector<uint8_t> input;
    size_t made = 0;
    for (DataType dtype : test::allDataTypes()) {
      for (ReduceOp op : test::allOps()) {
        for (bool in_place : {false, true}) {
          test::fillInput(input, rank, kCount, dtype, op);
          std::memcpy(send, input.data(), input.size());
          comm->allreduce(send, in_place ? send : recv, kCount, dtype, op);
          const std::string wrong =
              test::firstDifferences(in_place ? send : recv, kCount, kSize, dtype, op);
          if (!wrong.empty()) {
            throw std::runtime_error(std::string(name(dtype)) + " " + std::string(name(op)) +
                                     (in_place ? " in place:" : ":") + wrong);
          }
          ++made;
        }
      }
    }
    Communicator::freeSharedBuffer(recv);
    Communicator::freeSharedBuffer(send);
    if (rank == 0) calls = made;
  }));
  trace::flush();
  ASSERT_GT(calls, 0u);
  for (int rank = 0; rank < kSize; ++rank) {
    EXPECT_EQ(singleCopyPhases(trace::rankFile(dir, rank), "shm_single_copy_mapped"), calls)
        << "rank " << rank;
    EXPECT_EQ(singleCopyPhases(trace::rankFile(dir, rank)), 0u) << "rank " << rank;
  }
  trace::disableAndClear();
  std::filesystem::remove_all(dir);
}

TEST(SingleCopy, PartlyOverlappingBuffersAreRefusedOnEveryRank) {
  MemoryStore store;
  auto errors = test::runRanks(2, [&](int rank) {
    Communicator::Options options;
    options.rank = rank;
    options.size = 2;
    options.config.transport = TransportKind::kShm;
    options.config.shm.single_copy_bytes = 4096;
    auto comm = Communicator::create(store, options);
    std::vector<float> data(4096, 1.0f);
    try {
      // recv starts one element into send: a peer would read what this rank already wrote.
      comm->allreduce(data.data(), data.data() + 1, 4000, DataType::kFloat32, ReduceOp::kSum);
      ADD_FAILURE() << "rank " << rank << ": no InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("allreduce: the send and recv buffers overlap"),
                std::string::npos)
          << e.what();
    }
    // Refused before any step: the communicator is still in step, in place works.
    comm->allreduce(data.data(), 4000, DataType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(data[3999], 2.0f);
  });
  test::rethrowFirst(errors);
}

TEST(SingleCopy, ProcessesAllreduceExactlyOnTheSingleCopyAndOnBothFallbacks) {
  if (transport::messaging::allowedCores() < 2) {
    GTEST_SKIP() << "one core: two ranks would not read across (the staged path is theirs)";
  }
  struct Setting {
    std::map<std::string, std::string> env;
    bool shared;          // collective_check --shared 1
    const char* path;     // trace phases expected, one per all-reduce; nullptr: none
    bool probed = false;  // path: "shm_single_copy" only where the start-up probe chose it
  };
  const std::vector<Setting> settings = {
      {{{"RAILSHARD_SHM_SINGLE_COPY", "1M"}, {"RAILSHARD_SHM_CROSS_READ", "1"}},
       false,
       "shm_single_copy"},
      {{{"RAILSHARD_SHM_CROSS_READ", "0"}}, false, nullptr},
      {{}, false, "shm_single_copy", true},  // the default: as the probe found faster
      {{}, true, "shm_single_copy_mapped"},
      {{{"RAILSHARD_SHM_SINGLE_COPY", "0"}}, true, nullptr},
      {{{"RAILSHARD_P2P_SHM", "0"}, {"RAILSHARD_SHM_CROSS_READ", "1"}}, false, nullptr},
  };
  for (const auto& setting : settings) {
    std::string said;
    for (const auto& [variable, value] : setting.env) said += variable + "=" + value + " ";
    SCOPED_TRACE(said + (setting.shared ? "--shared 1" : "--shared 0"));
    const std::string dir = test::tempPath("single_copy_processes");
    std::filesystem::remove_all(dir);
    // 2 processes (a core each: may read across), 300,000 int64 (2.4 MB: past the 1 MiB
    // threshold).
    auto env = setting.env;
    env["RAILSHARD_TRACE"] = dir;
    auto results = test::runRanksByHand(
        kCheck, 2,
        {"--iterations", "6", "--count", "300000", "--shared", setting.shared ? "1" : "0"}, env,
        std::chrono::seconds(120), "single-copy");
    for (int rank = 0; rank < 2; ++rank) {
      const auto& r = results[static_cast<size_t>(rank)];
      ASSERT_EQ(r.exit_code, 0) << "rank " << rank << ": " << r.out << r.err;
      EXPECT_NE(r.out.find("ok after 6 allreduces over shm"), std::string::npos) << r.out;
      // Every rank ran the probe (auto) or none did, and all made one choice.
      const std::string choice = probeChoice(trace::rankFile(dir, rank));
      auto said = [&](const std::string& variable) {
        const auto it = setting.env.find(variable);
        return it == setting.env.end() ? std::string() : it->second;
      };
      const bool probed = said("RAILSHARD_SHM_CROSS_READ").empty() &&
                          said("RAILSHARD_SHM_SINGLE_COPY") != "0" &&
                          said("RAILSHARD_P2P_SHM") != "0";
      EXPECT_EQ(choice.empty(), !probed) << "rank " << rank << ": " << choice;
      if (rank == 1) {
        EXPECT_EQ(choice, probeChoice(trace::rankFile(dir, 0)));
      }
      for (const char* phase : {"shm_single_copy", "shm_single_copy_mapped"}) {
        const bool expected = setting.path != nullptr && std::string(setting.path) == phase &&
                              (!setting.probed || choice == "cross_read");
        EXPECT_EQ(singleCopyPhases(trace::rankFile(dir, rank), phase), expected ? 6u : 0u)
            << "rank " << rank << " " << phase;
      }
    }
    std::filesystem::remove_all(dir);
  }
}

// 2,000,000 int64 (16 MB) per all-reduce: the kill of rank 1 lands in a single-copy read or
// wait (shared 1: mapped, 3 ranks; shared 0: read across, 2 ranks so that each has a core).
void killOneOf(int ranks, const std::string& shared) {
  auto results =
      test::runRanksByHand(kCheck, ranks,
                           {"--iterations", "200", "--count", "2000000", "--die-rank", "1",
                            "--die-after", "3", "--die-how", "kill", "--shared", shared},
                           {{"RAILSHARD_TIMEOUT", "60"}, {"RAILSHARD_SHM_CROSS_READ", "1"}},
                           std::chrono::seconds(90), "single-copy-kill");
  EXPECT_EQ(results[1].signal, SIGKILL) << results[1].err;
  for (int rank = 0; rank < ranks; ++rank) {
    if (rank == 1) continue;
    const auto& r = results[static_cast<size_t>(rank)];
    ASSERT_FALSE(r.timed_out) << "rank " << rank << ": " << r.err;
    EXPECT_NE(r.exit_code, 0) << "rank " << rank << ": " << r.out << r.err;
    EXPECT_NE(r.err.find("PeerLostError"), std::string::npos) << "rank " << rank << ": " << r.err;
    EXPECT_NE(r.err.find("rank 1"), std::string::npos) << "rank " << rank << ": " << r.err;
  }
}

TEST(SingleCopy, APeerKilledMidRunIsAPeerLostErrorOnEverySurvivor) {
  if (transport::messaging::allowedCores() < 2) {
    GTEST_SKIP() << "one core: two ranks would not read across (the staged path is theirs)";
  }
  {
    SCOPED_TRACE("--shared 0");
    killOneOf(2, "0");
  }
  SCOPED_TRACE("--shared 1");
  killOneOf(3, "1");
}

}  // namespace
}  // namespace railshard
