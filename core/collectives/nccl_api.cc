#include "core/collectives/nccl_api.h"

#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "base/error.h"

namespace railshard::collectives {

namespace nccl {

// Values from nccl.h (ncclDataType_t, ncclRedOp_t).
DataTypeValue dataType(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return 7;  // ncclFloat32
    case DataType::kFloat64:
      return 8;  // ncclFloat64
    case DataType::kFloat16:
      return 6;  // ncclFloat16
    case DataType::kBFloat16:
      return 9;  // ncclBfloat16
    case DataType::kInt32:
      return 2;  // ncclInt32
    case DataType::kInt64:
      return 4;  // ncclInt64
    case DataType::kUInt8:
      return 1;  // ncclUint8
  }
  throw InvalidArgument("no NCCL datatype for dtype " + std::to_string(static_cast<int>(dtype)));
}

RedOpValue redOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return 0;  // ncclSum
    case ReduceOp::kProd:
      return 1;  // ncclProd
    case ReduceOp::kMax:
      return 2;  // ncclMax
    case ReduceOp::kMin:
      return 3;  // ncclMin
    case ReduceOp::kAvg:
      return 4;  // ncclAvg
  }
  throw InvalidArgument("no NCCL op for op " + std::to_string(static_cast<int>(op)));
}

}  // namespace nccl

namespace {

// The ncclConfig_t of NCCL 2.14 (its first version), up to `blocking` plus the next field so
// the struct has no padding NCCL would copy. NCCL copies `size` bytes over its defaults and
// resets every field newer than `version`, so this prefix is valid for any NCCL >= 2.14 and
// leaves all other settings at their defaults (and NCCL_* environment overrides).
struct ConfigV2_14 {
  size_t size = sizeof(ConfigV2_14);
  unsigned magic = 0xcafebeef;
  unsigned version = 21400;  // NCCL_VERSION(2, 14, 0)
  int blocking = 0;
  int cga_cluster_size = INT_MIN;  // NCCL_CONFIG_UNDEF_INT
};

template <typename Fn>
bool resolve(void* handle, const std::string& path, const char* name, Fn& slot, std::string& why) {
  slot = reinterpret_cast<Fn>(::dlsym(handle, name));
  if (slot == nullptr && why.empty()) why = path + " has no " + name;
  return slot != nullptr;
}

template <typename Fn>
void resolveOptional(void* handle, const char* name, Fn& slot) {
  slot = reinterpret_cast<Fn>(::dlsym(handle, name));
}

struct Cached {
  std::unique_ptr<NcclApi> api;
  std::string why;
};

const Cached& cached() {
  // Per path, so that a process (a test) may point RAILSHARD_NCCL_LIBRARY elsewhere later.
  // Never destroyed: HierarchicalAllreduce objects hold references into it and may be torn
  // down by other static destructors at exit.
  static auto* mutex_ptr = new std::mutex;
  static auto* libraries_ptr = new std::map<std::string, Cached>;
  std::mutex& mutex = *mutex_ptr;
  std::map<std::string, Cached>& libraries = *libraries_ptr;
  const std::string path = NcclApi::libraryPath();
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, inserted] = libraries.try_emplace(path);
  if (inserted) it->second.api = NcclApi::load(path, it->second.why);
  return it->second;
}

}  // namespace

std::string NcclApi::libraryPath() {
  const char* path = std::getenv("RAILSHARD_NCCL_LIBRARY");
  return path != nullptr && *path != '\0' ? path : "libnccl.so.2";
}

const NcclApi* NcclApi::get() {
  return cached().api.get();
}

std::string NcclApi::unavailableReason() {
  return cached().why;
}

