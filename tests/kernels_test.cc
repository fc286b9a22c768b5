// kernels::reduce and kernels::divide against a scalar reference written here: random
// values, odd lengths, unaligned pointers, in-place aliasing. Then every instruction set the
// CPU runs (portable, avx2, avx512) against the portable path, bit for bit, on random values,
// random bit patterns and every f16/bf16 value; and the RAILSHARD_KERNEL_ISA override.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/copy.h"
#include "kernels/cpu_features.h"
#include "kernels/reduce.h"
#include "tests/reference.h"

namespace railshard {
namespace {

using test::loadValue;
using test::storeValue;

double applyOp(double a, double b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return a + b;
    case ReduceOp::kProd:
      return a * b;
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
  }
  return 0;
}

// The exact result of `a op b` as `dtype` stores it: computed in double, wrapped for
// integers, rounded once for floating types.
double referenceElement(double a, double b, DataType dtype, ReduceOp op) {
  double r = applyOp(a, b, op);
  switch (dtype) {
    case DataType::kInt32:
      return static_cast<double>(static_cast<int32_t>(static_cast<int64_t>(r)));
    case DataType::kUInt8:
      return static_cast<double>(static_cast<uint8_t>(static_cast<int64_t>(r) & 0xff));
    case DataType::kFloat32:
      return static_cast<float>(r);
    default: {
      std::vector<uint8_t> cell(8);
      storeValue(cell.data(), 0, dtype, r);
      return loadValue(cell.data(), 0, dtype);
    }
  }
}

double randomValue(std::mt19937_64& rng, DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
      return static_cast<double>(rng() % 256);
    case DataType::kInt32:
    case DataType::kInt64:
      return static_cast<double>(static_cast<int64_t>(rng() % 20001) - 10000);
    default: {
      std::uniform_real_distribution<double> d(-100.0, 100.0);
      // Round to the dtype first so the operands are exactly what the buffer holds.
      std::vector<uint8_t> cell(8);
      storeValue(cell.data(), 0, dtype, d(rng));
      return loadValue(cell.data(), 0, dtype);
    }
  }
}

struct KernelCase {
  DataType dtype;
  ReduceOp op;
};

class ReduceKernel : public ::testing::TestWithParam<KernelCase> {};

TEST_P(ReduceKernel, MatchesScalarReferenceAtOddLengthsAndOffsets) {
  const auto [dtype, op] = GetParam();
  const size_t element = sizeOf(dtype);
  std::mt19937_64 rng(static_cast<uint64_t>(dtype) * 31 + static_cast<uint64_t>(op));
  for (size_t count : {size_t{0}, size_t{1}, size_t{3}, size_t{15}, size_t{16}, size_t{17},
                       size_t{63}, size_t{1000}, size_t{4099}}) {
    for (size_t misalign : {size_t{0}, size_t{1}, size_t{3}}) {
      // Byte offsets make the pointers unaligned for every dtype wider than a byte.
      std::vector<uint8_t> a_raw(count * element + 16), b_raw(count * element + 16),
          d_raw(count * element + 16);
      uint8_t* a = a_raw.data() + misalign;
      uint8_t* b = b_raw.data() + misalign;
      uint8_t* d = d_raw.data() + misalign;
      std::vector<double> av(count), bv(count);
      for (size_t i = 0; i < count; ++i) {
        av[i] = randomValue(rng, dtype);
        bv[i] = randomValue(rng, dtype);
        storeValue(a, i, dtype, av[i]);
        storeValue(b, i, dtype, bv[i]);
      }
      kernels::reduce(d, a, b, count, dtype, op);
      for (size_t i = 0; i < count; ++i) {
        const double expected = referenceElement(av[i], bv[i], dtype, op);
        ASSERT_EQ(loadValue(d, i, dtype), expected)
            << name(dtype) << " " << name(op) << " count " << count << " misalign " << misalign
            << " element " << i << ": " << av[i] << " op " << bv[i];
      }
      // In place: dst aliases the first operand.
      kernels::reduce(a, a, b, count, dtype, op);
      ASSERT_EQ(std::memcmp(a, d, count * element), 0) << name(dtype) << " " << name(op);
    }
  }
}

