#include "transport/links/shm/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <random>

#include "base/error.h"
#include "base/logging.h"

namespace railshard::transport::links::shm {
namespace {

constexpr uint64_t kMagic = 0x5253484d53454731ULL;  // "RSHMSEG1"
// 3: message entries; 4: frames in them; 5: reserved per pair; 6: the abort's lost rank
constexpr uint32_t kVersion = 6;
constexpr size_t kPage = 4096;

// std::string("/") + name, spelled so that GCC 12 does not raise a false -Wrestrict.
std::string shmPath(const std::string& name) {
  std::string path;
  path.reserve(name.size() + 1);
  path.push_back('/');
  path.append(name);
  return path;
}

size_t roundUp(size_t value, size_t to) {
  return (value + to - 1) / to * to;
}

std::string errnoText() {
  return std::strerror(errno);
}

}  // namespace

size_t ShmSegment::controlBytes(int world_size) {
  const auto n = static_cast<size_t>(world_size);
  return roundUp(sizeof(SegmentHeader) + sizeof(RankControl) * n + n * n, kPage);
}

size_t ShmSegment::totalBytes(int world_size, size_t slot_bytes) {
  const auto n = static_cast<size_t>(world_size);
  return controlBytes(world_size) + n * 4 * roundUp(slot_bytes, kPage) +
         n * n * kMailEntries * sizeof(MailEntry);
}

size_t chooseSlotBytes(size_t requested, int world_size) {
  size_t slot = requested;
  // 1 MiB: measured against 256 KiB-8 MiB at 2 and 4 ranks on the 2-core machine, no size
  // was reliably faster (docs/benchmarks.md), and it keeps the segment small (4 MiB a rank).
  if (slot == 0) slot = size_t{1} << 20;
  struct statvfs info {};
  if (::statvfs("/dev/shm", &info) != 0) return slot;  // let create() report the problem
  // The message entries are reserved per pair when it first sends (512 KiB a pair), not here.
  const size_t available = static_cast<size_t>(info.f_bavail) * info.f_frsize;
  const size_t free_bytes = available;
  const size_t per_slot_total = static_cast<size_t>(world_size) * 4;
  while (slot > (size_t{64} << 10) && per_slot_total * slot > free_bytes / 2) slot /= 2;
  if (per_slot_total * slot > free_bytes) {
    throw Error("shared memory: /dev/shm has " + std::to_string(available >> 20) +
                " MiB free, too little for " + std::to_string(world_size) + " ranks");
  }
  return slot;
}

ShmSegment::ShmSegment(std::string name, int world_size, size_t slot_bytes, void* base,
                       size_t bytes)
    : name_(std::move(name)),
      world_size_(world_size),
      slot_bytes_(roundUp(slot_bytes, kPage)),
      base_(base),
      bytes_(bytes) {
  header_ = static_cast<SegmentHeader*>(base_);
  controls_ = reinterpret_cast<RankControl*>(static_cast<uint8_t*>(base_) + sizeof(SegmentHeader));
  pair_ready_ = reinterpret_cast<std::atomic<uint8_t>*>(controls_ + world_size);
  data_ = static_cast<uint8_t*>(base_) + controlBytes(world_size);
  mail_ = reinterpret_cast<MailEntry*>(data_ + static_cast<size_t>(world_size) * 4 * slot_bytes_);
}

ShmSegment::~ShmSegment() {
  if (linked_) unlink();
  ::munmap(base_, bytes_);
  if (fd_ >= 0) ::close(fd_);
}

std::string ShmSegment::reservePair(int a, int b) {
  if (pairReady(a, b)) return {};
  const size_t bytes = kMailEntries * sizeof(MailEntry);
  for (const auto& [from, to] : {std::pair{a, b}, std::pair{b, a}}) {
    const auto offset =
        reinterpret_cast<uint8_t*>(&mail(from, to, 0)) - static_cast<uint8_t*>(base_);
    const int rc = ::posix_fallocate(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes));
    if (rc != 0) {
      return "cannot reserve the " + std::to_string(2 * bytes >> 10) +
             " KiB of message entries between local ranks " + std::to_string(a) + " and " +
             std::to_string(b) + " in /dev/shm: " + std::strerror(rc);
    }
  }
  pair_ready_[pairIndex(a, b)].store(1, std::memory_order_release);
  return {};
}

uint8_t* ShmSegment::slot(int rank, uint32_t index) {
  return data_ + (static_cast<size_t>(rank) * 4 + index) * slot_bytes_;
}

