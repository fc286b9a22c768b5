// AVX2 kernels (256-bit), compiled with -mavx2 -mfma -mf16c; reached only through
// avx2Kernels() after cpu_features said the CPU and OS run them. Results are bit-identical to
// reduce_portable.cc (NaN payloads aside): same IEEE operations on the same f32 values, the
// same round-to-nearest-even for f16 (F16C) and bf16 (the integer trick of half.h).
//
// Include nothing that defines non-static inline functions other translation units also use
// (kernels/half.h included): the linker keeps one copy of such a function, and it could be
// this file's AVX2 one, run on a CPU without AVX2.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/kernel_table.h"

namespace railshard::kernels::detail {
namespace {

// One vector of computed values; the wrapper types tell the ops which lane width to use.
struct F32 {
  __m256 v;
};
struct F64 {
  __m256d v;
};
struct I32 {
  __m256i v;
};
struct I64 {
  __m256i v;
};
struct U8 {
  __m256i v;
};
// Two f32 vectors from one load of 16-bit elements (bf16).
struct F32x2 {
  __m256 lo, hi;
};

// Codecs: how kLanes stored elements load into one computed vector and store back.

struct Float32Codec {
  using Vec = F32;
  static constexpr size_t kLanes = 8, kBytes = 4;
  static Vec load(const unsigned char* p) {
    return {_mm256_loadu_ps(reinterpret_cast<const float*>(p))};
  }
  static void store(unsigned char* p, Vec v) { _mm256_storeu_ps(reinterpret_cast<float*>(p), v.v); }
  static Vec divisor(size_t n) { return {_mm256_set1_ps(static_cast<float>(n))}; }
};

struct Float64Codec {
  using Vec = F64;
  static constexpr size_t kLanes = 4, kBytes = 8;
  static Vec load(const unsigned char* p) {
    return {_mm256_loadu_pd(reinterpret_cast<const double*>(p))};
  }
  static void store(unsigned char* p, Vec v) {
    _mm256_storeu_pd(reinterpret_cast<double*>(p), v.v);
  }
  static Vec divisor(size_t n) { return {_mm256_set1_pd(static_cast<double>(n))}; }
};

// f16 <-> f32 with F16C: exact widening, and narrowing that rounds to nearest even (immediate
// 0, not MXCSR), overflows to Inf and produces f16 subnormals, like floatToHalf().
struct Float16Codec {
  using Vec = F32;
  static constexpr size_t kLanes = 8, kBytes = 2;
  static Vec load(const unsigned char* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
  }
  static void store(unsigned char* p, Vec v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v.v, _MM_FROUND_TO_NEAREST_INT));
  }
  static Vec divisor(size_t n) { return {_mm256_set1_ps(static_cast<float>(n))}; }
};

// f32 -> bf16 bits (in the low half of each 32-bit lane) as floatToBf16() rounds: add 0x7fff
// plus the lowest kept bit and truncate (nearest even; a carry into the exponent gives Inf on
// overflow). floatToBf16()'s NaN branch (truncate, set the quiet bit) is not needed here:
// every value these kernels round is an IEEE result computed from widened bf16 inputs, and
// such a NaN is either x86's default NaN or a quieted input NaN, so its low 16 bits are zero
// and its quiet bit is set: adding at most 0x8000 carries nothing and the truncation gives
// the same bits floatToBf16() does. (Dropping the branch is a third of the rounding's cost.)
inline __m256i roundToBf16(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))),
                           16);
}

// 16 bf16 per 256-bit load. Interleaving with zeros puts each bf16 in the high half of a
// 32-bit lane (which is its f32 value) without crossing 128-bit lanes; the saturating pack
// undoes exactly that order, and every rounded lane is <= 0xffff, so it is a plain narrowing.
struct BFloat16Codec {
  using Vec = F32x2;
  static constexpr size_t kLanes = 16, kBytes = 2;
  static Vec load(const unsigned char* p) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i zero = _mm256_setzero_si256();
    return {_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, bits)),
            _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, bits))};
  }
  static void store(unsigned char* p, Vec v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm256_packus_epi32(roundToBf16(v.lo), roundToBf16(v.hi)));
  }
  static Vec divisor(size_t n) {
    const __m256 d = _mm256_set1_ps(static_cast<float>(n));
    return {d, d};
  }
};