std::vector<KernelCase> allCases() {
  std::vector<KernelCase> cases;
  for (int d = 0; d < kNumDataTypes; ++d) {
    for (int o = 0; o < kNumReduceOps; ++o) {
      cases.push_back({static_cast<DataType>(d), static_cast<ReduceOp>(o)});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(EveryDtypeAndOp, ReduceKernel, ::testing::ValuesIn(allCases()),
                         [](const auto& info) {
                           return std::string(name(info.param.dtype)) + "_" +
                                  std::string(name(info.param.op));
                         });

// Both copies against a byte loop: every length around the vector widths and the 4 KiB
// threshold, at destinations and sources off every alignment, with the bytes on either side
// of the destination untouched.
TEST(CopyKernel, CopyAndStreamCopyMatchAByteLoopAtEveryOffset) {
  const std::vector<size_t> lengths = {0,    1,    31,   32,    127,   128,    4095,
                                       4096, 4097, 4223, 65536, 65567, 1 << 20};
  std::vector<uint8_t> source((1 << 20) + 128);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 131 + 7);
  for (auto copier : {&kernels::copy, &kernels::streamCopy}) {
    for (size_t length : lengths) {
      for (size_t dst_off : {0, 1, 17, 32}) {
        for (size_t src_off : {0, 3, 64}) {
          std::vector<uint8_t> dst(length + 128, 0xa5);
          copier(dst.data() + dst_off, source.data() + src_off, length);
          for (size_t i = 0; i < dst.size(); ++i) {
            const bool inside = i >= dst_off && i < dst_off + length;
            const uint8_t want = inside ? source[src_off + i - dst_off] : 0xa5;
            ASSERT_EQ(dst[i], want)
                << (copier == &kernels::streamCopy ? "streamCopy" : "copy") << " length " << length
                << " dst+" << dst_off << " src+" << src_off << " at " << i;
          }
        }
      }
    }
  }
}

TEST(DivideKernel, DividesOnceAndTruncatesIntegers) {
  std::vector<int32_t> ints = {7, -7, 8, 0};
  kernels::divide(ints.data(), ints.size(), DataType::kInt32, 2);
  EXPECT_EQ(ints, (std::vector<int32_t>{3, -3, 4, 0}));
  std::vector<float> floats = {1.0f, 3.0f};
  kernels::divide(floats.data(), floats.size(), DataType::kFloat32, 3);
  EXPECT_FLOAT_EQ(floats[0], 1.0f / 3.0f);
  std::vector<uint16_t> halves(1);
  storeValue(halves.data(), 0, DataType::kFloat16, 5.0);
  kernels::divide(halves.data(), 1, DataType::kFloat16, 4);
  EXPECT_EQ(loadValue(halves.data(), 0, DataType::kFloat16), 1.25);
  EXPECT_THROW(kernels::divide(floats.data(), 1, DataType::kFloat32, 0), InvalidArgument);
}

TEST(HalfConversion, SpecialValuesSurvive) {
  std::vector<uint16_t> a(4), b(4), d(4);
  const double inf = std::numeric_limits<double>::infinity();
  const double values[] = {inf, -inf, 65504.0, 6.0e-8};  // max normal, a subnormal
  for (size_t i = 0; i < 4; ++i) {
    storeValue(a.data(), i, DataType::kFloat16, values[i]);
    storeValue(b.data(), i, DataType::kFloat16, 0.0);
  }
  kernels::reduce(d.data(), a.data(), b.data(), 4, DataType::kFloat16, ReduceOp::kSum);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(loadValue(d.data(), i, DataType::kFloat16),
              loadValue(a.data(), i, DataType::kFloat16));
  }
  // Overflow rounds to infinity, NaN stays NaN.
  storeValue(a.data(), 0, DataType::kFloat16, 65504.0);
  storeValue(b.data(), 0, DataType::kFloat16, 65504.0);
  kernels::reduce(d.data(), a.data(), b.data(), 1, DataType::kFloat16, ReduceOp::kSum);
  EXPECT_EQ(loadValue(d.data(), 0, DataType::kFloat16), inf);
  storeValue(a.data(), 0, DataType::kBFloat16, std::nan(""));
  kernels::reduce(d.data(), a.data(), a.data(), 1, DataType::kBFloat16, ReduceOp::kSum);
  EXPECT_TRUE(std::isnan(loadValue(d.data(), 0, DataType::kBFloat16)));
}

// ---- Every instruction set against the portable path ----

// One way the kernels can run. The AVX-512 path rounds bf16 either with vcvtne2ps2bf16 (CPUs
// with avx512_bf16) or with integer ops, so both are separate variants.
struct IsaVariant {
  kernels::Isa isa;
  bool native_bf16;
  const char* label;
};

const std::vector<IsaVariant>& isaVariants() {
  static const std::vector<IsaVariant> variants = {
      {kernels::Isa::kPortable, false, "portable"},
      {kernels::Isa::kAvx2, false, "avx2"},
      {kernels::Isa::kAvx512, false, "avx512"},
      {kernels::Isa::kAvx512, true, "avx512_native_bf16"},
  };
  return variants;
}

// Why `variant` cannot run here, or "" if it can.
std::string skipReason(const IsaVariant& variant) {
  const auto& cpu = kernels::cpuFeatures();
  switch (variant.isa) {
    case kernels::Isa::kPortable:
      return "";
    case kernels::Isa::kAvx2:
      if (!cpu.avx2 || !cpu.fma || !cpu.f16c) return "CPU lacks avx2/fma/f16c";
      break;
    case kernels::Isa::kAvx512:
      // The AVX-512 kernels have not been run on hardware in this repository yet (the
      // development machine has no AVX-512): these tests are their first check there.
      if (!cpu.avx512f) return "CPU lacks avx512f";
      if (!cpu.avx512bw || !cpu.avx512vl) return "CPU lacks avx512bw/avx512vl";
      if (variant.native_bf16 && !cpu.avx512bf16) return "CPU lacks avx512_bf16";
      break;
  }
  if (!kernels::canRun(variant.isa))
    return "this build has no " + std::string(name(variant.isa)) + " kernels";
  return "";
}

// Restores the instruction set that was active before the test.
class IsaGuard {
 public:
  IsaGuard() : saved_(*kernels::parseIsa(kernels::activeIsa())) {}
  ~IsaGuard() { kernels::setIsaForTesting(saved_); }
  IsaGuard(const IsaGuard&) = delete;
  IsaGuard& operator=(const IsaGuard&) = delete;

 private:
  kernels::Isa saved_;
};

bool isNanBits(const uint8_t* p, size_t i, DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: {
      uint32_t u;
      std::memcpy(&u, p + i * 4, 4);
      return (u & 0x7fffffffu) > 0x7f800000u;
    }
    case DataType::kFloat64: {
      uint64_t u;
      std::memcpy(&u, p + i * 8, 8);
      return (u & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    }
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, p + i * 2, 2);
      return (h & 0x7fffu) > (dtype == DataType::kFloat16 ? 0x7c00u : 0x7f80u);
    }
    default:
      return false;
  }
}

