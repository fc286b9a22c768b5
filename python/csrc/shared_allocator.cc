#include "python/csrc/shared_allocator.h"

#include <pthread.h>

#include <atomic>
#include <mutex>
#include <string>

#include <c10/core/Allocator.h>
#include <torch/version.h>

#include "base/error.h"
#include "base/log_line.h"
#include "transport/links/shm/shared_buffers.h"

// torch 2.3 made Allocator::allocate non-const and added the pure virtual copy_data.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define RAILSHARD_ALLOCATE_CONST
#define RAILSHARD_ALLOCATOR_COPY_DATA 1
#else
#define RAILSHARD_ALLOCATE_CONST const
#define RAILSHARD_ALLOCATOR_COPY_DATA 0
#endif

namespace railshard::python {
namespace {

using transport::links::shm::SharedPool;

// Never destroyed: torch frees tensors during interpreter shutdown, after static destructors
// would have run.
SharedPool& pool() {
  static SharedPool* instance = [] {
    auto* p = new SharedPool();
    ::pthread_atfork([] { pool().lockForFork(); }, [] { pool().unlockAfterFork(); },
                     [] { pool().unlockAfterFork(); });
    return p;
  }();
  return *instance;
}

std::atomic<size_t> g_min_bytes{0};
c10::Allocator* g_replaced = nullptr;  // set once, before the wrapper is installed
std::atomic<bool> g_installed{false};
std::atomic<bool> g_warned{false};

// Frees what either allocator handed out: raw_deallocate goes through one deleter.
void deleteAny(void* address) {
  if (address == nullptr) return;
  if (pool().owns(address)) {
    pool().give(address);
  } else {
    g_replaced->raw_deleter()(address);
  }
}

void deleteShared(void* address) {
  pool().give(address);
}

class SharedCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) RAILSHARD_ALLOCATE_CONST override {
    const size_t min_bytes = g_min_bytes.load(std::memory_order_relaxed);
    if (min_bytes > 0 && bytes >= min_bytes) {
      try {
        void* address = pool().take(bytes);
        return {address, address, &deleteShared, c10::Device(c10::DeviceType::CPU)};
      } catch (const Error& e) {
        if (!g_warned.exchange(true)) {
          log::line(LogLevel::kWarn, std::string("shared CPU allocator: ") + e.what() +
                                         "; this and later tensors that cannot have a shared "
                                         "region come from torch's allocator");
        }
      }
    }
    return g_replaced->allocate(bytes);
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return g_replaced->raw_deleter() != nullptr ? &deleteAny : nullptr;
  }

#if RAILSHARD_ALLOCATOR_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif
};

SharedCpuAllocator& wrapper() {
  static SharedCpuAllocator* instance = new SharedCpuAllocator();  // never destroyed, as pool()
  return *instance;
}

std::mutex& installMutex() {
  static std::mutex m;
  return m;
}

}  // namespace

void installSharedAllocator(size_t min_bytes) {
  const std::lock_guard<std::mutex> lock(installMutex());
  g_min_bytes.store(min_bytes);
  if (g_installed.load() || min_bytes == 0) return;
  c10::Allocator* current = c10::GetAllocator(c10::DeviceType::CPU);
  g_replaced = current;
  pool();  // its fork handlers from now on
  // Priority 0 is the default CPU allocator's: this replaces it, and not one that a library
  // installed with a higher priority on purpose.
  c10::SetAllocator(c10::DeviceType::CPU, &wrapper(), 0);
  if (c10::GetAllocator(c10::DeviceType::CPU) != &wrapper()) {
    log::line(LogLevel::kInfo,
              "shared CPU allocator not installed: torch's CPU allocator was replaced with a "
              "higher priority by something else; large all-reduces of ordinary tensors "
              "take the staged path");
    return;
  }
  g_installed.store(true);
  log::line(LogLevel::kInfo, "shared CPU allocator installed: CPU tensors of at least " +
                                 std::to_string(min_bytes) +
                                 " bytes come from memory this host's ranks map "
                                 "(RAILSHARD_SHARED_ALLOC=0 turns this off)");
}

bool sharedAllocatorInstalled() {
  return g_installed.load();
}

SharedPool::Stats sharedAllocatorStats() {
  return pool().stats();
}

void releaseSharedCache() {
  pool().releaseKept();
}

bool isShared(const void* address, size_t bytes) {
  return transport::links::shm::findShared(address, bytes).serial != 0;
}

}  // namespace railshard::python
