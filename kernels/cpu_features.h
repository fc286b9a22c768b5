#pragma once

#include <optional>
#include <string>
#include <string_view>

// What the CPU (and the OS, which must save the wide registers on a context switch) lets the
// reduction kernels use. Detected once with CPUID and XGETBV; the kernels pick an instruction
// set from it (see reduce.h: activeIsa, RAILSHARD_KERNEL_ISA).
namespace railshard::kernels {

// The instruction sets the reduction kernels are compiled for, slowest first.
enum class Isa : unsigned char {
  kPortable = 0,  // plain C++ loops (whatever the compiler's baseline target vectorises)
  kAvx2 = 1,      // AVX2 + FMA + F16C, 256-bit
  kAvx512 = 2,    // AVX-512 F/BW/VL (+ BF16 conversions when present), 512-bit
};
inline constexpr int kNumIsas = 3;

struct CpuFeatures {
  bool avx2 = false;  // each flag is true only if the OS also enabled the register state
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512bf16 = false;
  bool avx512fp16 = false;
};

// Detected on first call (CPUID/XGETBV on x86-64; all false elsewhere).
const CpuFeatures& cpuFeatures();

// True if this build contains `isa`'s kernels and `features` can run them.
bool canRun(Isa isa, const CpuFeatures& features = cpuFeatures());
// The fastest instruction set canRun() accepts.
Isa bestIsa(const CpuFeatures& features = cpuFeatures());

std::string_view name(Isa isa);
// "portable", "avx2", "avx512" (case-insensitive); nullopt for anything else, "auto" included.
std::optional<Isa> parseIsa(std::string_view text);
// "portable, avx2" — the names canRun() accepts, for error messages.
std::string runnableIsas(const CpuFeatures& features = cpuFeatures());
// "avx2 fma f16c" — the detected flags, for error messages and logs.
std::string describe(const CpuFeatures& features);

}  // namespace railshard::kernels
