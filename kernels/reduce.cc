#include "kernels/reduce.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/base/error.h"
#include "kernels/half.h"

namespace railshard::kernels {
namespace {

struct Sum {
  template <typename T>
  static T apply(T x, T y) {
    return static_cast<T>(x + y);
  }
};
struct Prod {
  template <typename T>
  static T apply(T x, T y) {
    return static_cast<T>(x * y);
  }
};
struct Min {
  template <typename T>
  static T apply(T x, T y) {
    return y < x ? y : x;
  }
};
struct Max {
  template <typename T>
  static T apply(T x, T y) {
    return x < y ? y : x;
  }
};

// Plain loops over restrict-free pointers: GCC vectorises these at -O2/-O3 with a runtime
// alias check. (The hand-vectorised AVX-512/AVX2 paths are issue #3's.)
template <typename T, typename Op>
void loop(void* dst, const void* a, const void* b, size_t count) {
  auto* d = static_cast<T*>(dst);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < count; ++i) d[i] = Op::apply(x[i], y[i]);
}

template <uint16_t (*ToBits)(float), float (*FromBits)(uint16_t), typename Op>
void loop16(void* dst, const void* a, const void* b, size_t count) {
  auto* d = static_cast<uint16_t*>(dst);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < count; ++i) d[i] = ToBits(Op::apply(FromBits(x[i]), FromBits(y[i])));
}

template <typename Op>
void dispatchType(void* dst, const void* a, const void* b, size_t count, DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return loop<float, Op>(dst, a, b, count);
    case DataType::kFloat64:
      return loop<double, Op>(dst, a, b, count);
    case DataType::kFloat16:
      return loop16<floatToHalf, halfToFloat, Op>(dst, a, b, count);
    case DataType::kBFloat16:
      return loop16<floatToBf16, bf16ToFloat, Op>(dst, a, b, count);
    case DataType::kInt32:
      return loop<int32_t, Op>(dst, a, b, count);
    case DataType::kInt64:
      return loop<int64_t, Op>(dst, a, b, count);
    case DataType::kUInt8:
      return loop<uint8_t, Op>(dst, a, b, count);
  }
  throw InvalidArgument("reduce: invalid dtype " + std::to_string(static_cast<int>(dtype)));
}

template <typename T>
void divideLoop(void* data, size_t count, size_t divisor) {
  auto* d = static_cast<T*>(data);
  const T div = static_cast<T>(divisor);
  for (size_t i = 0; i < count; ++i) d[i] = static_cast<T>(d[i] / div);
}

template <uint16_t (*ToBits)(float), float (*FromBits)(uint16_t)>
void divideLoop16(void* data, size_t count, size_t divisor) {
  auto* d = static_cast<uint16_t*>(data);
  const float div = static_cast<float>(divisor);
  for (size_t i = 0; i < count; ++i) d[i] = ToBits(FromBits(d[i]) / div);
}

}  // namespace

void reduce(void* dst, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return dispatchType<Sum>(dst, a, b, count, dtype);
    case ReduceOp::kProd:
      return dispatchType<Prod>(dst, a, b, count, dtype);
    case ReduceOp::kMin:
      return dispatchType<Min>(dst, a, b, count, dtype);
    case ReduceOp::kMax:
      return dispatchType<Max>(dst, a, b, count, dtype);
  }
  throw InvalidArgument("reduce: invalid op " + std::to_string(static_cast<int>(op)));
}

void divide(void* data, size_t count, DataType dtype, size_t divisor) {
  if (divisor == 0) throw InvalidArgument("divide: divisor is 0");
  switch (dtype) {
    case DataType::kFloat32:
      return divideLoop<float>(data, count, divisor);
    case DataType::kFloat64:
      return divideLoop<double>(data, count, divisor);
    case DataType::kFloat16:
      return divideLoop16<floatToHalf, halfToFloat>(data, count, divisor);
    case DataType::kBFloat16:
      return divideLoop16<floatToBf16, bf16ToFloat>(data, count, divisor);
    case DataType::kInt32:
      return divideLoop<int32_t>(data, count, divisor);
    case DataType::kInt64:
      return divideLoop<int64_t>(data, count, divisor);
    case DataType::kUInt8:
      return divideLoop<uint8_t>(data, count, divisor);
  }
  throw InvalidArgument("divide: invalid dtype " + std::to_string(static_cast<int>(dtype)));
}

}  // namespace railshard::kernels