template <typename V, size_t Lanes, size_t Bytes>
struct IntCodec {
  using Vec = V;
  static constexpr size_t kLanes = Lanes, kBytes = Bytes;
  static Vec load(const unsigned char* p) {
    return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))};
  }
  static void store(unsigned char* p, Vec v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v.v);
  }
};
using Int32Codec = IntCodec<I32, 8, 4>;
using Int64Codec = IntCodec<I64, 4, 8>;
using UInt8Codec = IntCodec<U8, 32, 1>;

// Ops. Float min/max: minps(b, a) is "b < a ? b : a" and maxps(b, a) is "b > a ? b : a" —
// the portable semantics, NaN and signed zeros included (GCC keeps the operand order of
// these intrinsics unless -ffast-math).

struct Sum {
  static F32 apply(F32 a, F32 b) { return {_mm256_add_ps(a.v, b.v)}; }
  static F64 apply(F64 a, F64 b) { return {_mm256_add_pd(a.v, b.v)}; }
  static I32 apply(I32 a, I32 b) { return {_mm256_add_epi32(a.v, b.v)}; }
  static I64 apply(I64 a, I64 b) { return {_mm256_add_epi64(a.v, b.v)}; }
  static U8 apply(U8 a, U8 b) { return {_mm256_add_epi8(a.v, b.v)}; }
};

struct Prod {
  static F32 apply(F32 a, F32 b) { return {_mm256_mul_ps(a.v, b.v)}; }
  static F64 apply(F64 a, F64 b) { return {_mm256_mul_pd(a.v, b.v)}; }
  static I32 apply(I32 a, I32 b) { return {_mm256_mullo_epi32(a.v, b.v)}; }
  // No 64-bit multiply in AVX2: (ah·2^32 + al)(bh·2^32 + bl) mod 2^64
  // = al·bl + ((ah·bl + al·bh) << 32), from three 32x32->64 multiplies.
  static I64 apply(I64 a, I64 b) {
    const __m256i low = _mm256_mul_epu32(a.v, b.v);
    const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a.v, 32), b.v),
                                           _mm256_mul_epu32(a.v, _mm256_srli_epi64(b.v, 32)));
    return {_mm256_add_epi64(low, _mm256_slli_epi64(cross, 32))};
  }
  // No 8-bit multiply: multiply even and odd bytes as 16-bit lanes and keep the low bytes.
  static U8 apply(U8 a, U8 b) {
    const __m256i even = _mm256_mullo_epi16(a.v, b.v);
    const __m256i odd = _mm256_mullo_epi16(_mm256_srli_epi16(a.v, 8), _mm256_srli_epi16(b.v, 8));
    return {_mm256_or_si256(_mm256_and_si256(even, _mm256_set1_epi16(0x00ff)),
                            _mm256_slli_epi16(odd, 8))};
  }
};

struct Min {
  static F32 apply(F32 a, F32 b) { return {_mm256_min_ps(b.v, a.v)}; }
  static F64 apply(F64 a, F64 b) { return {_mm256_min_pd(b.v, a.v)}; }
  static I32 apply(I32 a, I32 b) { return {_mm256_min_epi32(a.v, b.v)}; }
  static I64 apply(I64 a, I64 b) {
    return {_mm256_blendv_epi8(a.v, b.v, _mm256_cmpgt_epi64(a.v, b.v))};  // a > b ? b : a
  }
  static U8 apply(U8 a, U8 b) { return {_mm256_min_epu8(a.v, b.v)}; }
};

struct Max {
  static F32 apply(F32 a, F32 b) { return {_mm256_max_ps(b.v, a.v)}; }
  static F64 apply(F64 a, F64 b) { return {_mm256_max_pd(b.v, a.v)}; }
  static I32 apply(I32 a, I32 b) { return {_mm256_max_epi32(a.v, b.v)}; }
  static I64 apply(I64 a, I64 b) {
    return {_mm256_blendv_epi8(a.v, b.v, _mm256_cmpgt_epi64(b.v, a.v))};  // b > a ? b : a
  }
  static U8 apply(U8 a, U8 b) { return {_mm256_max_epu8(a.v, b.v)}; }
};

struct Div {
  static F32 apply(F32 a, F32 b) { return {_mm256_div_ps(a.v, b.v)}; }
  static F64 apply(F64 a, F64 b) { return {_mm256_div_pd(a.v, b.v)}; }
};

