#pragma once

// Test-side element access and reference arithmetic, written independently of kernels/ (f16
// through the compiler's _Float16, bf16 by explicit rounding) so a shared bug cannot hide.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "base/types.h"

namespace railshard::test {

inline float bf16Round(double value) {
  float f = static_cast<float>(value);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isnan(f)) return f;
  const uint32_t lsb = (bits >> 16) & 1u;
  bits = (bits + 0x7fffu + lsb) & 0xffff0000u;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline void storeValue(void* buffer, size_t i, DataType dtype, double value) {
  switch (dtype) {
    case DataType::kFloat32:
      static_cast<float*>(buffer)[i] = static_cast<float>(value);
      return;
    case DataType::kFloat64:
      static_cast<double*>(buffer)[i] = value;
      return;
    case DataType::kFloat16:
      static_cast<_Float16*>(buffer)[i] = static_cast<_Float16>(value);
      return;
    case DataType::kBFloat16: {
      const float f = bf16Round(value);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      static_cast<uint16_t*>(buffer)[i] = static_cast<uint16_t>(bits >> 16);
      return;
    }
    case DataType::kInt32:
      static_cast<int32_t*>(buffer)[i] = static_cast<int32_t>(value);
      return;
    case DataType::kInt64:
      static_cast<int64_t*>(buffer)[i] = static_cast<int64_t>(value);
      return;
    case DataType::kUInt8:
      static_cast<uint8_t*>(buffer)[i] = static_cast<uint8_t>(static_cast<int64_t>(value) & 0xff);
      return;
  }
}

inline double loadValue(const void* buffer, size_t i, DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return static_cast<const float*>(buffer)[i];
    case DataType::kFloat64:
      return static_cast<const double*>(buffer)[i];
    case DataType::kFloat16:
      return static_cast<double>(static_cast<const _Float16*>(buffer)[i]);
    case DataType::kBFloat16: {
      const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(buffer)[i]) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case DataType::kInt32:
      return static_cast<const int32_t*>(buffer)[i];
    case DataType::kInt64:
      return static_cast<double>(static_cast<const int64_t*>(buffer)[i]);
    case DataType::kUInt8:
      return static_cast<const uint8_t*>(buffer)[i];
  }
  return 0;
}

inline bool isFloat(DataType dtype) {
  return dtype == DataType::kFloat32 || dtype == DataType::kFloat64 ||
         dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
}

// Input of `rank` at element i for `op`: small integers, so every partial result of any
// reduction order is exact in every dtype (bf16 holds integers up to 256 exactly).
inline double inputValue(int rank, size_t i, DataType dtype, ReduceOp op) {
  const bool unsigned_type = dtype == DataType::kUInt8;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: {
      const double v = static_cast<double>((rank * 7 + i * 3) % 9);
      return unsigned_type ? v : v - 4;
    }
    case ReduceOp::kProd: {
      static const double kSigned[] = {1, -1, 2, 1};
      static const double kUnsigned[] = {1, 3, 2, 1};
      return (unsigned_type ? kUnsigned : kSigned)[(static_cast<size_t>(rank) + i) % 4];
    }
    case ReduceOp::kMin:
    case ReduceOp::kMax: {
      const double v = static_cast<double>((rank * 13 + i * 5) % 17);
      return unsigned_type ? v : v - 8;
    }
  }
  return 0;
}

// The reduction over ranks 0..size-1 of inputValue, as the dtype would hold it.
inline double expectedValue(int size, size_t i, DataType dtype, ReduceOp op) {
  double acc = inputValue(0, i, dtype, op);
  int64_t acc_u8 = static_cast<int64_t>(acc);
  for (int r = 1; r < size; ++r) {
    const double v = inputValue(r, i, dtype, op);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += v;
        acc_u8 = (acc_u8 + static_cast<int64_t>(v)) & 0xff;
        break;
      case ReduceOp::kProd:
        acc *= v;
        acc_u8 = (acc_u8 * static_cast<int64_t>(v)) & 0xff;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        acc_u8 = static_cast<int64_t>(acc);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        acc_u8 = static_cast<int64_t>(acc);
        break;
    }
  }
  if (dtype == DataType::kUInt8) acc = static_cast<double>(acc_u8);
  if (op == ReduceOp::kAvg) {
    if (isFloat(dtype)) {
      acc = acc / size;
    } else {
      acc = static_cast<double>(static_cast<int64_t>(acc) / size);  // truncates toward zero
    }
  }
  // Round as the dtype stores it.
  std::vector<uint8_t> cell(8);
  storeValue(cell.data(), 0, dtype, acc);
  return loadValue(cell.data(), 0, dtype);
}

}  // namespace railshard::test
