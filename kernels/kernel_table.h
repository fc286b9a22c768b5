#pragma once

// Internal to kernels/: one table of function pointers per instruction set, so reduce() costs
// one indirect call after the choice is made. Each table lives in its own translation unit,
// compiled with that instruction set's target flags; nothing outside the table's functions
// may run code from those units on a CPU that lacks the instructions.
#include <cstddef>

#include "base/types.h"

namespace railshard::kernels::detail {

// dst[i] = a[i] op b[i], i < count.
using ReduceFn = void (*)(void* dst, const void* a, const void* b, size_t count);
// data[i] /= divisor, i < count.
using DivideFn = void (*)(void* data, size_t count, size_t divisor);

// Reduce ops the tables hold; kAvg reduces as kSum.
enum TableOp { kTableSum = 0, kTableProd = 1, kTableMin = 2, kTableMax = 3 };
inline constexpr int kNumTableOps = 4;

struct KernelTable {
  const char* name;
  ReduceFn reduce[kNumDataTypes][kNumTableOps];
  DivideFn divide[kNumDataTypes];
};

const KernelTable& portableKernels();
#ifdef RAILSHARD_KERNELS_HAVE_AVX2
const KernelTable& avx2Kernels();
#endif
#ifdef RAILSHARD_KERNELS_HAVE_AVX512
// native_bf16: round f32 -> bf16 with vcvtne2ps2bf16 (CPU has avx512_bf16), else integer ops.
const KernelTable& avx512Kernels(bool native_bf16);
#endif

}  // namespace railshard::kernels::detail
