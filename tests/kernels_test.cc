// kernels::reduce and kernels::divide against a scalar reference written here: random
// values, odd lengths, unaligned pointers, in-place aliasing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/base/error.h"
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
    EXPECT_EQ(loadValue(d.data(), i, DataType::kFloat16), loadValue(a.data(), i, DataType::kFloat16));
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

}  // namespace
}  // namespace railshard
