// AVX-512 kernels (512-bit), compiled with -mavx512f -mavx512bw -mavx512vl -mavx512bf16;
// reached only through avx512Kernels() after cpu_features said the CPU and OS run them.
//
// NOT YET RUN ON HARDWARE in this repository: the development machine has no AVX-512, so
// this file is compiled and reviewed but its tests skip ("CPU lacks avx512f"). The first run
// on an AVX-512 machine must be `kernels_test` (compares every dtype x op bit for bit with
// the portable path).
//
// Bit-identical to reduce_portable.cc (NaN payloads aside), as in reduce_avx2.cc. Tails use
// masked loads and stores (faults on masked-off lanes are suppressed), so every block —
// full or partial — runs the same code.
//
// -mavx512bf16 is safe for the whole file: GCC emits BF16 instructions only for the
// intrinsics below, which run only when the CPU has avx512_bf16 (native_bf16). -mavx512fp16
// is deliberately absent: with it GCC may use FP16-only instructions (vmovw) for ordinary
// 16-bit moves, and the f16 kernels need only AVX-512F's vcvtph2ps/vcvtps2ph.
//
// Like reduce_avx2.cc: include nothing that defines non-static inline functions shared with
// other translation units (kernels/half.h included), or the linker could keep this file's
// AVX-512 copy for everyone.
// GCC 12.2's AVX-512 headers start many results from _mm512_undefined_*(), which trips
// -Wmaybe-uninitialized once inlined (GCC PR 105593, fixed in 12.3).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#include "kernels/kernel_table.h"

namespace railshard::kernels::detail {
namespace {

struct F32 {
  __m512 v;
};
// 32 f16/bf16 elements are widened into two f32 vectors, so the bf16 narrowing can use the
// two-source vcvtne2ps2bf16.
struct F32x2 {
  __m512 lo, hi;
};
struct F64 {
  __m512d v;
};
struct I32 {
  __m512i v;
};
struct I64 {
  __m512i v;
};
struct U8 {
  __m512i v;
};

// Masks carry one bit per lane; a codec takes the low kLanes bits.
inline uint64_t laneMask(size_t n) {
  return n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
}

struct Float32Codec {
  using Vec = F32;
  static constexpr size_t kLanes = 16, kBytes = 4;
  static Vec load(const unsigned char* p, uint64_t m) {
    return {_mm512_maskz_loadu_ps(static_cast<__mmask16>(m), p)};
  }
  static void store(unsigned char* p, Vec v, uint64_t m) {
    _mm512_mask_storeu_ps(p, static_cast<__mmask16>(m), v.v);
  }
  static Vec divisor(size_t n) { return {_mm512_set1_ps(static_cast<float>(n))}; }
};

struct Float64Codec {
  using Vec = F64;
  static constexpr size_t kLanes = 8, kBytes = 8;
  static Vec load(const unsigned char* p, uint64_t m) {
    return {_mm512_maskz_loadu_pd(static_cast<__mmask8>(m), p)};
  }
  static void store(unsigned char* p, Vec v, uint64_t m) {
    _mm512_mask_storeu_pd(p, static_cast<__mmask8>(m), v.v);
  }
  static Vec divisor(size_t n) { return {_mm512_set1_pd(static_cast<double>(n))}; }
};

// 16 stored 16-bit elements at p (masked).
inline __m256i load16(const unsigned char* p, uint64_t m) {
  return _mm256_maskz_loadu_epi16(static_cast<__mmask16>(m), p);
}
inline void store16(unsigned char* p, __m256i v, uint64_t m) {
  _mm256_mask_storeu_epi16(p, static_cast<__mmask16>(m), v);
}

// AVX-512F's vcvtph2ps/vcvtps2ph: exact widening; narrowing rounds to nearest even
// (immediate 0), overflows to Inf and keeps f16 subnormals, like floatToHalf().
struct Float16Codec {
  using Vec = F32x2;
  static constexpr size_t kLanes = 32, kBytes = 2;
  static Vec load(const unsigned char* p, uint64_t m) {
    return {_mm512_cvtph_ps(load16(p, m)), _mm512_cvtph_ps(load16(p + 32, m >> 16))};
  }
  static void store(unsigned char* p, Vec v, uint64_t m) {
    store16(p, _mm512_cvtps_ph(v.lo, _MM_FROUND_TO_NEAREST_INT), m);
    store16(p + 32, _mm512_cvtps_ph(v.hi, _MM_FROUND_TO_NEAREST_INT), m >> 16);
  }
  static Vec divisor(size_t n) {
    const __m512 d = _mm512_set1_ps(static_cast<float>(n));
    return {d, d};
  }
};

inline __m512 widenBf16(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// floatToBf16() with integer ops, without its NaN branch (why that is exact here: see
// roundToBf16 in reduce_avx2.cc): bf16 bits in the low half of each 32-bit lane.
inline __m512i roundToBf16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  return _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))),
                           16);
}

