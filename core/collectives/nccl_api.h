#pragma once

// The NCCL calls railshard needs, loaded with dlopen so that librailshard has no link
// dependency on NCCL (as transport/cuda_driver.h does for libcuda): the library loads
// and runs its host and staging paths on machines without NCCL. The library is
// RAILSHARD_NCCL_LIBRARY when set, else "libnccl.so.2". Types and enum values are spelled out
// here (values from nccl.h, stable since NCCL 2.10) instead of including nccl.h;
// tests/nccl_api_test.cc checks them against nccl.h when it is on the include path.
//
// NEVER RUN ON A GPU here: the build machine has none; docs/gpu.md.
#include <cstddef>
#include <memory>
#include <string>

#include "base/clock.h"
#include "base/types.h"

namespace railshard::collectives {

namespace nccl {

using Result = int;             // ncclResult_t
using Comm = struct ncclComm*;  // ncclComm_t (opaque)
using Stream = void*;           // cudaStream_t
using DataTypeValue = int;      // ncclDataType_t
using RedOpValue = int;         // ncclRedOp_t
struct UniqueId {               // ncclUniqueId
  char internal[128];
};

inline constexpr Result kSuccess = 0;     // ncclSuccess
inline constexpr Result kInProgress = 7;  // ncclInProgress (non-blocking communicators)

// railshard's DataType / ReduceOp as NCCL's enum values. Every railshard dtype and op has an
// NCCL counterpart (bfloat16 and avg since NCCL 2.10, the oldest version NcclApi accepts).
// Note NCCL numbers max before min. Out-of-range values raise InvalidArgument.
DataTypeValue dataType(DataType dtype);
RedOpValue redOp(ReduceOp op);

// NCCL_VERSION(2, 10, 0): ncclAvg and ncclBfloat16.
inline constexpr int kMinVersion = 21000;

}  // namespace nccl

class NcclApi {
 public:
  // The library at libraryPath(), loaded once per path; null when it cannot be loaded, lacks
  // a required symbol or is older than NCCL 2.10 (unavailableReason() says which).
  static const NcclApi* get();
  static std::string unavailableReason();
  // RAILSHARD_NCCL_LIBRARY, else "libnccl.so.2".
  static std::string libraryPath();
  // Loads `path` afresh (tests, tools); null with `why` set on failure. The library stays
  // loaded for the life of the process: communicators may outlive any one NcclApi object.
  static std::unique_ptr<NcclApi> load(const std::string& path, std::string& why);

  const std::string& path() const { return path_; }
  int version() const { return version_; }  // ncclGetVersion: 22809 for 2.28.9
  std::string versionString() const;        // "2.28.9"

  // Throws railshard::Error "<call> failed: <ncclGetErrorString> (<ncclGetLastError>)" when
  // `result` is neither success nor in-progress. `comm` (may be null) names the communicator
  // whose last error to quote.
  void check(nccl::Result result, const char* call, nccl::Comm comm = nullptr) const;
  std::string errorText(nccl::Result result, nccl::Comm comm) const;

  // A communicator of `nranks` whose rank `rank` this process is, on the current CUDA device,
  // bounded by `deadline`: created non-blocking (ncclCommInitRankConfig, blocking = 0) and
  // polled with ncclCommGetAsyncError; past the deadline it is aborted and TimeoutError names
  // `what`. NCCL builds without ncclCommInitRankConfig (< 2.14) fall back to the blocking
  // ncclCommInitRank, bounded only by NCCL's own bootstrap timeout.
  nccl::Comm initRank(int nranks, const nccl::UniqueId& id, int rank, Deadline deadline,
                      const std::string& what) const;
  // Waits until `comm` has no operation in progress (non-blocking communicators return
  // ncclInProgress from ncclGroupEnd and friends); raises the communicator's asynchronous error
  // if it has one, TimeoutError naming `what` past `deadline` (the caller aborts the comm).
  void waitReady(nccl::Comm comm, Deadline deadline, const std::string& what) const;
  // Raises the communicator's asynchronous error (a peer failed, a kernel faulted), if any.
  void checkAsync(nccl::Comm comm, const char* what) const;

  // The library's functions, as loaded. Optional ones (added after 2.10) may be null.
  using Result = nccl::Result;
  using Comm = nccl::Comm;
  using Stream = nccl::Stream;
  Result (*getVersion)(int* version) = nullptr;
  Result (*getUniqueId)(nccl::UniqueId* id) = nullptr;
  Result (*commInitRank)(Comm* comm, int nranks, nccl::UniqueId id, int rank) = nullptr;
  Result (*commInitRankConfig)(Comm* comm, int nranks, nccl::UniqueId id, int rank,
                               void* config) = nullptr;  // optional (2.14)
  Result (*commDestroy)(Comm comm) = nullptr;
  Result (*commAbort)(Comm comm) = nullptr;
  Result (*commGetAsyncError)(Comm comm, Result* async_error) = nullptr;
  const char* (*getErrorString)(Result result) = nullptr;
  const char* (*getLastError)(Comm comm) = nullptr;  // optional (2.13)
  Result (*groupStart)() = nullptr;
  Result (*groupEnd)() = nullptr;
  Result (*reduce)(const void* send, void* recv, size_t count, int dtype, int op, int root,
                   Comm comm, Stream stream) = nullptr;
  Result (*broadcast)(const void* send, void* recv, size_t count, int dtype, int root, Comm comm,
                      Stream stream) = nullptr;
  Result (*reduceScatter)(const void* send, void* recv, size_t recv_count, int dtype, int op,
                          Comm comm, Stream stream) = nullptr;
  Result (*allGather)(const void* send, void* recv, size_t send_count, int dtype, Comm comm,
                      Stream stream) = nullptr;
  Result (*allReduce)(const void* send, void* recv, size_t count, int dtype, int op, Comm comm,
                      Stream stream) = nullptr;

 private:
  std::string path_;
  int version_ = 0;
};

}  // namespace railshard::collectives
