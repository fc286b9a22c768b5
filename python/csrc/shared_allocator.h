#pragma once

#include <cstddef>

#include "transport/links/shm/shared_pool.h"

namespace railshard::python {

// torch's CPU allocator, wrapped so that tensors of at least `min_bytes` come from shared
// regions (transport/links/shm/shared_pool.h) and smaller ones from the allocator it replaces
// (issue #45). Installed when a railshard group runs its collectives through shared memory
// with several ranks on this host (RAILSHARD_SHARED_ALLOC; 0 = never): DDP's gradient buckets,
// allocated after the group forms, then lie in memory the host's other ranks map once, and the
// one-host all-reduce reads them with plain loads (the single copy, shm_single_copy.cc) instead
// of staging every byte through the segment. Nothing in the user's program changes.
//
// Once installed it stays for the life of the process (tensors from it outlive any group); a
// later call with another size only changes the threshold. Where torch has another allocator
// of higher priority installed, nothing changes (logged). Where a region cannot be had (memfd
// limits), the tensor comes from the replaced allocator (logged once).
void installSharedAllocator(size_t min_bytes);
// True once installSharedAllocator took effect.
bool sharedAllocatorInstalled();
// The regions of this process's allocator (what is live, what is kept for reuse).
transport::links::shm::SharedPool::Stats sharedAllocatorStats();
// Releases the regions kept for reuse (as torch.cuda.empty_cache()).
void releaseSharedCache();
// Whether `address` is in a region the host's other ranks can map (for tests and users who
// want to check where a tensor lives).
bool isShared(const void* address, size_t bytes);

}  // namespace railshard::python
