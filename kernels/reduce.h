#pragma once

#include <cstddef>
#include <string_view>

#include "base/types.h"
#include "kernels/cpu_features.h"

namespace railshard::kernels {

// dst[i] = a[i] op b[i] for i < count. dst may alias a or b (in-place accumulation); other
// overlaps are undefined. kAvg reduces as kSum: the caller divides once at the end
// (divide()), so that avg is exactly sum/n however many steps the algorithm takes.
// f16/bf16 are computed in f32 and rounded once (to nearest even) per call. Integers wrap.
// min/max keep a[i] unless b[i] is strictly smaller/larger: a NaN in a[i] is the result, a
// NaN in b[i] is ignored, and min(+0, -0) is a's zero.
// Every instruction set gives bit-identical results, except which NaN (payload and sign)
// comes out where an input is NaN or an operation makes one: NaN stays NaN.
// Pointers need no alignment. Throws ConfigError on the first call if RAILSHARD_KERNEL_ISA
// is invalid (see activeIsa).
void reduce(void* dst, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op);

// data[i] /= divisor (avg's final step). Integers divide truncating toward zero; floating
// types divide by the divisor converted to the element's compute type (f32 for f16/bf16).
void divide(void* data, size_t count, DataType dtype, size_t divisor);

// The instruction set reduce() and divide() run ("portable", "avx2" or "avx512"), chosen on
// first use of any of these functions from RAILSHARD_KERNEL_ISA (portable|avx2|avx512|auto;
// unset or empty means auto = the fastest this CPU runs). The environment is read once.
// Throws ConfigError if the value is unknown or names an instruction set this CPU cannot run.
std::string_view activeIsa();

// Makes every later reduce()/divide() use `isa`. Returns false, changing nothing, if this
// build or CPU cannot run it. native_bf16=false makes the AVX-512 path round bf16 with
// integer ops even on a CPU with avx512_bf16, so tests can cover both ways. For tests and
// benchmarks: switching while another thread is inside reduce() is safe but that call may
// use either path.
bool setIsaForTesting(Isa isa, bool native_bf16 = true);

// The instruction set a RAILSHARD_KERNEL_ISA value selects on a CPU with `features`
// (value nullptr = unset). Throws ConfigError naming the value and what the CPU can run.
Isa isaFromSetting(const char* value, const CpuFeatures& features = cpuFeatures());

}  // namespace railshard::kernels