std::unique_ptr<NcclApi> NcclApi::load(const std::string& path, std::string& why) {
  why.clear();
  // Never dlclose'd: NCCL keeps threads and communicators that outlive any handle we hold.
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = ::dlerror();
    why = "cannot load NCCL (RAILSHARD_NCCL_LIBRARY=" + path +
          "): " + (error != nullptr ? error : path);
    return nullptr;
  }
  auto api = std::make_unique<NcclApi>();
  NcclApi& a = *api;
  a.path_ = path;
  const bool ok = resolve(handle, path, "ncclGetVersion", a.getVersion, why) &&
                  resolve(handle, path, "ncclGetUniqueId", a.getUniqueId, why) &&
                  resolve(handle, path, "ncclCommInitRank", a.commInitRank, why) &&
                  resolve(handle, path, "ncclCommDestroy", a.commDestroy, why) &&
                  resolve(handle, path, "ncclCommAbort", a.commAbort, why) &&
                  resolve(handle, path, "ncclCommGetAsyncError", a.commGetAsyncError, why) &&
                  resolve(handle, path, "ncclGetErrorString", a.getErrorString, why) &&
                  resolve(handle, path, "ncclGroupStart", a.groupStart, why) &&
                  resolve(handle, path, "ncclGroupEnd", a.groupEnd, why) &&
                  resolve(handle, path, "ncclReduce", a.reduce, why) &&
                  resolve(handle, path, "ncclBroadcast", a.broadcast, why) &&
                  resolve(handle, path, "ncclReduceScatter", a.reduceScatter, why) &&
                  resolve(handle, path, "ncclAllGather", a.allGather, why) &&
                  resolve(handle, path, "ncclAllReduce", a.allReduce, why);
  if (!ok) return nullptr;
  resolveOptional(handle, "ncclCommInitRankConfig", a.commInitRankConfig);
  resolveOptional(handle, "ncclGetLastError", a.getLastError);
  if (a.getVersion(&a.version_) != nccl::kSuccess) {
    why = path + ": ncclGetVersion failed";
    return nullptr;
  }
  if (a.version_ < nccl::kMinVersion) {
    why = path + " is NCCL " + a.versionString() + "; railshard needs 2.10 or newer (ncclAvg)";
    return nullptr;
  }
  return api;
}

std::string NcclApi::versionString() const {
  // NCCL_VERSION(X, Y, Z): X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z from 2.9.
  const int major = version_ >= 10000 ? version_ / 10000 : version_ / 1000;
  const int rest = version_ >= 10000 ? version_ % 10000 : version_ % 1000;
  return std::to_string(major) + "." + std::to_string(rest / 100) + "." +
         std::to_string(rest % 100);
}

std::string NcclApi::errorText(nccl::Result result, nccl::Comm comm) const {
  const char* text = getErrorString != nullptr ? getErrorString(result) : nullptr;
  std::string message = text != nullptr ? text : "NCCL error " + std::to_string(result);
  const char* last = getLastError != nullptr ? getLastError(comm) : nullptr;
  message += " (" + std::string(last != nullptr && *last != '\0' ? last : "no detail") + ")";
  return message;
}

void NcclApi::check(nccl::Result result, const char* call, nccl::Comm comm) const {
  if (result == nccl::kSuccess || result == nccl::kInProgress) return;
  throw Error(std::string(call) + " failed: " + errorText(result, comm));
}

void NcclApi::checkAsync(nccl::Comm comm, const char* what) const {
  nccl::Result state = nccl::kSuccess;
  check(commGetAsyncError(comm, &state), "ncclCommGetAsyncError", comm);
  if (state != nccl::kSuccess && state != nccl::kInProgress) {
    throw Error(std::string(what) + ": NCCL asynchronous error: " + errorText(state, comm));
  }
}

void NcclApi::waitReady(nccl::Comm comm, Deadline deadline, const std::string& what) const {
  for (auto pause = std::chrono::microseconds(10);;) {
    nccl::Result state = nccl::kSuccess;
    check(commGetAsyncError(comm, &state), "ncclCommGetAsyncError", comm);
    if (state == nccl::kSuccess) return;
    if (state != nccl::kInProgress) {
      throw Error(what + ": NCCL asynchronous error: " + errorText(state, comm));
    }
    if (Clock::now() >= deadline) throw TimeoutError(what + ": NCCL still in progress");
    // Yield: ranks may share cores, and NCCL's own proxy threads need them.
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

nccl::Comm NcclApi::initRank(int nranks, const nccl::UniqueId& id, int rank, Deadline deadline,
                             const std::string& what) const {
  nccl::Comm comm = nullptr;
  if (commInitRankConfig == nullptr || version_ < 21400) {
    check(commInitRank(&comm, nranks, id, rank), "ncclCommInitRank");
    return comm;
  }
  ConfigV2_14 config;
  const nccl::Result result = commInitRankConfig(&comm, nranks, id, rank, &config);
  if (result != nccl::kSuccess && result != nccl::kInProgress) {
    if (comm != nullptr) commAbort(comm);
    check(result, "ncclCommInitRankConfig");
  }
  try {
    waitReady(comm, deadline,
              what + " (ncclCommInitRankConfig, " + std::to_string(nranks) + " ranks)");
  } catch (...) {
    commAbort(comm);  // frees what init built; no peer waits on a half-made comm forever
    throw;
  }
  return comm;
}

}  // namespace railshard::collectives