// Pairs of f32 vectors take the op one vector at a time.
template <typename Op, typename Vec>
inline Vec apply(Vec a, Vec b) {
  return Op::apply(a, b);
}
template <typename Op>
inline F32x2 apply(F32x2 a, F32x2 b) {
  return {Op::apply(F32{a.lo}, F32{b.lo}).v, Op::apply(F32{a.hi}, F32{b.hi}).v};
}

template <typename Codec, typename Op>
inline void block(unsigned char* d, const unsigned char* x, const unsigned char* y) {
  Codec::store(d, apply<Op>(Codec::load(x), Codec::load(y)));
}

// The last count % kLanes elements go through the same vector code via zero-filled stack
// copies, so tails give exactly what full vectors give and never touch memory past the end.
template <typename Codec, typename Op>
void tail(unsigned char* d, const unsigned char* x, const unsigned char* y, size_t n) {
  constexpr size_t kBlock = Codec::kLanes * Codec::kBytes;
  alignas(32) unsigned char bx[kBlock] = {};
  alignas(32) unsigned char by[kBlock] = {};
  alignas(32) unsigned char bd[kBlock];
  std::memcpy(bx, x, n * Codec::kBytes);
  std::memcpy(by, y, n * Codec::kBytes);
  block<Codec, Op>(bd, bx, by);
  std::memcpy(d, bd, n * Codec::kBytes);
}

template <typename Codec, typename Op>
void reduceLoop(void* dst, const void* a, const void* b, size_t count) {
  constexpr size_t kLanes = Codec::kLanes, kBytes = Codec::kBytes;
  auto* d = static_cast<unsigned char*>(dst);
  const auto* x = static_cast<const unsigned char*>(a);
  const auto* y = static_cast<const unsigned char*>(b);
  size_t i = 0;
  // Two vectors per iteration: more loads in flight for the same loop overhead. Each
  // vector's loads come before its store, so dst == a or dst == b is safe.
  for (; i + 2 * kLanes <= count; i += 2 * kLanes) {
    block<Codec, Op>(d + i * kBytes, x + i * kBytes, y + i * kBytes);
    block<Codec, Op>(d + (i + kLanes) * kBytes, x + (i + kLanes) * kBytes,
                     y + (i + kLanes) * kBytes);
  }
  for (; i + kLanes <= count; i += kLanes) {
    block<Codec, Op>(d + i * kBytes, x + i * kBytes, y + i * kBytes);
  }
  if (i < count) tail<Codec, Op>(d + i * kBytes, x + i * kBytes, y + i * kBytes, count - i);
}

template <typename Codec>
void divideLoop(void* data, size_t count, size_t divisor) {
  constexpr size_t kLanes = Codec::kLanes, kBytes = Codec::kBytes;
  auto* d = static_cast<unsigned char*>(data);
  const auto div = Codec::divisor(divisor);
  size_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    Codec::store(d + i * kBytes, apply<Div>(Codec::load(d + i * kBytes), div));
  }
  if (i < count) {
    alignas(32) unsigned char buffer[kLanes * kBytes] = {};
    std::memcpy(buffer, d + i * kBytes, (count - i) * kBytes);
    Codec::store(buffer, apply<Div>(Codec::load(buffer), div));
    std::memcpy(d + i * kBytes, buffer, (count - i) * kBytes);
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

KernelTable makeTable() {
  KernelTable table{};
  table.name = "avx2";
  fillRow<Float32Codec>(table, DataType::kFloat32);
  fillRow<Float64Codec>(table, DataType::kFloat64);
  fillRow<Float16Codec>(table, DataType::kFloat16);
  fillRow<BFloat16Codec>(table, DataType::kBFloat16);
  fillRow<Int32Codec>(table, DataType::kInt32);
  fillRow<Int64Codec>(table, DataType::kInt64);
  fillRow<UInt8Codec>(table, DataType::kUInt8);
  // Integer division stays portable (table entry null): x86 has no vector integer divide.
  table.divide[static_cast<int>(DataType::kFloat32)] = divideLoop<Float32Codec>;
  table.divide[static_cast<int>(DataType::kFloat64)] = divideLoop<Float64Codec>;
  table.divide[static_cast<int>(DataType::kFloat16)] = divideLoop<Float16Codec>;
  table.divide[static_cast<int>(DataType::kBFloat16)] = divideLoop<BFloat16Codec>;
  return table;
}

}  // namespace

const KernelTable& avx2Kernels() {
  static const KernelTable table = makeTable();
  return table;
}

}  // namespace railshard::kernels::detail
