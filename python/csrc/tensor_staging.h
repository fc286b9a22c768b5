#pragma once

#include <chrono>
#include <optional>
#include <string>

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "base/types.h"
#include "core/communicator.h"
#include "python/csrc/torch_compat.h"

namespace railshard::python {

// The railshard element type for a torch dtype, when the kernels have one.
std::optional<DataType> nativeType(at::ScalarType type);

// The dtype a tensor travels as: itself when native, else a wider one with the same
// reduction results after narrowing back (int8/int16/bool as int32: sums and products wrap
// modulo 2^8/2^16 either way, min/max are exact, and a bool is "any nonzero"). Throws
// InvalidArgument for dtypes with no such stand-in (complex, float8, ...).
at::ScalarType wireType(at::ScalarType type, const char* collective);

// The railshard ReduceOp for a c10d one; InvalidArgument naming the op otherwise (BAND, BOR,
// BXOR, PREMUL_SUM). AVG of a bool has no meaning and is refused too.
ReduceOp reduceOpFor(const c10d::ReduceOp& op, at::ScalarType type, const char* collective);

// A buffer railshard can read and write for `tensor`:
//  - the tensor itself when it is a contiguous CPU tensor of a native dtype;
//  - the tensor itself when it is a contiguous CUDA tensor of a native dtype and this
//    librailshard has CUDA with a usable device (device_ok): the collective then runs on
//    device memory (docs/gpu.md). An event recorded on the tensor's current stream at
//    construction (the caller's thread) orders it after the work that produced the tensor:
//    ready() waits for it on the worker thread, finish() waits for the collective's device
//    work, so the Work completes with the result in place (as ProcessGroupGloo's CUDA path
//    does, the tensor must not be modified before the Work completes);
//  - else a contiguous CPU copy in its wire type, written back by finish().
class Staged {
 public:
  Staged(const at::Tensor& tensor, const char* collective, bool copy_in = true,
         bool device_ok = true);
  void* data() { return buffer_.data_ptr(); }
  size_t count() const { return static_cast<size_t>(buffer_.numel()); }
  DataType dtype() const { return dtype_; }
  at::Tensor& buffer() { return buffer_; }
  bool staged() const { return staged_; }
  bool onDevice() const { return ready_.has_value(); }
  // Where the buffer lives, for Communicator calls.
  Communicator::Placement placement() const;
  // Waits (on the calling thread) until the tensor's producers are done, at most `timeout`
  // (TimeoutError); no-op on the host.
  void ready(std::chrono::milliseconds timeout);
  // Copies the result back when the buffer is a stand-in; for device memory waits (bounded
  // by `timeout`, through `comm`) for the collective's device work, so that the Work completes
  // with the result in place.
  void finish(Communicator* comm = nullptr,
              std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));

 private:
  at::Tensor original_;
  at::Tensor buffer_;
  DataType dtype_;
  bool staged_ = false;
  std::optional<c10::Event> ready_;  // set for device buffers
  int device_ = -1;                  // their CUDA device
};

// Whether CUDA tensors can be reduced in place on the device by this build of librailshard
// (CUDA compiled in and a device visible to it).
bool deviceCollectivesAvailable();

// InvalidArgument unless `tensors` holds exactly one tensor (`collective` names the call).
// Complex tensors as their real views (torch.view_as_real: the same memory, a trailing
// dimension of 2), which every collective moves and SUM/AVG reduce componentwise. Fills
// `real` with `tensors`, complex ones replaced, and returns whether any was complex;
// InvalidArgument when `op` (for reductions) is not SUM or AVG and a tensor is complex.
bool realViews(const std::vector<at::Tensor>& tensors, std::vector<at::Tensor>& real,
               const std::optional<c10d::ReduceOp>& op, const char* collective);

void checkOne(const std::vector<at::Tensor>& tensors, const char* collective);

// A contiguous CPU tensor of `tensors` end to end, in their wire type (`collective` names the
// call in the error for a dtype without one).
at::Tensor flattenTensors(const std::vector<at::Tensor>& tensors, const char* collective);
// Copies consecutive blocks of `flat` back into `tensors` (their shapes and dtypes).
void unflattenTensors(const at::Tensor& flat, std::vector<at::Tensor>& tensors);

// "float32[1000] on cpu" for error messages.
std::string describe(const at::Tensor& tensor);

}  // namespace railshard::python