// Lanes holding an f32 subnormal (exponent 0, mantissa not 0).
inline __mmask16 subnormalLanes(__m512 v) {
  const __m512i magnitude = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff));
  return _mm512_cmplt_epu32_mask(_mm512_sub_epi32(magnitude, _mm512_set1_epi32(1)),
                                 _mm512_set1_epi32(0x007fffff));
}

template <bool kNative>
struct BFloat16Codec {
  using Vec = F32x2;
  static constexpr size_t kLanes = 32, kBytes = 2;
  static Vec load(const unsigned char* p, uint64_t m) {
    return {widenBf16(load16(p, m)), widenBf16(load16(p + 32, m >> 16))};
  }
  static void storeEmulated(unsigned char* p, Vec v, uint64_t m) {
    store16(p, _mm512_cvtepi32_epi16(roundToBf16(v.lo)), m);
    store16(p + 32, _mm512_cvtepi32_epi16(roundToBf16(v.hi)), m >> 16);
  }
  static void store(unsigned char* p, Vec v, uint64_t m) {
    if constexpr (kNative) {
      // vcvtne2ps2bf16 rounds like floatToBf16() (nearest even, NaN quieted the same way)
      // but flushes f32 subnormals to zero; the rare block that holds one takes the
      // integer path so results stay bit-identical.
      if ((subnormalLanes(v.lo) | subnormalLanes(v.hi)) == 0) {
        const __m512bh packed = _mm512_cvtne2ps_pbh(v.hi, v.lo);  // lo -> elements 0..15
        _mm512_mask_storeu_epi16(p, static_cast<__mmask32>(m),
                                 reinterpret_cast<const __m512i&>(packed));
        return;
      }
    }
    storeEmulated(p, v, m);
  }
  static Vec divisor(size_t n) {
    const __m512 d = _mm512_set1_ps(static_cast<float>(n));
    return {d, d};
  }
};

struct Int32Codec {
  using Vec = I32;
  static constexpr size_t kLanes = 16, kBytes = 4;
  static Vec load(const unsigned char* p, uint64_t m) {
    return {_mm512_maskz_loadu_epi32(static_cast<__mmask16>(m), p)};
  }
  static void store(unsigned char* p, Vec v, uint64_t m) {
    _mm512_mask_storeu_epi32(p, static_cast<__mmask16>(m), v.v);
  }
};

struct Int64Codec {
  using Vec = I64;
  static constexpr size_t kLanes = 8, kBytes = 8;
  static Vec load(const unsigned char* p, uint64_t m) {
    return {_mm512_maskz_loadu_epi64(static_cast<__mmask8>(m), p)};
  }
  static void store(unsigned char* p, Vec v, uint64_t m) {
    _mm512_mask_storeu_epi64(p, static_cast<__mmask8>(m), v.v);
  }
};

