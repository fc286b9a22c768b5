#include "kernels/cpu_features.h"

#include <array>
#include <cstdint>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define RAILSHARD_KERNELS_X86 1
#endif

namespace railshard::kernels {
namespace {

constexpr std::array<std::string_view, kNumIsas> kIsaNames{"portable", "avx2", "avx512"};

#ifdef RAILSHARD_KERNELS_X86
// XGETBV without -mxsave on this file: the instruction is only executed after CPUID said the
// OS enabled XSAVE (OSXSAVE), so compiling this file for the baseline target stays correct.
uint64_t readXcr0() {
  uint32_t eax = 0;
  uint32_t edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  const bool osxsave = (ecx >> 27) & 1u;
  const bool avx = (ecx >> 28) & 1u;
  const bool fma = (ecx >> 12) & 1u;
  const bool f16c = (ecx >> 29) & 1u;
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = readXcr0();
  // The CPU having AVX is not enough: the OS must save YMM (bits 1-2) and, for AVX-512, the
  // opmask and both ZMM halves (bits 5-7), or the registers are silently lost on a switch.
  const bool os_ymm = (xcr0 & 0x6u) == 0x6u;
  const bool os_zmm = os_ymm && (xcr0 & 0xe0u) == 0xe0u;
  if (!os_ymm) return f;
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf < 7) return f;
  unsigned b7 = 0, c7 = 0, d7 = 0, a7 = 0;
  __cpuid_count(7, 0, a7, b7, c7, d7);
  const unsigned max_subleaf = a7;
  f.fma = fma;
  f.f16c = f16c;
  f.avx2 = (b7 >> 5) & 1u;
  if (os_zmm) {
    f.avx512f = (b7 >> 16) & 1u;
    f.avx512dq = (b7 >> 17) & 1u;
    f.avx512bw = (b7 >> 30) & 1u;
    f.avx512vl = (b7 >> 31) & 1u;
    f.avx512fp16 = (d7 >> 23) & 1u;
    if (max_subleaf >= 1) {
      unsigned a71 = 0, b71 = 0, c71 = 0, d71 = 0;
      __cpuid_count(7, 1, a71, b71, c71, d71);
      f.avx512bf16 = (a71 >> 5) & 1u;
    }
  }
  return f;
}
#else
CpuFeatures detect() {
  return {};
}
#endif

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return out;
}

}  // namespace

const CpuFeatures& cpuFeatures() {
  static const CpuFeatures features = detect();
  return features;
}

bool canRun(Isa isa, const CpuFeatures& f) {
  switch (isa) {
    case Isa::kPortable:
      return true;
    case Isa::kAvx2:
#ifdef RAILSHARD_KERNELS_HAVE_AVX2
      return f.avx2 && f.fma && f.f16c;
#else
      return false;
#endif
    case Isa::kAvx512:
#ifdef RAILSHARD_KERNELS_HAVE_AVX512
      // F16C is implied by every AVX-512 CPU, and the f16 kernels use AVX-512F's own
      // vcvtph2ps/vcvtps2ph, so avx512fp16 is not needed.
      return f.avx512f && f.avx512bw && f.avx512vl;
#else
      return false;
#endif
  }
  return false;
}

Isa bestIsa(const CpuFeatures& features) {
  for (int i = kNumIsas - 1; i > 0; --i) {
    if (canRun(static_cast<Isa>(i), features)) return static_cast<Isa>(i);
  }
  return Isa::kPortable;
}

std::string_view name(Isa isa) {
  const auto index = static_cast<size_t>(isa);
  return index < kIsaNames.size() ? kIsaNames[index] : std::string_view("unknown");
}

std::optional<Isa> parseIsa(std::string_view text) {
  const std::string wanted = lower(text);
  for (size_t i = 0; i < kIsaNames.size(); ++i) {
    if (wanted == kIsaNames[i]) return static_cast<Isa>(i);
  }
  return std::nullopt;
}

std::string runnableIsas(const CpuFeatures& features) {
  std::string out;
  for (int i = 0; i < kNumIsas; ++i) {
    if (!canRun(static_cast<Isa>(i), features)) continue;
    if (!out.empty()) out += ", ";
    out += kIsaNames[static_cast<size_t>(i)];
  }
  return out;
}

std::string describe(const CpuFeatures& f) {
  const std::pair<bool, const char*> flags[] = {
      {f.avx2, "avx2"},
      {f.fma, "fma"},
      {f.f16c, "f16c"},
      {f.avx512f, "avx512f"},
      {f.avx512bw, "avx512bw"},
      {f.avx512vl, "avx512vl"},
      {f.avx512dq, "avx512dq"},
      {f.avx512bf16, "avx512_bf16"},
      {f.avx512fp16, "avx512_fp16"},
  };
  std::string out;
  for (const auto& [present, flag] : flags) {
    if (!present) continue;
    if (!out.empty()) out += ' ';
    out += flag;
  }
  return out.empty() ? std::string("none of avx2/avx512") : out;
}

}  // namespace railshard::kernels