// Index of the first element where got and want differ, or count if none. Bit-exact, except
// that any NaN matches any NaN (which NaN comes out is not part of the contract).
size_t firstDifference(const uint8_t* got, const uint8_t* want, size_t count, DataType dtype) {
  const size_t element = sizeOf(dtype);
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(got + i * element, want + i * element, element) == 0) continue;
    if (isNanBits(got, i, dtype) && isNanBits(want, i, dtype)) continue;
    return i;
  }
  return count;
}

std::string hexElement(const uint8_t* p, size_t i, DataType dtype) {
  const size_t element = sizeOf(dtype);
  std::string out = "0x";
  char digits[3];
  for (size_t k = element; k-- > 0;) {
    std::snprintf(digits, sizeof(digits), "%02x", p[i * element + k]);
    out += digits;
  }
  return out;
}

// Runs reduce with `variant` and with portable on the same inputs (dst separate, dst == a,
// dst == b) and checks all agree; returns the variant's separate-dst result.
std::vector<uint8_t> reduceBothWays(const IsaVariant& variant, const uint8_t* a, const uint8_t* b,
                                    size_t count, DataType dtype, ReduceOp op, size_t misalign,
                                    const std::string& what) {
  const size_t bytes = count * sizeOf(dtype);
  std::vector<uint8_t> want_raw(bytes + 16), got_raw(bytes + 16), alias_raw(bytes + 16);
  uint8_t* want = want_raw.data() + misalign;
  uint8_t* got = got_raw.data() + misalign;
  uint8_t* alias = alias_raw.data() + misalign;

  EXPECT_TRUE(kernels::setIsaForTesting(kernels::Isa::kPortable));
  kernels::reduce(want, a, b, count, dtype, op);
  EXPECT_TRUE(kernels::setIsaForTesting(variant.isa, variant.native_bf16));
  // Sentinels around the destination catch a write past either end.
  got_raw.assign(got_raw.size(), 0xa5);
  kernels::reduce(got, a, b, count, dtype, op);
  for (size_t k = 0; k < misalign; ++k) EXPECT_EQ(got_raw[k], 0xa5) << what << " wrote before dst";
  for (size_t k = misalign + bytes; k < got_raw.size(); ++k) {
    EXPECT_EQ(got_raw[k], 0xa5) << what << " wrote past the end at byte " << k - misalign;
  }
  size_t bad = firstDifference(got, want, count, dtype);
  EXPECT_EQ(bad, count) << what << " element " << bad << ": " << variant.label << " gave "
                        << (bad < count ? hexElement(got, bad, dtype) : "") << ", portable "
                        << (bad < count ? hexElement(want, bad, dtype) : "") << " for "
                        << (bad < count ? hexElement(a, bad, dtype) : "") << " op "
                        << (bad < count ? hexElement(b, bad, dtype) : "");
  // In place, both ways round.
  if (bytes > 0) std::memcpy(alias, a, bytes);
  kernels::reduce(alias, alias, b, count, dtype, op);
  bad = firstDifference(alias, want, count, dtype);
  EXPECT_EQ(bad, count) << what << " dst == a, element " << bad;
  if (bytes > 0) std::memcpy(alias, b, bytes);
  kernels::reduce(alias, a, alias, count, dtype, op);
  bad = firstDifference(alias, want, count, dtype);
  EXPECT_EQ(bad, count) << what << " dst == b, element " << bad;
  return std::vector<uint8_t>(got, got + bytes);
}

