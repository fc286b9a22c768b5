#pragma once

#include <chrono>

#include "python/csrc/torch_compat.h"

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace railshard::python {

// torch 2.x wraps a backend in a ProcessGroup it names after the backend's type, and a backend
// registered from outside torch has type CUSTOM: DDP's logging and anything else that asks the
// group for its backend name then says "custom". The creator hands torch this ProcessGroup
// instead, with the railshard backend set for the CPU (and CUDA when `cuda`) and its own name.
// torch skips its TORCH_DISTRIBUTED_DEBUG=DETAIL wrapper for a group a creator returns, so the
// package only does this outside DETAIL (python/railshard/__init__.py).
// The same around a backend made elsewhere (ElasticGroup's); `store` is what the
// ProcessGroup keeps (nothing of railshard's uses it).
c10::intrusive_ptr<c10d::ProcessGroup> nameGroup(const c10::intrusive_ptr<c10d::Backend>& backend,
                                                 const c10::intrusive_ptr<c10d::Store>& store,
                                                 bool cuda);

c10::intrusive_ptr<c10d::ProcessGroup> createNamedGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout, bool cuda);

}  // namespace railshard::python
#endif