std::string ShmSegment::makeName() {
  std::random_device device;
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "railshard-%d-%08x%08x", static_cast<int>(::getpid()),
                device(), device());
  return buffer;
}

std::unique_ptr<ShmSegment> ShmSegment::create(const std::string& name, int world_size,
                                               size_t slot_bytes) {
  removeStale();
  const size_t bytes = totalBytes(world_size, slot_bytes);
  const std::string path = shmPath(name);
  const int fd = ::shm_open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw Error("shared memory: shm_open(" + path + "): " + errnoText());
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const std::string reason = errnoText();
    ::close(fd);
    ::shm_unlink(path.c_str());
    throw Error("shared memory: cannot size " + path + " to " + std::to_string(bytes) +
                " bytes (is /dev/shm big enough?): " + reason);
  }
  // Reserve the pages now: tmpfs allocates lazily, and running out later would be a SIGBUS
  // in the middle of a collective instead of an error here. The message entries are left
  // out: each pair's are reserved when it first sends (reservePair).
  const size_t eager =
      controlBytes(world_size) + static_cast<size_t>(world_size) * 4 * roundUp(slot_bytes, kPage);
  const int reserve = ::posix_fallocate(fd, 0, static_cast<off_t>(eager));
  if (reserve != 0) {
    ::close(fd);
    ::shm_unlink(path.c_str());
    throw Error("shared memory: cannot reserve " + std::to_string(bytes >> 20) +
                " MiB in /dev/shm: " + std::strerror(reserve));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    ::close(fd);
    ::shm_unlink(path.c_str());
    throw Error("shared memory: mmap of " + path + ": " + errnoText());
  }
  std::unique_ptr<ShmSegment> segment(new ShmSegment(name, world_size, slot_bytes, base, bytes));
  segment->fd_ = fd;
  segment->linked_ = true;
  // Fresh pages are zero; construct the atomics in place explicitly anyway.
  auto* header = new (base) SegmentHeader();
  header->version = kVersion;
  header->world_size = static_cast<uint32_t>(world_size);
  header->slot_bytes = segment->slot_bytes_;
  for (int r = 0; r < world_size; ++r) new (&segment->controls_[r]) RankControl();
  // The pairs' flags and entries are left as the zero pages they are: constructing every
  // entry here would touch (and so allocate) a page of each.
  std::atomic_thread_fence(std::memory_order_release);
  header->magic = kMagic;
  return segment;
}

std::unique_ptr<ShmSegment> ShmSegment::attach(const std::string& name, int world_size,
                                               size_t slot_bytes) {
  const size_t bytes = totalBytes(world_size, slot_bytes);
  const std::string path = shmPath(name);
  const int fd = ::shm_open(path.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw Error("shared memory: cannot open " + path + ": " + errnoText());
  struct stat info {};
  if (::fstat(fd, &info) != 0 || static_cast<size_t>(info.st_size) != bytes) {
    ::close(fd);
    throw Error("shared memory: " + path + " has " + std::to_string(info.st_size) +
                " bytes, expected " + std::to_string(bytes) +
                " (ranks disagree on world size or RAILSHARD_SHM_SLOT_BYTES?)");
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    ::close(fd);
    throw Error("shared memory: mmap of " + path + ": " + errnoText());
  }
  std::unique_ptr<ShmSegment> segment(new ShmSegment(name, world_size, slot_bytes, base, bytes));
  segment->fd_ = fd;
  const auto& header = segment->header();
  if (header.magic != kMagic || header.version != kVersion ||
      header.world_size != static_cast<uint32_t>(world_size)) {
    throw Error("shared memory: " + path + " is not a railshard segment for " +
                std::to_string(world_size) + " ranks");
  }
  return segment;
}

void ShmSegment::unlink() {
  if (!linked_) return;
  ::shm_unlink(shmPath(name_).c_str());
  linked_ = false;
}

int ShmSegment::removeStale() {
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  while (dirent* entry = ::readdir(dir)) {
    int pid = 0;
    if (std::sscanf(entry->d_name, "railshard-%d-", &pid) != 1 || pid <= 0) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // creator alive (or not ours to judge)
    if (::shm_unlink(shmPath(entry->d_name).c_str()) == 0) {
      ++removed;
      RS_LOG_INFO("removed stale shared memory /dev/shm/{} (creator pid {} is gone)", entry->d_name,
                  pid);
    }
  }
  ::closedir(dir);
  return removed;
}

}  // namespace railshard::transport::links::shm