struct IsaCase {
  size_t variant;
  DataType dtype;
  ReduceOp op;
};

class IsaKernel : public ::testing::TestWithParam<IsaCase> {
 protected:
  void SetUp() override {
    const std::string reason = skipReason(isaVariants()[GetParam().variant]);
    if (!reason.empty()) GTEST_SKIP() << reason;
  }
  IsaGuard guard_;
};

TEST_P(IsaKernel, BitExactWithPortableAndReferenceAtEveryTailAndOffset) {
  const auto [index, dtype, op] = GetParam();
  const IsaVariant& variant = isaVariants()[index];
  const size_t element = sizeOf(dtype);
  std::mt19937_64 rng(static_cast<uint64_t>(dtype) * 131 + static_cast<uint64_t>(op) * 7 + 1);
  for (size_t count : {0, 1, 3, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1000, 4099}) {
    for (size_t misalign : {0, 1, 3}) {
      std::vector<uint8_t> a_raw(count * element + 16), b_raw(count * element + 16);
      uint8_t* a = a_raw.data() + misalign;
      uint8_t* b = b_raw.data() + misalign;
      const std::string what = std::string(variant.label) + " " + std::string(name(dtype)) + " " +
                               std::string(name(op)) + " count " + std::to_string(count) +
                               " misalign " + std::to_string(misalign);

      // Values the reference can check: results must also match it exactly.
      std::vector<double> av(count), bv(count);
      for (size_t i = 0; i < count; ++i) {
        av[i] = randomValue(rng, dtype);
        bv[i] = randomValue(rng, dtype);
        storeValue(a, i, dtype, av[i]);
        storeValue(b, i, dtype, bv[i]);
      }
      const std::vector<uint8_t> got =
          reduceBothWays(variant, a, b, count, dtype, op, misalign, what + " (values)");
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(loadValue(got.data(), i, dtype), referenceElement(av[i], bv[i], dtype, op))
            << what << " element " << i << ": " << av[i] << " op " << bv[i];
      }

      // Random bit patterns: every exponent, NaN, Inf, subnormals, integer overflow.
      for (size_t k = 0; k < count * element; ++k) {
        a[k] = static_cast<uint8_t>(rng());
        b[k] = static_cast<uint8_t>(rng());
      }
      reduceBothWays(variant, a, b, count, dtype, op, misalign, what + " (random bits)");
      if (HasFailure()) return;
    }
  }
}

