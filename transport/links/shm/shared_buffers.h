#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>

namespace railshard::transport::links::shm {

// Host memory that the other ranks of the host can map (issue #26's "buffers registered
// once", as NCCL's user buffer registration): each region is a memfd mapped MAP_SHARED. A
// collective whose buffers lie in such regions tells its peers (fd, serial, offset), and a
// peer maps the region once (pidfd_getfd) and from then on reads it with plain loads: no
// system call and no page pinning per collective, where process_vm_readv pays both every time.
//
// Where a region lives, as the peers need it. serial 0: not in a shared region.
struct SharedRef {
  uint32_t fd = 0;
  uint32_t serial = 0;  // unique per region in this process (fd numbers are reused)
  uint64_t offset = 0;  // of the buffer in the region
  uint64_t region_bytes = 0;
};

// A region of `bytes` (rounded up to pages), zeroed. Error (naming errno) when the memfd
// cannot be made or mapped; InvalidArgument for 0 bytes.
void* allocateShared(size_t bytes);
// Unmaps a region allocateShared returned (peers that mapped it keep their mapping, and the
// pages, until they drop it). InvalidArgument when `address` is not the start of one.
void releaseShared(void* address);
// The region holding all of [address, address + bytes), if one does.
SharedRef findShared(const void* address, size_t bytes);

// A rank's mappings of its peers' regions, by (pid, serial); at most kMaxMapped, the oldest
// dropped first.
class PeerMappings {
 public:
  PeerMappings() = default;
  ~PeerMappings();
  PeerMappings(const PeerMappings&) = delete;
  PeerMappings& operator=(const PeerMappings&) = delete;

  // The address of `ref`'s buffer in process `pid`, mapped here (read-only); nullptr when it
  // cannot be mapped (pidfd_getfd refused: ptrace permissions, an older kernel), and that is
  // remembered for the process so it is tried once.
  const uint8_t* map(int pid, const SharedRef& ref);

  static constexpr size_t kMaxMapped = 64;

 private:
  struct Mapping {
    void* base = nullptr;
    size_t bytes = 0;
    uint64_t used = 0;
  };
  std::map<std::pair<int, uint32_t>, Mapping> mapped_;
  std::map<int, bool> refused_;
  uint64_t uses_ = 0;
};

}  // namespace railshard::transport::links::shm