struct UInt8Codec {
  using Vec = U8;
  static constexpr size_t kLanes = 64, kBytes = 1;
  static Vec load(const unsigned char* p, uint64_t m) {
    return {_mm512_maskz_loadu_epi8(static_cast<__mmask64>(m), p)};
  }
  static void store(unsigned char* p, Vec v, uint64_t m) {
    _mm512_mask_storeu_epi8(p, static_cast<__mmask64>(m), v.v);
  }
};

// Ops; float min/max operand order as in reduce_avx2.cc (vminps(b, a) = b < a ? b : a).

struct Sum {
  static F32 apply(F32 a, F32 b) { return {_mm512_add_ps(a.v, b.v)}; }
  static F64 apply(F64 a, F64 b) { return {_mm512_add_pd(a.v, b.v)}; }
  static I32 apply(I32 a, I32 b) { return {_mm512_add_epi32(a.v, b.v)}; }
  static I64 apply(I64 a, I64 b) { return {_mm512_add_epi64(a.v, b.v)}; }
  static U8 apply(U8 a, U8 b) { return {_mm512_add_epi8(a.v, b.v)}; }
};

struct Prod {
  static F32 apply(F32 a, F32 b) { return {_mm512_mul_ps(a.v, b.v)}; }
  static F64 apply(F64 a, F64 b) { return {_mm512_mul_pd(a.v, b.v)}; }
  static I32 apply(I32 a, I32 b) { return {_mm512_mullo_epi32(a.v, b.v)}; }
  // vpmullq needs AVX-512DQ, which the AVX-512 path does not require: three 32x32->64
  // multiplies as in reduce_avx2.cc.
  static I64 apply(I64 a, I64 b) {
    const __m512i low = _mm512_mul_epu32(a.v, b.v);
    const __m512i cross = _mm512_add_epi64(_mm512_mul_epu32(_mm512_srli_epi64(a.v, 32), b.v),
                                           _mm512_mul_epu32(a.v, _mm512_srli_epi64(b.v, 32)));
    return {_mm512_add_epi64(low, _mm512_slli_epi64(cross, 32))};
  }
  static U8 apply(U8 a, U8 b) {
    const __m512i even = _mm512_mullo_epi16(a.v, b.v);
    const __m512i odd = _mm512_mullo_epi16(_mm512_srli_epi16(a.v, 8), _mm512_srli_epi16(b.v, 8));
    return {_mm512_or_si512(_mm512_and_si512(even, _mm512_set1_epi16(0x00ff)),
                            _mm512_slli_epi16(odd, 8))};
  }
};

struct Min {
  static F32 apply(F32 a, F32 b) { return {_mm512_min_ps(b.v, a.v)}; }
  static F64 apply(F64 a, F64 b) { return {_mm512_min_pd(b.v, a.v)}; }
  static I32 apply(I32 a, I32 b) { return {_mm512_min_epi32(a.v, b.v)}; }
  static I64 apply(I64 a, I64 b) { return {_mm512_min_epi64(a.v, b.v)}; }
  static U8 apply(U8 a, U8 b) { return {_mm512_min_epu8(a.v, b.v)}; }
};

struct Max {
  static F32 apply(F32 a, F32 b) { return {_mm512_max_ps(b.v, a.v)}; }
  static F64 apply(F64 a, F64 b) { return {_mm512_max_pd(b.v, a.v)}; }
  static I32 apply(I32 a, I32 b) { return {_mm512_max_epi32(a.v, b.v)}; }
  static I64 apply(I64 a, I64 b) { return {_mm512_max_epi64(a.v, b.v)}; }
  static U8 apply(U8 a, U8 b) { return {_mm512_max_epu8(a.v, b.v)}; }
};

struct Div {
  static F32 apply(F32 a, F32 b) { return {_mm512_div_ps(a.v, b.v)}; }
  static F64 apply(F64 a, F64 b) { return {_mm512_div_pd(a.v, b.v)}; }
};

