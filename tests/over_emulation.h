#pragma once

// What the tests over the in-process libibverbs emulation (tests/fakes/fake_ibverbs.cc) share:
// its test hooks, an RDMA configuration with small rings, thread ranks, and a fixture that
// points the transport at the emulation and checks every verbs object is freed.
// Include only where FAKE_IBVERBS_PATH is defined.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/memory_store.h"
#include "core/communicator.h"
#include "tests/expect_error.h"
#include "tests/test_util.h"

namespace railshard {

// The emulation's test hooks (same handle the transport dlopen()s: same path).
struct FakeHooks {
  int (*break_qp)(uint32_t, int) = nullptr;
  int (*break_qp_one_side)(uint32_t, int) = nullptr;
  uint64_t (*bytes_written)(const char*) = nullptr;
  uint64_t (*plain_write_bytes)(const char*) = nullptr;
  int (*live_objects)() = nullptr;
  FakeHooks() {
    void* handle = ::dlopen(FAKE_IBVERBS_PATH, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) return;
    break_qp = reinterpret_cast<int (*)(uint32_t, int)>(::dlsym(handle, "fake_ibverbs_break_qp"));
    break_qp_one_side =
        reinterpret_cast<int (*)(uint32_t, int)>(::dlsym(handle, "fake_ibverbs_break_qp_one_side"));
    bytes_written =
        reinterpret_cast<uint64_t (*)(const char*)>(::dlsym(handle, "fake_ibverbs_bytes_written"));
    plain_write_bytes = reinterpret_cast<uint64_t (*)(const char*)>(
        ::dlsym(handle, "fake_ibverbs_plain_write_bytes"));
    live_objects = reinterpret_cast<int (*)()>(::dlsym(handle, "fake_ibverbs_live_objects"));
  }
};

// The emulation's queue pairs are numbered from small integers: breaks the first that exists,
// as a cable pull would (its outstanding write fails with "retry counter exceeded", both ends
// go into the error state).
inline void breakFirstQueuePair(const FakeHooks& hooks) {
  for (uint32_t qpn = 1; qpn < 100000; ++qpn) {
    if (hooks.break_qp(qpn, IBV_WC_RETRY_EXC_ERR) == 0) return;
  }
  ADD_FAILURE() << "no queue pair to break";
}

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

inline Config rdmaConfig() {
  Config config;
  config.transport = TransportKind::kIbverbs;
  config.timeout = std::chrono::seconds(60);
  config.connect_timeout = std::chrono::seconds(30);
  config.chunk_bytes = 64 * 1024;
  config.rdma.slots = 4;  // small rings: credits run out and wrap many times per collective
  config.rdma.slot_bytes = 8192;
  // A failed lane stays out, as the failover tests expect; the re-admission tests turn it on.
  config.rdma.readmit = std::chrono::milliseconds(0);
  return config;
}

inline std::vector<std::exception_ptr> withRanks(int size, const Config& config,
                                                 const std::function<void(Communicator&)>& body) {
  MemoryStore store;
  return test::runRanks(size, [&](int rank) {
    Communicator::Options options;
    options.rank = rank;
    options.size = size;
    options.config = config;
    auto comm = Communicator::create(store, options);
    body(*comm);
  });
}

inline std::string messageOf(const std::exception_ptr& error) {
  if (!error) return "(no error)";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  }
}

class OverEmulation : public ::testing::Test {
 protected:
  ScopedEnv library_{"RAILSHARD_IBVERBS_LIBRARY", FAKE_IBVERBS_PATH};
  ScopedEnv devices_{"FAKE_IBVERBS_DEVICES", "2"};
  FakeHooks hooks_;
  void TearDown() override {
    ASSERT_NE(hooks_.live_objects, nullptr);
    EXPECT_EQ(hooks_.live_objects(), 0) << "verbs objects left after every communicator closed";
  }
};

// Element i of rank r's input; the reference sum is a scalar loop over ranks.
inline float input(int rank, size_t i) {
  return static_cast<float>((rank + 1) * 0.5 + (i % 97));
}

// On every rank of `comm`: all-reduces of each count and a 300,000-element broadcast from
// `root`, each compared with a scalar loop over the ranks' inputs.
inline void checkAllreducesAndBroadcast(Communicator& comm, const std::vector<size_t>& counts,
                                        int root) {
  const int rank = comm.rank();
  for (size_t count : counts) {
    std::vector<float> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = input(rank, i);
    comm.allreduce(data.data(), count, DataType::kFloat32, ReduceOp::kSum);
    for (size_t i = 0; i < count; ++i) {
      float expected = 0;
      for (int r = 0; r < comm.size(); ++r) expected += input(r, i);
      ASSERT_NEAR(data[i], expected, 1e-3) << "allreduce count " << count << " element " << i;
    }
  }
  std::vector<int64_t> root_data(300000);
  for (size_t i = 0; i < root_data.size(); ++i) {
    root_data[i] = rank == root ? static_cast<int64_t>(i * 3 + root) : -1;
  }
  comm.broadcast(root_data.data(), root_data.size(), DataType::kInt64, root);
  for (size_t i = 0; i < root_data.size(); ++i) {
    ASSERT_EQ(root_data[i], static_cast<int64_t>(i * 3 + root)) << "broadcast element " << i;
  }
}

// One 600,000-float all-reduce of iteration `iteration` on a 2-rank `comm`, checked (every 7th
// element) against the scalar sum.
inline void checkTwoRankAllreduce(Communicator& comm, int iteration) {
  std::vector<float> data(600000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = input(comm.rank(), i) + iteration;
  comm.allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
  for (size_t i = 0; i < data.size(); i += 7) {
    const float expected = input(0, i) + input(1, i) + 2.0f * iteration;
    ASSERT_NEAR(data[i], expected, 1e-3) << "iteration " << iteration << " element " << i;
  }
}

// Every rank's error is an `E` whose text contains `text`.
template <typename E>
void expectOnEveryRank(const std::vector<std::exception_ptr>& errors, const std::string& text) {
  for (size_t r = 0; r < errors.size(); ++r) {
    test::expectError<E>(errors[r], text, "rank " + std::to_string(r));
  }
}

// Every rank's error is a MismatchError naming the all-reduce.
inline void expectMismatchOnEveryRank(const std::vector<std::exception_ptr>& errors) {
  expectOnEveryRank<MismatchError>(errors, "allreduce");
}

}  // namespace railshard
