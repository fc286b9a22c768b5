// NcclApi: NCCL loaded with dlopen (no link dependency), RAILSHARD_NCCL_LIBRARY, the error text,
// and railshard's dtype/op mapping to NCCL's enum values. Loading needs no GPU (libnccl loads
// libcuda only when a communicator is made), so the toolkit's NCCL is loaded for real here
// when it is installed.
#include "core/collectives/nccl_api.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "base/error.h"

// nccl.h needs CUDA's headers; when both are on the include path, the spelled-out values are
// checked against the real enums at compile time.
#if __has_include(<nccl.h>) && __has_include(<cuda_runtime.h>)
#include <nccl.h>
#define RAILSHARD_TEST_HAS_NCCL_H 1
#endif

namespace railshard::collectives {
namespace {

const std::string kToolkitNccl = "/usr/local/cuda/lib64/libnccl.so.2";

bool exists(const std::string& path) {
  return std::ifstream(path).good();
}

// Sets RAILSHARD_NCCL_LIBRARY for one test and restores it after.
class ScopedLibrary {
 public:
  explicit ScopedLibrary(const std::string& path) {
    const char* old = std::getenv("RAILSHARD_NCCL_LIBRARY");
    had_ = old != nullptr;
    if (had_) old_ = old;
    ::setenv("RAILSHARD_NCCL_LIBRARY", path.c_str(), 1);
  }
  ~ScopedLibrary() {
    if (had_) {
      ::setenv("RAILSHARD_NCCL_LIBRARY", old_.c_str(), 1);
    } else {
      ::unsetenv("RAILSHARD_NCCL_LIBRARY");
    }
  }