// f16/bf16 blocks hold two f32 vectors: apply the op to each.
template <typename Op, typename Vec>
inline Vec apply(Vec a, Vec b) {
  return Op::apply(a, b);
}
template <typename Op>
inline F32x2 apply(F32x2 a, F32x2 b) {
  return {Op::apply(F32{a.lo}, F32{b.lo}).v, Op::apply(F32{a.hi}, F32{b.hi}).v};
}

template <typename Codec, typename Op>
inline void block(unsigned char* d, const unsigned char* x, const unsigned char* y, uint64_t m) {
  Codec::store(d, apply<Op>(Codec::load(x, m), Codec::load(y, m)), m);
}

template <typename Codec, typename Op>
void reduceLoop(void* dst, const void* a, const void* b, size_t count) {
  constexpr size_t kLanes = Codec::kLanes, kBytes = Codec::kBytes;
  constexpr uint64_t kAll = ~uint64_t{0};
  auto* d = static_cast<unsigned char*>(dst);
  const auto* x = static_cast<const unsigned char*>(a);
  const auto* y = static_cast<const unsigned char*>(b);
  size_t i = 0;
  // Two vectors per iteration, as in reduce_avx2.cc; loads before stores per block, so
  // dst == a or dst == b is safe.
  for (; i + 2 * kLanes <= count; i += 2 * kLanes) {
    block<Codec, Op>(d + i * kBytes, x + i * kBytes, y + i * kBytes, kAll);
    block<Codec, Op>(d + (i + kLanes) * kBytes, x + (i + kLanes) * kBytes,
                     y + (i + kLanes) * kBytes, kAll);
  }
  for (; i < count; i += kLanes) {
    block<Codec, Op>(d + i * kBytes, x + i * kBytes, y + i * kBytes, laneMask(count - i));
  }
}

template <typename Codec>
void divideLoop(void* data, size_t count, size_t divisor) {
  constexpr size_t kLanes = Codec::kLanes, kBytes = Codec::kBytes;
  auto* d = static_cast<unsigned char*>(data);
  const auto div = Codec::divisor(divisor);
  for (size_t i = 0; i < count; i += kLanes) {
    const uint64_t m = laneMask(count - i);
    Codec::store(d + i * kBytes, apply<Div>(Codec::load(d + i * kBytes, m), div), m);
  }
}

template <typename Codec>
void fillRow(KernelTable& table, DataType dtype) {
  auto& row = table.reduce[static_cast<int>(dtype)];
  row[kTableSum] = reduceLoop<Codec, Sum>;
  row[kTableProd] = reduceLoop<Codec, Prod>;
  row[kTableMin] = reduceLoop<Codec, Min>;
  row[kTableMax] = reduceLoop<Codec, Max>;
}

template <bool kNativeBf16>
KernelTable makeTable() {
  KernelTable table{};
  table.name = "avx512";
  fillRow<Float32Codec>(table, DataType::kFloat32);
  fillRow<Float64Codec>(table, DataType::kFloat64);
  fillRow<Float16Codec>(table, DataType::kFloat16);
  fillRow<BFloat16Codec<kNativeBf16>>(table, DataType::kBFloat16);
  fillRow<Int32Codec>(table, DataType::kInt32);
  fillRow<Int64Codec>(table, DataType::kInt64);
  fillRow<UInt8Codec>(table, DataType::kUInt8);
  // Integer division stays portable (table entry null).
  table.divide[static_cast<int>(DataType::kFloat32)] = divideLoop<Float32Codec>;
  table.divide[static_cast<int>(DataType::kFloat64)] = divideLoop<Float64Codec>;
  table.divide[static_cast<int>(DataType::kFloat16)] = divideLoop<Float16Codec>;
  table.divide[static_cast<int>(DataType::kBFloat16)] = divideLoop<BFloat16Codec<kNativeBf16>>;
  return table;
}

}  // namespace

const KernelTable& avx512Kernels(bool native_bf16) {
  static const KernelTable emulated = makeTable<false>();
  static const KernelTable native = makeTable<true>();
  return native_bf16 ? native : emulated;
}

}  // namespace railshard::kernels::detail
