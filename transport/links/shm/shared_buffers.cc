#include "transport/links/shm/shared_buffers.h"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>

#include "base/error.h"

namespace railshard::transport::links::shm {
namespace {

struct Region {
  size_t bytes;
  int fd;
  uint32_t serial;
  bool shared = true;  // false: a copy-on-write mapping a fork left this (child) process
};

// Regions of this process by start address.
struct Registry {
  std::mutex mutex;
  std::map<uintptr_t, Region> regions;
  uint32_t next_serial = 1;
};

// fork() copies the address space, but a MAP_SHARED region stays one memory: a child's
// writes (a DataLoader worker filling a batch into a reused tensor) would change the parent's
// tensors, and the host's ranks would read the child's bytes. So the child remaps every region
// it inherits MAP_PRIVATE from the same memfd: copy-on-write, as the rest of its memory. (One
// difference from a snapshot: a page the child has not written still shows what the parent
// writes later.) Those regions stop being shared (findShared ignores them); regions the child
// makes itself are shared as usual. The registry's lock is held across fork() so that the
// child never inherits it locked by a thread it does not have.
void lockForFork();
void unlockAfterFork();
void privatizeAfterFork();

Registry& registry() {
  static Registry* instance = [] {
    auto* r = new Registry();  // never destroyed: used until exit
    ::pthread_atfork(&lockForFork, &unlockAfterFork, &privatizeAfterFork);
    return r;
  }();
  return *instance;
}

void lockForFork() {
  registry().mutex.lock();
}

void unlockAfterFork() {
  registry().mutex.unlock();
}

void privatizeAfterFork() {
  Registry& r = registry();
  for (auto& [address, region] : r.regions) {
    if (!region.shared) continue;
    // Same address, same bytes (the page cache of the memfd), now copy-on-write; should the
    // remap fail the region stays shared memory, so it is at least never offered to peers.
    ::mmap(reinterpret_cast<void*>(address), region.bytes, PROT_READ | PROT_WRITE,
           MAP_PRIVATE | MAP_FIXED, region.fd, 0);
    region.shared = false;
  }
  r.mutex.unlock();
}

std::string errnoText() {
  return std::strerror(errno);
}

}  // namespace

void* allocateShared(size_t bytes) {
  if (bytes == 0) throw InvalidArgument("allocateShared: 0 bytes");
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t rounded = (bytes + page - 1) / page * page;
  const int fd = static_cast<int>(::syscall(SYS_memfd_create, "railshard-buffer", MFD_CLOEXEC));
  if (fd < 0) throw Error("allocateShared: memfd_create failed: " + errnoText());
  if (::ftruncate(fd, static_cast<off_t>(rounded)) != 0) {
    const std::string why = errnoText();
    ::close(fd);
    throw Error("allocateShared: cannot size a region of " + std::to_string(rounded) +
                " bytes: " + why);
  }
  void* base = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const std::string why = errnoText();
    ::close(fd);
    throw Error("allocateShared: cannot map " + std::to_string(rounded) + " bytes: " + why);
  }
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  r.regions[reinterpret_cast<uintptr_t>(base)] = Region{rounded, fd, r.next_serial++};
  if (r.next_serial == 0) r.next_serial = 1;
  return base;
}

void releaseShared(void* address) {
  Registry& r = registry();
  Region region{};
  {
    const std::lock_guard<std::mutex> lock(r.mutex);
    const auto it = r.regions.find(reinterpret_cast<uintptr_t>(address));
    if (it == r.regions.end()) {
      throw InvalidArgument(
          "releaseShared: " + std::to_string(reinterpret_cast<uintptr_t>(address)) +
          " is not a region allocateShared returned");
    }
    region = it->second;
    r.regions.erase(it);
  }
  ::munmap(address, region.bytes);
  ::close(region.fd);
}

SharedRef findShared(const void* address, size_t bytes) {
  Registry& r = registry();
  const auto at = reinterpret_cast<uintptr_t>(address);
  const std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.regions.upper_bound(at);
  if (it == r.regions.begin()) return {};
  --it;
  const uintptr_t begin = it->first;
  if (!it->second.shared || at < begin || at - begin > it->second.bytes ||
      bytes > it->second.bytes - (at - begin)) {
    return {};
  }
  SharedRef ref;
  ref.fd = static_cast<uint32_t>(it->second.fd);
  ref.serial = it->second.serial;
  ref.offset = at - begin;
  ref.region_bytes = it->second.bytes;
  return ref;
}

PeerMappings::~PeerMappings() {
  for (auto& [key, mapping] : mapped_) ::munmap(mapping.base, mapping.bytes);
}

const uint8_t* PeerMappings::map(int pid, const SharedRef& ref) {
  if (ref.serial == 0) return nullptr;
  const auto key = std::make_pair(pid, ref.serial);
  if (auto it = mapped_.find(key); it != mapped_.end() && it->second.bytes >= ref.region_bytes) {
    it->second.used = ++uses_;
    return static_cast<const uint8_t*>(it->second.base) + ref.offset;
  }
  if (refused_.count(pid) != 0) return nullptr;
  // A copy of the peer's memfd descriptor, then a mapping of it: needs the same permission as
  // process_vm_readv (PTRACE_MODE_ATTACH); kernels before 5.6 have no pidfd_getfd.
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  int fd = -1;
  if (pidfd >= 0) {
    fd = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, static_cast<int>(ref.fd), 0));
    ::close(pidfd);
  }
  struct stat info {};
  void* base = MAP_FAILED;
  if (fd >= 0 && ::fstat(fd, &info) == 0 &&
      static_cast<uint64_t>(info.st_size) >= ref.region_bytes) {
    base = ::mmap(nullptr, ref.region_bytes, PROT_READ, MAP_SHARED, fd, 0);
  }
  if (fd >= 0) ::close(fd);
  if (base == MAP_FAILED) {
    refused_[pid] = true;
    return nullptr;
  }
  if (mapped_.size() >= kMaxMapped) {
    auto oldest = mapped_.begin();
    for (auto it = mapped_.begin(); it != mapped_.end(); ++it) {
      if (it->second.used < oldest->second.used) oldest = it;
    }
    ::munmap(oldest->second.base, oldest->second.bytes);
    mapped_.erase(oldest);
  }
  if (auto it = mapped_.find(key); it != mapped_.end()) {
    ::munmap(it->second.base, it->second.bytes);  // mapped smaller before: replaced
  }
  mapped_[key] = Mapping{base, ref.region_bytes, ++uses_};
  return static_cast<const uint8_t*>(base) + ref.offset;
}

}  // namespace railshard::transport::links::shm
