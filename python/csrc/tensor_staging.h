#pragma once

#include <optional>
#include <string>

#include <ATen/ATen.h>

#include "core/base/types.h"
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

// A host buffer railshard can read and write for `tensor`: the tensor itself when it is a
// contiguous CPU tensor of a native dtype, else a contiguous CPU copy in its wire type
// (device tensors are staged through host memory: this backend moves bytes with host
// transports). finish() writes a staged result back into the original tensor.
class Staged {
 public:
  Staged(const at::Tensor& tensor, const char* collective, bool copy_in = true);
  void* data() { return buffer_.data_ptr(); }
  size_t count() const { return static_cast<size_t>(buffer_.numel()); }
  DataType dtype() const { return dtype_; }
  at::Tensor& buffer() { return buffer_; }
  bool staged() const { return staged_; }
  // Copies the result back when the buffer is a stand-in.
  void finish();

 private:
  at::Tensor original_;
  at::Tensor buffer_;
  DataType dtype_;
  bool staged_ = false;
};

// "float32[1000] on cpu" for error messages.
std::string describe(const at::Tensor& tensor);

}  // namespace railshard::python
