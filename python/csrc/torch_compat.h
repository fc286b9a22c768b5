#pragma once

// One source for torch 1.13 (backends subclass c10d::ProcessGroup) and torch 2.x (backends
// subclass c10d::Backend, which torch wraps in a ProcessGroup itself). Work, the option structs
// and ReduceOp are the same in both.
#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace railshard::python {

#if TORCH_VERSION_MAJOR >= 2
using BackendBase = c10d::Backend;
#else
using BackendBase = c10d::ProcessGroup;
#endif

}  // namespace railshard::python