// f16/bf16: every value as a, against zeros, subnormals, normals near the edges, Inf, NaN
// and random values as b — covers widening of every input, rounding of subnormal results
// (which vcvtne2ps2bf16 alone would flush), ties, and overflow to Inf.
class IsaHalfKernel : public IsaKernel {};

TEST_P(IsaHalfKernel, EveryValueAgainstSpecialOperands) {
  const auto [index, dtype, op] = GetParam();
  const IsaVariant& variant = isaVariants()[index];
  const bool f16 = dtype == DataType::kFloat16;
  std::vector<uint16_t> operands = {
      0x0000,
      0x8000,  // +-0
      0x0001,
      0x8001,
      0x0003,                                     // smallest subnormals
      f16 ? uint16_t{0x03ff} : uint16_t{0x007f},  // largest subnormal
      f16 ? uint16_t{0x8400} : uint16_t{0x8080},  // -smallest normal
      f16 ? uint16_t{0x3c00} : uint16_t{0x3f80},  // 1
      f16 ? uint16_t{0xbc01} : uint16_t{0xbf81},  // -(1 + ulp)
      f16 ? uint16_t{0x7bff} : uint16_t{0x7f7f},  // largest finite
      f16 ? uint16_t{0xfbff} : uint16_t{0xff7f},  // -largest finite
      f16 ? uint16_t{0x7c00} : uint16_t{0x7f80},  // +Inf
      f16 ? uint16_t{0xfc00} : uint16_t{0xff80},  // -Inf
      f16 ? uint16_t{0x7e00} : uint16_t{0x7fc0},  // quiet NaN
      f16 ? uint16_t{0x7c01} : uint16_t{0x7f81},  // signalling NaN
      f16 ? uint16_t{0xfe00} : uint16_t{0xffc0},  // -NaN
      f16 ? uint16_t{0x1400} : uint16_t{0x3400},  // small power of two
  };
  std::mt19937_64 rng(99);
  for (int k = 0; k < 8; ++k) operands.push_back(static_cast<uint16_t>(rng()));
  const size_t count = 65536 * operands.size();
  std::vector<uint16_t> a(count), b(count);
  for (size_t j = 0; j < operands.size(); ++j) {
    for (size_t v = 0; v < 65536; ++v) {
      // Alternate which side holds the special value: min/max/NaN handling is asymmetric.
      a[j * 65536 + v] = (v & 1) ? operands[j] : static_cast<uint16_t>(v);
      b[j * 65536 + v] = (v & 1) ? static_cast<uint16_t>(v) : operands[j];
    }
  }
  reduceBothWays(variant, reinterpret_cast<const uint8_t*>(a.data()),
                 reinterpret_cast<const uint8_t*>(b.data()), count, dtype, op, 0,
                 std::string(variant.label) + " " + std::string(name(dtype)) + " " +
                     std::string(name(op)) + " exhaustive");
}

// Named cases, checked by value: f16 overflow and ties, subnormals kept, Inf and NaN.
class IsaVariantTest : public ::testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    const std::string reason = skipReason(isaVariants()[GetParam()]);
    if (!reason.empty()) GTEST_SKIP() << reason;
    ASSERT_TRUE(kernels::setIsaForTesting(isaVariants()[GetParam()].isa,
                                          isaVariants()[GetParam()].native_bf16));
  }
  IsaGuard guard_;
};

class IsaSpecialValues : public IsaVariantTest {};