 private:
  bool had_ = false;
  std::string old_;
};

#ifdef RAILSHARD_TEST_HAS_NCCL_H
static_assert(sizeof(nccl::UniqueId) == sizeof(ncclUniqueId));
static_assert(nccl::kSuccess == ncclSuccess && nccl::kInProgress == ncclInProgress);
#endif

TEST(NcclApi, DataTypeValuesAreNccls) {
  // nccl.h: ncclUint8 1, ncclInt32 2, ncclInt64 4, ncclFloat16 6, ncclFloat32 7,
  // ncclFloat64 8, ncclBfloat16 9.
  EXPECT_EQ(nccl::dataType(DataType::kUInt8), 1);
  EXPECT_EQ(nccl::dataType(DataType::kInt32), 2);
  EXPECT_EQ(nccl::dataType(DataType::kInt64), 4);
  EXPECT_EQ(nccl::dataType(DataType::kFloat16), 6);
  EXPECT_EQ(nccl::dataType(DataType::kFloat32), 7);
  EXPECT_EQ(nccl::dataType(DataType::kFloat64), 8);
  EXPECT_EQ(nccl::dataType(DataType::kBFloat16), 9);
#ifdef RAILSHARD_TEST_HAS_NCCL_H
  EXPECT_EQ(nccl::dataType(DataType::kUInt8), ncclUint8);
  EXPECT_EQ(nccl::dataType(DataType::kInt32), ncclInt32);
  EXPECT_EQ(nccl::dataType(DataType::kInt64), ncclInt64);
  EXPECT_EQ(nccl::dataType(DataType::kFloat16), ncclFloat16);
  EXPECT_EQ(nccl::dataType(DataType::kFloat32), ncclFloat32);
  EXPECT_EQ(nccl::dataType(DataType::kFloat64), ncclFloat64);
  EXPECT_EQ(nccl::dataType(DataType::kBFloat16), ncclBfloat16);
#endif
  EXPECT_THROW(nccl::dataType(static_cast<DataType>(kNumDataTypes)), InvalidArgument);
}

TEST(NcclApi, RedOpValuesAreNcclsWithMaxBeforeMin) {
  EXPECT_EQ(nccl::redOp(ReduceOp::kSum), 0);
  EXPECT_EQ(nccl::redOp(ReduceOp::kProd), 1);
  EXPECT_EQ(nccl::redOp(ReduceOp::kMax), 2);
  EXPECT_EQ(nccl::redOp(ReduceOp::kMin), 3);
  EXPECT_EQ(nccl::redOp(ReduceOp::kAvg), 4);
#ifdef RAILSHARD_TEST_HAS_NCCL_H
  EXPECT_EQ(nccl::redOp(ReduceOp::kSum), ncclSum);
  EXPECT_EQ(nccl::redOp(ReduceOp::kProd), ncclProd);
  EXPECT_EQ(nccl::redOp(ReduceOp::kMax), ncclMax);
  EXPECT_EQ(nccl::redOp(ReduceOp::kMin), ncclMin);
  EXPECT_EQ(nccl::redOp(ReduceOp::kAvg), ncclAvg);
#endif
  EXPECT_THROW(nccl::redOp(static_cast<ReduceOp>(kNumReduceOps)), InvalidArgument);
}

TEST(NcclApi, DefaultLibraryIsTheSoname) {
  ::unsetenv("RAILSHARD_NCCL_LIBRARY");
  EXPECT_EQ(NcclApi::libraryPath(), "libnccl.so.2");
  // Loaded or not depends on the loader path; either way get() and the reason agree.
  EXPECT_EQ(NcclApi::get() == nullptr, !NcclApi::unavailableReason().empty())
      << NcclApi::unavailableReason();
}

TEST(NcclApi, MissingLibraryIsNullWithAReasonNamingThePath) {
  const std::string path = "/nonexistent/libnccl.so.2";
  ScopedLibrary library(path);
  EXPECT_EQ(NcclApi::libraryPath(), path);
  EXPECT_EQ(NcclApi::get(), nullptr);
  const std::string why = NcclApi::unavailableReason();
  EXPECT_NE(why.find("RAILSHARD_NCCL_LIBRARY=" + path), std::string::npos) << why;

  std::string direct;
  EXPECT_EQ(NcclApi::load(path, direct), nullptr);
  EXPECT_NE(direct.find(path), std::string::npos) << direct;
}

TEST(NcclApi, LibraryWithoutNcclNamesTheMissingSymbol) {
  std::string why;
  EXPECT_EQ(NcclApi::load("libc.so.6", why), nullptr);
  EXPECT_NE(why.find("libc.so.6 has no ncclGetVersion"), std::string::npos) << why;
}

TEST(NcclApi, LoadsTheToolkitsNccl) {
  if (!exists(kToolkitNccl)) GTEST_SKIP() << kToolkitNccl << " is not installed";
  std::string why;
  const auto api = NcclApi::load(kToolkitNccl, why);
  ASSERT_NE(api, nullptr) << why;
  EXPECT_TRUE(why.empty()) << why;
  EXPECT_EQ(api->path(), kToolkitNccl);
  EXPECT_GE(api->version(), 22800);
  EXPECT_EQ(api->versionString().rfind("2.", 0), 0u) << api->versionString();
  // Every required entry point is there; the two optional ones exist in 2.28 too.
  EXPECT_NE(api->allReduce, nullptr);
  EXPECT_NE(api->reduce, nullptr);
  EXPECT_NE(api->broadcast, nullptr);
  EXPECT_NE(api->commInitRankConfig, nullptr);
  EXPECT_NE(api->getLastError, nullptr);
#ifdef RAILSHARD_TEST_HAS_NCCL_H
  EXPECT_EQ(api->version(), NCCL_VERSION_CODE);
#endif

  // Through RAILSHARD_NCCL_LIBRARY and get() (cached per path).
  ScopedLibrary library(kToolkitNccl);
  const NcclApi* cached = NcclApi::get();
  ASSERT_NE(cached, nullptr) << NcclApi::unavailableReason();
  EXPECT_EQ(cached, NcclApi::get());
  EXPECT_EQ(cached->version(), api->version());
}

TEST(NcclApi, ErrorsQuoteNcclsText) {
  if (!exists(kToolkitNccl)) GTEST_SKIP() << kToolkitNccl << " is not installed";
  std::string why;
  const auto api = NcclApi::load(kToolkitNccl, why);
  ASSERT_NE(api, nullptr) << why;
  EXPECT_NO_THROW(api->check(nccl::kSuccess, "ncclAllReduce"));
  EXPECT_NO_THROW(api->check(nccl::kInProgress, "ncclAllReduce"));  // non-blocking: not an error
  const nccl::Result invalid_argument = 4;                          // ncclInvalidArgument
  try {
    api->check(invalid_argument, "ncclAllReduce");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("ncclAllReduce failed: ", 0), 0u) << message;
    EXPECT_NE(message.find(api->getErrorString(invalid_argument)), std::string::npos) << message;
    EXPECT_NE(message.find(" ("), std::string::npos) << message;  // the last-error detail
  }
}

}  // namespace
}  // namespace railshard::collectives
