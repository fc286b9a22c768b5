#pragma once

#include <cstddef>

namespace railshard::kernels {

// memcpy for the bulk copies of the collectives (into and out of shared memory). glibc
// copies large blocks with `rep movsb`, which on the AMD EPYC of the development machine ran
// 3-8x slower than a plain vector loop for these buffers (measured: shm all-reduce at 512 KiB
// went from 1.4 to 9.8 GB/s busbw with GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold
// raised); this one uses 32-byte vector loads and stores when the CPU has AVX2.
void copy(void* dst, const void* src, size_t bytes);
// The same with non-temporal stores, for destinations much larger than the caches that are
// not read again soon: no read-for-ownership of the destination, no eviction of what is
// cached. Ends with a store fence.
void streamCopy(void* dst, const void* src, size_t bytes);

}  // namespace railshard::kernels