TEST_P(IsaSpecialValues, SumRoundsOverflowsAndKeepsSubnormals) {
  const ReduceOp op = ReduceOp::kSum;
  {
    // f16: 65504+65504 and the tie 65504+16 overflow to Inf; 65504+8 rounds back down;
    // 2048+1 and 2050+1 are ties that go to the even neighbour; subnormals survive.
    const std::vector<uint16_t> a = {0x7bff, 0x7bff, 0x7bff, 0x6800, 0x6801, 0x0001, 0x8001};
    const std::vector<uint16_t> b = {0x7bff, 0x4c00, 0x4800, 0x3c00, 0x3c00, 0x0000, 0x0000};
    const std::vector<uint16_t> want = {0x7c00, 0x7c00, 0x7bff, 0x6800, 0x6802, 0x0001, 0x8001};
    std::vector<uint16_t> d(a.size());
    kernels::reduce(d.data(), a.data(), b.data(), a.size(), DataType::kFloat16, op);
    EXPECT_EQ(d, want);
  }
  {
    // bf16: subnormal results are kept (vcvtne2ps2bf16 alone would flush them to zero),
    // including one made from normals; the largest finite doubled overflows to Inf.
    const std::vector<uint16_t> a = {0x0001, 0x8001, 0x0080, 0x7f7f, 0x3f80, 0x3f81};
    const std::vector<uint16_t> b = {0x0000, 0x0000, 0x8001, 0x7f7f, 0x3b80, 0x3b80};
    // 1 + 2^-8 is a tie: to even 1.0; (1 + 2^-7) + 2^-8 is a tie: to even 1 + 2^-6.
    const std::vector<uint16_t> want = {0x0001, 0x8001, 0x007f, 0x7f80, 0x3f80, 0x3f82};
    std::vector<uint16_t> d(a.size());
    kernels::reduce(d.data(), a.data(), b.data(), a.size(), DataType::kBFloat16, op);
    EXPECT_EQ(d, want);
  }
  const double inf = std::numeric_limits<double>::infinity();
  for (DataType dtype :
       {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
    std::vector<uint8_t> a(8 * 3), b(8 * 3), d(8 * 3);
    storeValue(a.data(), 0, dtype, inf);
    storeValue(b.data(), 0, dtype, -inf);  // Inf - Inf = NaN
    storeValue(a.data(), 1, dtype, std::nan(""));
    storeValue(b.data(), 1, dtype, 1.0);
    storeValue(a.data(), 2, dtype, -inf);
    storeValue(b.data(), 2, dtype, 1.0);
    kernels::reduce(d.data(), a.data(), b.data(), 3, dtype, op);
    EXPECT_TRUE(std::isnan(loadValue(d.data(), 0, dtype))) << name(dtype);
    EXPECT_TRUE(std::isnan(loadValue(d.data(), 1, dtype))) << name(dtype);
    EXPECT_EQ(loadValue(d.data(), 2, dtype), -inf) << name(dtype);
  }
}

// min/max with NaN: a NaN in a is the result, a NaN in b is ignored; no crash, no trap.
TEST_P(IsaSpecialValues, MinMaxKeepANaNInTheFirstOperandOnly) {
  const double nan = std::nan("");
  for (DataType dtype :
       {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
      std::vector<uint8_t> a(8 * 2), b(8 * 2), d(8 * 2);
      storeValue(a.data(), 0, dtype, nan);
      storeValue(b.data(), 0, dtype, 1.0);
      storeValue(a.data(), 1, dtype, 1.0);
      storeValue(b.data(), 1, dtype, nan);
      kernels::reduce(d.data(), a.data(), b.data(), 2, dtype, op);
      EXPECT_TRUE(std::isnan(loadValue(d.data(), 0, dtype))) << name(dtype) << " " << name(op);
      EXPECT_EQ(loadValue(d.data(), 1, dtype), 1.0) << name(dtype) << " " << name(op);
    }
  }
}

std::string variantName(const ::testing::TestParamInfo<size_t>& info) {
  return isaVariants()[info.param].label;
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, IsaSpecialValues,
                         ::testing::Range(size_t{0}, isaVariants().size()), variantName);

std::vector<IsaCase> allIsaCases() {
  std::vector<IsaCase> cases;
  for (size_t v = 0; v < isaVariants().size(); ++v) {
    for (int d = 0; d < kNumDataTypes; ++d) {
      for (int o = 0; o < kNumReduceOps; ++o) {
        cases.push_back({v, static_cast<DataType>(d), static_cast<ReduceOp>(o)});
      }
    }
  }
  return cases;
}

std::string isaCaseName(const ::testing::TestParamInfo<IsaCase>& info) {
  return std::string(isaVariants()[info.param.variant].label) + "_" +
         std::string(name(info.param.dtype)) + "_" + std::string(name(info.param.op));
}

INSTANTIATE_TEST_SUITE_P(EveryIsaDtypeAndOp, IsaKernel, ::testing::ValuesIn(allIsaCases()),
                         isaCaseName);

std::vector<IsaCase> halfIsaCases() {
  std::vector<IsaCase> cases;
  for (size_t v = 0; v < isaVariants().size(); ++v) {
    for (DataType dtype : {DataType::kFloat16, DataType::kBFloat16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax}) {
        cases.push_back({v, dtype, op});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(EveryIsaAndOp, IsaHalfKernel, ::testing::ValuesIn(halfIsaCases()),
                         isaCaseName);

class IsaDivide : public IsaVariantTest {};

TEST_P(IsaDivide, BitExactWithPortable) {
  const IsaVariant& variant = isaVariants()[GetParam()];
  std::mt19937_64 rng(5);
  for (int d = 0; d < kNumDataTypes; ++d) {
    const auto dtype = static_cast<DataType>(d);
    const size_t element = sizeOf(dtype);
    // Every f16/bf16 value; random bit patterns for the others.
    const size_t count = element == 2 ? 65536 + 37 : 4099;
    std::vector<uint8_t> input(count * element + 3);
    for (size_t i = 0; i < count * element; ++i) input[i + 3] = static_cast<uint8_t>(rng());
    if (element == 2) {
      for (size_t i = 0; i < 65536; ++i) {
        const auto h = static_cast<uint16_t>(i);
        std::memcpy(input.data() + 3 + i * 2, &h, 2);
      }
    }
    for (size_t divisor : {1, 2, 3, 7, 256, 1000, 1 << 20}) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{17}, count}) {
        std::vector<uint8_t> want(input), got(input);
        ASSERT_TRUE(kernels::setIsaForTesting(kernels::Isa::kPortable));
        kernels::divide(want.data() + 3, n, dtype, divisor);
        ASSERT_TRUE(kernels::setIsaForTesting(variant.isa, variant.native_bf16));
        kernels::divide(got.data() + 3, n, dtype, divisor);
        const size_t bad = firstDifference(got.data() + 3, want.data() + 3, n, dtype);
        ASSERT_EQ(bad, n) << variant.label << " " << name(dtype) << " / " << divisor << " count "
                          << n << " element " << bad;
        ASSERT_EQ(std::memcmp(got.data() + 3 + n * element, want.data() + 3 + n * element,
                              (count - n) * element),
                  0)
            << "divide wrote past count";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, IsaDivide, ::testing::Range(size_t{0}, isaVariants().size()),
                         variantName);

TEST(DivideKernel, DivisorWiderThanTheElementType) {
  // uint8 avg over 256+ ranks: the divisor must not wrap to 0 in the element type.
  std::vector<uint8_t> bytes = {255, 0, 128};
  kernels::divide(bytes.data(), bytes.size(), DataType::kUInt8, 256);
  EXPECT_EQ(bytes, (std::vector<uint8_t>{0, 0, 0}));
  std::vector<int32_t> ints = {std::numeric_limits<int32_t>::min()};
  kernels::divide(ints.data(), 1, DataType::kInt32, size_t{1} << 31);
  EXPECT_EQ(ints[0], -1);
}

// ---- Choosing the instruction set ----

TEST(KernelIsa, ActiveIsaIsOneTheCpuRuns) {
  const auto isa = kernels::parseIsa(kernels::activeIsa());
  ASSERT_TRUE(isa.has_value()) << kernels::activeIsa();
  EXPECT_TRUE(kernels::canRun(*isa));
  if (std::getenv("RAILSHARD_KERNEL_ISA") == nullptr) {
    EXPECT_EQ(*isa, kernels::bestIsa()) << "auto picks the fastest the CPU runs";
  }
  std::printf("kernels: active %s; CPU has %s; runs %s\n",
              std::string(kernels::activeIsa()).c_str(),
              kernels::describe(kernels::cpuFeatures()).c_str(), kernels::runnableIsas().c_str());
}

TEST(KernelIsa, SetIsaForTestingRefusesWhatTheCpuCannotRun) {
  IsaGuard guard;
  for (int i = 0; i < kernels::kNumIsas; ++i) {
    const auto isa = static_cast<kernels::Isa>(i);
    const std::string before(kernels::activeIsa());
    if (kernels::canRun(isa)) {
      EXPECT_TRUE(kernels::setIsaForTesting(isa));
      EXPECT_EQ(kernels::activeIsa(), name(isa));
    } else {
      EXPECT_FALSE(kernels::setIsaForTesting(isa));
      EXPECT_EQ(kernels::activeIsa(), before) << "a refused switch changes nothing";
    }
  }
}

TEST(KernelIsa, SettingValuesOnAGivenCpu) {
  kernels::CpuFeatures none;  // a CPU with no vector extensions
  kernels::CpuFeatures avx2_only;
  avx2_only.avx2 = avx2_only.fma = avx2_only.f16c = true;
  EXPECT_EQ(kernels::isaFromSetting(nullptr, none), kernels::Isa::kPortable);
  EXPECT_EQ(kernels::isaFromSetting("", none), kernels::Isa::kPortable);
  EXPECT_EQ(kernels::isaFromSetting("auto", none), kernels::Isa::kPortable);
  EXPECT_EQ(kernels::isaFromSetting("Auto", none), kernels::Isa::kPortable);
  EXPECT_EQ(kernels::isaFromSetting("PORTABLE", none), kernels::Isa::kPortable);
  EXPECT_EQ(kernels::isaFromSetting("portable", avx2_only), kernels::Isa::kPortable);
  EXPECT_EQ(kernels::isaFromSetting("auto", avx2_only), kernels::bestIsa(avx2_only));
  if (kernels::canRun(kernels::Isa::kAvx2, avx2_only)) {  // this build has AVX2 kernels
    EXPECT_EQ(kernels::isaFromSetting("AVX2", avx2_only), kernels::Isa::kAvx2);
    EXPECT_EQ(kernels::isaFromSetting(nullptr, avx2_only), kernels::Isa::kAvx2);
  }
  try {
    kernels::isaFromSetting("avx512", avx2_only);
    ADD_FAILURE() << "avx512 on an AVX2-only CPU must be refused";
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("RAILSHARD_KERNEL_ISA=avx512"), std::string::npos) << message;
    EXPECT_NE(message.find("runs " + kernels::runnableIsas(avx2_only)), std::string::npos)
        << message;
  }
  EXPECT_THROW(kernels::isaFromSetting("avx2", none), ConfigError);
}

TEST(KernelIsa, UnknownValueIsAConfigErrorNamingIt) {
  for (const char* value : {"sse9", "avx-512", "fast", "portable "}) {
    try {
      kernels::isaFromSetting(value);
      ADD_FAILURE() << "'" << value << "' accepted";
    } catch (const ConfigError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(std::string("'") + value + "'"), std::string::npos) << message;
      EXPECT_NE(message.find("RAILSHARD_KERNEL_ISA"), std::string::npos) << message;
      EXPECT_NE(message.find(kernels::runnableIsas()), std::string::npos) << message;
    }
  }
}

// The variable itself, read on first use: each case runs in a fresh child process (a
// "threadsafe" death test re-executes this binary), since a process reads it only once.
void probeIsaVariable(const char* value) {
  setenv("RAILSHARD_KERNEL_ISA", value, 1);
  for (int attempt = 0; attempt < 2;
       ++attempt) {  // a bad value fails every call, not just the first
    try {
      const std::string isa(kernels::activeIsa());
      float a = 1, b = 2, d = 0;
      kernels::reduce(&d, &a, &b, 1, DataType::kFloat32, ReduceOp::kSum);
      std::fprintf(stderr, "active=%s sum=%g\n", isa.c_str(), static_cast<double>(d));
      std::exit(0);
    } catch (const ConfigError& e) {
      std::fprintf(stderr, "attempt %d ConfigError: %s\n", attempt, e.what());
    }
  }
  std::exit(3);
}

TEST(KernelIsaVariable, IsReadOnFirstUse) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(probeIsaVariable("portable"), ::testing::ExitedWithCode(0), "active=portable sum=3");
  EXPECT_EXIT(probeIsaVariable(""), ::testing::ExitedWithCode(0),
              "active=" + std::string(name(kernels::bestIsa())));
  EXPECT_EXIT(probeIsaVariable("bogus"), ::testing::ExitedWithCode(3),
              "attempt 1 ConfigError: RAILSHARD_KERNEL_ISA: unknown instruction set 'bogus'");
  if (!kernels::canRun(kernels::Isa::kAvx512)) {
    EXPECT_EXIT(probeIsaVariable("avx512"), ::testing::ExitedWithCode(3),
                "RAILSHARD_KERNEL_ISA=avx512: this CPU .or build. cannot run avx512");
  }
}

}  // namespace
}  // namespace railshard
