#pragma once

#include <cstddef>
#include <cstdint>

namespace railshard::transport::links::shm {

// Linux cross-memory attach: copies `bytes` from `address` in process `pid` into `out`, in
// one copy by the kernel (process_vm_readv), however many calls a partial read takes.
// PeerLostError when the process is gone, Error naming errno otherwise (EPERM: ptrace
// permission -- Yama's ptrace_scope, a container's seccomp profile; EFAULT: the range is not
// mapped there).
void readFromProcess(int pid, uint64_t address, void* out, size_t bytes);

// Whether this process may read process `pid`'s memory: reads 8 bytes at `address` and
// compares them with `expect`. Never throws.
bool canReadProcess(int pid, uint64_t address, uint64_t expect);

}  // namespace railshard::transport::links::shm
