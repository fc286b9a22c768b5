#include "python/csrc/tensor_staging.h"

#include <sstream>

#include "core/base/error.h"

namespace railshard::python {

std::optional<DataType> nativeType(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return DataType::kFloat32;
    case at::kDouble:
      return DataType::kFloat64;
    case at::kHalf:
      return DataType::kFloat16;
    case at::kBFloat16:
      return DataType::kBFloat16;
    case at::kInt:
      return DataType::kInt32;
    case at::kLong:
      return DataType::kInt64;
    case at::kByte:
      return DataType::kUInt8;
    default:
      return std::nullopt;
  }
}

at::ScalarType wireType(at::ScalarType type, const char* collective) {
  if (nativeType(type)) return type;
  switch (type) {
    case at::kChar:
    case at::kShort:
    case at::kBool:
      return at::kInt;
    default:
      throw InvalidArgument(std::string("railshard ") + collective + ": dtype " +
                            c10::toString(type) +
                            " is not supported (float16/32/64, bfloat16, uint8, int8/16/32/64 "
                            "and bool are)");
  }
}

ReduceOp reduceOpFor(const c10d::ReduceOp& op, at::ScalarType type, const char* collective) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return ReduceOp::kSum;
    case c10d::ReduceOp::PRODUCT:
      return ReduceOp::kProd;
    case c10d::ReduceOp::MIN:
      return ReduceOp::kMin;
    case c10d::ReduceOp::MAX:
      return ReduceOp::kMax;
    case c10d::ReduceOp::AVG:
      if (type == at::kBool) {
        throw InvalidArgument(std::string("railshard ") + collective +
                              ": ReduceOp.AVG of a bool tensor has no meaning");
      }
      return ReduceOp::kAvg;
    default:
      break;
  }
  static const char* const kNames[] = {"SUM",  "AVG", "PRODUCT", "MIN",        "MAX",
                                       "BAND", "BOR", "BXOR",    "PREMUL_SUM", "UNUSED"};
  const auto index = static_cast<size_t>(op.op_);
  throw InvalidArgument(std::string("railshard ") + collective + ": ReduceOp." +
                        (index < 10 ? kNames[index] : "?") +
                        " is not supported (SUM, AVG, PRODUCT, MIN and MAX are)");
}

Staged::Staged(const at::Tensor& tensor, const char* collective, bool copy_in) : original_(tensor) {
  const at::ScalarType wire = wireType(tensor.scalar_type(), collective);
  dtype_ = *nativeType(wire);
  if (tensor.device().is_cpu() && tensor.is_contiguous() && wire == tensor.scalar_type()) {
    buffer_ = tensor;
    return;
  }
  staged_ = true;
  if (copy_in) {
    buffer_ = tensor.to(at::kCPU, wire, /*non_blocking=*/false, /*copy=*/true).contiguous();
  } else {
    buffer_ = at::empty(tensor.sizes(), at::TensorOptions().dtype(wire).device(at::kCPU));
  }
}

void Staged::finish() {
  if (staged_) original_.copy_(buffer_);
}

std::string describe(const at::Tensor& tensor) {
  std::ostringstream out;
  out << c10::toString(tensor.scalar_type()) << tensor.sizes() << " on " << tensor.device();
  return out.str();
}

}  // namespace railshard::python
