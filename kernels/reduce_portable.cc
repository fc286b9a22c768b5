// The portable kernels: plain C++ loops, compiled for the baseline target. They define the
// semantics every vectorised path must reproduce bit for bit (tests/kernels_test.cc checks).
#include <cstdint>
#include <type_traits>

#include "kernels/half.h"
#include "kernels/kernel_table.h"
#include "kernels/wrap_type.h"

namespace railshard::kernels::detail {
namespace {

struct Sum {
  template <typename T>
  static T apply(T x, T y) {
    return static_cast<T>(static_cast<Wrap<T>>(x) + static_cast<Wrap<T>>(y));
  }
};
struct Prod {
  template <typename T>
  static T apply(T x, T y) {
    return static_cast<T>(static_cast<Wrap<T>>(x) * static_cast<Wrap<T>>(y));
  }
};
// min/max return x unless y is strictly smaller (larger). So for floats a NaN in x is kept,
// a NaN in y is ignored, and min(+0, -0) is +0: exactly what x86 minps(y, x) / maxps(y, x)
// compute, which is how the vector paths reproduce it.
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

// Plain loops over restrict-free pointers: GCC vectorises these for the baseline target
// (SSE2 on x86-64) with a runtime alias check.
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

template <typename T>
void divideLoop(void* data, size_t count, size_t divisor) {
  auto* d = static_cast<T*>(data);
  if constexpr (std::is_integral_v<T>) {
    // In int64 (truncating toward zero): cast to T, a divisor of 256 would be 0 for uint8.
    // divide() rejects divisors above INT64_MAX.
    const auto div = static_cast<int64_t>(divisor);
    for (size_t i = 0; i < count; ++i) d[i] = static_cast<T>(static_cast<int64_t>(d[i]) / div);
  } else {
    const T div = static_cast<T>(divisor);
    for (size_t i = 0; i < count; ++i) d[i] = d[i] / div;
  }
}

template <uint16_t (*ToBits)(float), float (*FromBits)(uint16_t)>
void divideLoop16(void* data, size_t count, size_t divisor) {
  auto* d = static_cast<uint16_t*>(data);
  const float div = static_cast<float>(divisor);
  for (size_t i = 0; i < count; ++i) d[i] = ToBits(FromBits(d[i]) / div);
}

template <typename T>
void fillRow(KernelTable& table, DataType dtype) {
  auto& row = table.reduce[static_cast<int>(dtype)];
  row[kTableSum] = loop<T, Sum>;
  row[kTableProd] = loop<T, Prod>;
  row[kTableMin] = loop<T, Min>;
  row[kTableMax] = loop<T, Max>;
  table.divide[static_cast<int>(dtype)] = divideLoop<T>;
}

template <uint16_t (*ToBits)(float), float (*FromBits)(uint16_t)>
void fillRow16(KernelTable& table, DataType dtype) {
  auto& row = table.reduce[static_cast<int>(dtype)];
  row[kTableSum] = loop16<ToBits, FromBits, Sum>;
  row[kTableProd] = loop16<ToBits, FromBits, Prod>;
  row[kTableMin] = loop16<ToBits, FromBits, Min>;
  row[kTableMax] = loop16<ToBits, FromBits, Max>;
  table.divide[static_cast<int>(dtype)] = divideLoop16<ToBits, FromBits>;
}

KernelTable makeTable() {
  KernelTable table{};
  table.name = "portable";
  fillRow<float>(table, DataType::kFloat32);
  fillRow<double>(table, DataType::kFloat64);
  fillRow16<floatToHalf, halfToFloat>(table, DataType::kFloat16);
  fillRow16<floatToBf16, bf16ToFloat>(table, DataType::kBFloat16);
  fillRow<int32_t>(table, DataType::kInt32);
  fillRow<int64_t>(table, DataType::kInt64);
  fillRow<uint8_t>(table, DataType::kUInt8);
  return table;
}

}  // namespace

const KernelTable& portableKernels() {
  static const KernelTable table = makeTable();
  return table;
}

}  // namespace railshard::kernels::detail
