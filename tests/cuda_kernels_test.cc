// kernels::cuda (device_runtime.h, reduce.h) in three groups:
//  - CudaRuntime.*: what every build must do, device or not (compiled-in flag, reasons,
//    pointer kinds of host memory, ConfigError without a device).
//  - CudaKernelBody.*: the kernels' body (kernels/cuda/reduce_kernels.cuh) run on the CPU for
//    every thread of a pretend grid, against kernels::reduce bit for bit: the head / 16-byte
//    vector / tail / bytewise split and the element semantics, on any machine.
//  - CudaDevice.*: the real kernels on a GPU against kernels::reduce; they skip, printing
//    why, where no device is usable.
// Setting RAILSHARD_TEST_CUDA_MAX_COUNT=N leaves out lengths above N (for compute-sanitizer).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/types.h"
#include "kernels/cuda/device_runtime.h"
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/reduce_kernels.cuh"
#include "kernels/half.h"
#include "kernels/reduce.h"

#ifndef RAILSHARD_TEST_EXPECT_CUDA
#error "tests/CMakeLists.txt defines RAILSHARD_TEST_EXPECT_CUDA (0 or 1) for cuda_* tests"
#endif

namespace railshard {
namespace {

namespace gpu = kernels::cuda;

constexpr DataType kDtypes[] = {DataType::kFloat32,  DataType::kFloat64, DataType::kFloat16,
                                DataType::kBFloat16, DataType::kInt32,   DataType::kInt64,
                                DataType::kUInt8};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
                             ReduceOp::kAvg};
constexpr size_t kHuge = (size_t{1} << 20) | 7;
constexpr size_t kLengths[] = {0, 1, 3, 15, 16, 17, 255, 1023, 4096 + 5, kHuge};
constexpr size_t kOffsets[] = {0, 1, 3};  // elements
constexpr size_t kGuard = 64;             // bytes around every buffer that must stay untouched
constexpr uint8_t kGuardByte = 0xa5;

size_t maxCount() {
  const char* value = std::getenv("RAILSHARD_TEST_CUDA_MAX_COUNT");
  return value != nullptr && *value != '\0' ? std::strtoull(value, nullptr, 10)
                                            : std::numeric_limits<size_t>::max();
}

std::string describe(DataType dtype, ReduceOp op, size_t count) {
  return std::string(name(dtype)) + " " + std::string(name(op)) + " count " + std::to_string(count);
}

bool isFloating(DataType dtype) {
  return dtype == DataType::kFloat32 || dtype == DataType::kFloat64 ||
         dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
}

bool isNan(const uint8_t* element, DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: {
      float f;
      std::memcpy(&f, element, 4);
      return std::isnan(f);
    }
    case DataType::kFloat64: {
      double d;
      std::memcpy(&d, element, 8);
      return std::isnan(d);
    }
    case DataType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, element, 2);
      return (h & 0x7fffu) > 0x7c00u;
    }
    case DataType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, element, 2);
      return (h & 0x7fffu) > 0x7f80u;
    }
    default:
      return false;
  }
}

// Index of the first element where `got` differs from `want` (NaN equals any NaN), or -1.
long firstDifference(const uint8_t* got, const uint8_t* want, size_t count, DataType dtype) {
  const size_t size = sizeOf(dtype);
  // count 0: the vectors may be empty, with null data() (memcmp's arguments must not be null).
  if (count == 0 || std::memcmp(got, want, count * size) == 0) return -1;
  for (size_t i = 0; i < count; ++i) {
    const uint8_t* g = got + i * size;
    const uint8_t* w = want + i * size;
    if (std::memcmp(g, w, size) == 0) continue;
    if (isFloating(dtype) && isNan(g, dtype) && isNan(w, dtype)) continue;
    return static_cast<long>(i);
  }
  return -1;
}

std::string hex(const uint8_t* element, size_t size) {
  static const char* digits = "0123456789abcdef";
  std::string text = "0x";
  for (size_t k = size; k-- > 0;) {
    text += digits[element[k] >> 4];
    text += digits[element[k] & 15];
  }
  return text;
}

// ---- inputs: random bit patterns, the special values of each type, ordinary numbers ------

template <typename T>
void put(std::vector<uint8_t>& out, size_t i, T value) {
  std::memcpy(out.data() + i * sizeof(T), &value, sizeof(T));
}

void putSpecial(std::vector<uint8_t>& out, size_t i, DataType dtype, uint64_t pick) {
  switch (dtype) {
    case DataType::kFloat32: {
      using L = std::numeric_limits<float>;
      const float v[] = {
          L::quiet_NaN(), -L::quiet_NaN(), L::infinity(),   -L::infinity(),   0.0f, -0.0f, L::max(),
          L::lowest(),    L::min(),        L::denorm_min(), -L::denorm_min(), 1.0f, -1.0f, 3.0e38f};
      return put(out, i, v[pick % std::size(v)]);
    }
    case DataType::kFloat64: {
      using L = std::numeric_limits<double>;
      const double v[] = {
          L::quiet_NaN(), -L::quiet_NaN(), L::infinity(),   -L::infinity(),   0.0, -0.0, L::max(),
          L::lowest(),    L::min(),        L::denorm_min(), -L::denorm_min(), 1.0, -1.0, 1.0e308};
      return put(out, i, v[pick % std::size(v)]);
    }
    case DataType::kFloat16: {
      const uint16_t v[] = {0x7e00, 0xfe00, 0x7c00, 0xfc00, 0x0000, 0x8000, 0x7bff,
                            0xfbff, 0x0400, 0x0001, 0x8001, 0x3c00, 0xbc00, 0x7bfe};
      return put(out, i, v[pick % std::size(v)]);
    }
    case DataType::kBFloat16: {
      const uint16_t v[] = {0x7fc0, 0xffc0, 0x7f80, 0xff80, 0x0000, 0x8000, 0x7f7f,
                            0xff7f, 0x0080, 0x0001, 0x8001, 0x3f80, 0xbf80, 0x7f7e};
      return put(out, i, v[pick % std::size(v)]);
    }
    case DataType::kInt32: {
      using L = std::numeric_limits<int32_t>;
      const int32_t v[] = {L::min(), L::max(), 0, -1, 1, L::min() + 1, L::max() - 1, 65536};
      return put(out, i, v[pick % std::size(v)]);
    }
    case DataType::kInt64: {
      using L = std::numeric_limits<int64_t>;
      const int64_t v[] = {L::min(),     L::max(),        0, -1, 1, L::min() + 1,
                           L::max() - 1, int64_t{1} << 32};
      return put(out, i, v[pick % std::size(v)]);
    }
    case DataType::kUInt8: {
      const uint8_t v[] = {0, 1, 2, 127, 128, 254, 255, 16};
      return put(out, i, v[pick % std::size(v)]);
    }
  }
}

void putOrdinary(std::vector<uint8_t>& out, size_t i, DataType dtype, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> real(-100.0, 100.0);
  switch (dtype) {
    case DataType::kFloat32:
      return put(out, i, static_cast<float>(real(rng)));
    case DataType::kFloat64:
      return put(out, i, real(rng));
    case DataType::kFloat16:
      return put(out, i, kernels::floatToHalf(static_cast<float>(real(rng))));
    case DataType::kBFloat16:
      return put(out, i, kernels::floatToBf16(static_cast<float>(real(rng))));
    case DataType::kInt32:
      return put(out, i, static_cast<int32_t>(rng() % 20001) - 10000);
    case DataType::kInt64:
      return put(out, i, static_cast<int64_t>(rng() % 20001) - 10000);
    case DataType::kUInt8:
      return put(out, i, static_cast<uint8_t>(rng()));
  }
}

// Half ordinary numbers, a quarter special values, a quarter random bits (every NaN payload,
// subnormals, huge magnitudes that overflow, integers that wrap).
std::vector<uint8_t> randomElements(DataType dtype, size_t count, std::mt19937_64& rng) {
  const size_t size = sizeOf(dtype);
  std::vector<uint8_t> out(count * size);
  for (size_t i = 0; i < count; ++i) {
    const uint64_t r = rng();
    switch (r % 4) {
      case 0:
        putSpecial(out, i, dtype, r >> 8);
        break;
      case 1: {
        const uint64_t bits = rng();
        std::memcpy(out.data() + i * size, &bits, size);
        break;
      }
      default:
        putOrdinary(out, i, dtype, rng);
    }
  }
  return out;
}

// ---- where buffers live: host memory for the emulated grid, device memory for the GPU -----

// A buffer with kGuard guard bytes on each side of the region of interest at `offset` bytes
// past a 64-byte-aligned base (so the offset alone decides the alignment the kernel sees).
struct Region {
  size_t offset;  // bytes from the aligned base
  size_t bytes;   // region size
  size_t total() const { return kGuard + offset + bytes + kGuard; }
  size_t start() const { return kGuard + offset; }
};

// The image of a buffer: guard bytes everywhere but the region, which holds `data`.
std::vector<uint8_t> image(const Region& region, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out(region.total(), kGuardByte);
  std::copy(data.begin(), data.end(), out.begin() + static_cast<long>(region.start()));
  return out;
}

// Runs one reduction (or, with b empty, one divide) on buffers holding `a_image` and
// `b_image`, the result into the region of `dst_image` or in place. Returns the final images.
enum class InPlace { kNone, kIntoA, kIntoB };

struct Images {
  std::vector<uint8_t> a, b, dst;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // images.dst is ignored for in-place runs; the result is in images.a or images.b.
  virtual void reduce(Images& images, const Region& ra, const Region& rb, const Region& rd,
                      InPlace in_place, size_t count, DataType dtype, ReduceOp op) = 0;
  virtual void divide(std::vector<uint8_t>& data, const Region& region, size_t count,
                      DataType dtype, size_t divisor) = 0;
};

// Aligned host copy of an image.
class HostBuffer {
 public:
  explicit HostBuffer(const std::vector<uint8_t>& image)
      : storage_(image.size() + 64), size_(image.size()) {
    auto address = reinterpret_cast<uintptr_t>(storage_.data());
    base_ = storage_.data() + (64 - address % 64) % 64;
    if (size_ > 0) std::memcpy(base_, image.data(), size_);  // an empty image's data() may be null
  }
  uint8_t* at(size_t offset) { return base_ + offset; }
  std::vector<uint8_t> image() const { return {base_, base_ + size_}; }

 private:
  std::vector<uint8_t> storage_;
  uint8_t* base_;
  size_t size_;
};

// The kernel body on the CPU: every thread of a grid of `threads` threads in turn (each
// element belongs to one thread, so the order does not matter).
class EmulatedGrid : public Backend {
 public:
  explicit EmulatedGrid(size_t threads) : threads_(threads) {}

  void reduce(Images& images, const Region& ra, const Region& rb, const Region& rd,
              InPlace in_place, size_t count, DataType dtype, ReduceOp op) override {
    HostBuffer a(images.a), b(images.b), d(images.dst);
    uint8_t* pa = a.at(ra.start());
    uint8_t* pb = b.at(rb.start());
    uint8_t* pd = in_place == InPlace::kIntoA   ? pa
                  : in_place == InPlace::kIntoB ? pb
                                                : d.at(rd.start());
    gpu::detail::visitReducer(dtype, op, [&](const auto& f) { run(pd, pa, pb, count, f); });
    images.a = a.image();
    images.b = b.image();
    images.dst = d.image();
  }

  void divide(std::vector<uint8_t>& data, const Region& region, size_t count, DataType dtype,
              size_t divisor) override {
    HostBuffer d(data);
    uint8_t* p = d.at(region.start());
    gpu::detail::visitDivider(dtype, divisor, [&](const auto& f) { run(p, p, nullptr, count, f); });
    data = d.image();
  }

 private:
  template <typename F>
  void run(void* dst, const void* a, const void* b, size_t count, const F& f) {
    const gpu::detail::Plan plan =
        gpu::detail::makePlan(dst, a, b, count, sizeof(typename F::Storage));
    for (size_t t = 0; t < threads_; ++t) gpu::detail::runThread(dst, a, b, plan, f, t, threads_);
  }

  size_t threads_;
};

// Device memory for one role (a, b or dst), kept across test cases and grown when needed:
// a cudaMalloc/cudaFree pair per case would cost more than the case itself.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { gpu::freeDevice(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void upload(const std::vector<uint8_t>& image) {
    if (image.size() > capacity_) {
      gpu::freeDevice(ptr_);
      ptr_ = nullptr;
      ptr_ = static_cast<uint8_t*>(gpu::allocateDevice(image.size()));
      capacity_ = image.size();
    }
    size_ = image.size();
    gpu::copy(ptr_, image.data(), size_);
  }
  uint8_t* at(size_t offset) { return ptr_ + offset; }
  std::vector<uint8_t> image() const {
    std::vector<uint8_t> out(size_);
    gpu::copy(out.data(), ptr_, size_);
    return out;
  }

 private:
  uint8_t* ptr_ = nullptr;
  size_t capacity_ = 0;
  size_t size_ = 0;
};

class RealDevice : public Backend {
 public:
  explicit RealDevice(gpu::Stream stream) : stream_(stream) {}

  void reduce(Images& images, const Region& ra, const Region& rb, const Region& rd,
              InPlace in_place, size_t count, DataType dtype, ReduceOp op) override {
    a_.upload(images.a);
    b_.upload(images.b);
    d_.upload(images.dst);
    uint8_t* pa = a_.at(ra.start());
    uint8_t* pb = b_.at(rb.start());
    uint8_t* pd = in_place == InPlace::kIntoA   ? pa
                  : in_place == InPlace::kIntoB ? pb
                                                : d_.at(rd.start());
    gpu::reduce(pd, pa, pb, count, dtype, op, stream_);
    gpu::synchronizeStream(stream_);
    images.a = a_.image();
    images.b = b_.image();
    images.dst = d_.image();
  }

  void divide(std::vector<uint8_t>& data, const Region& region, size_t count, DataType dtype,
              size_t divisor) override {
    d_.upload(data);
    gpu::divide(d_.at(region.start()), count, dtype, divisor, stream_);
    gpu::synchronizeStream(stream_);
    data = d_.image();
  }

 private:
  gpu::Stream stream_;
  DeviceBuffer a_, b_, d_;
};

// ---- the comparison ------------------------------------------------------------------------

// Checks that `image` holds `want` in `region` and guard bytes elsewhere.
void expectImage(const std::vector<uint8_t>& image, const Region& region,
                 const std::vector<uint8_t>& want, DataType dtype, const std::string& what) {
  ASSERT_EQ(image.size(), region.total()) << what;
  for (size_t i = 0; i < image.size(); ++i) {
    if (i >= region.start() && i < region.start() + region.bytes) continue;
    ASSERT_EQ(image[i], kGuardByte) << what << ": guard byte " << i << " overwritten";
  }
  const size_t count = want.size() / sizeOf(dtype);
  const long bad = firstDifference(image.data() + region.start(), want.data(), count, dtype);
  if (bad >= 0) {
    const size_t size = sizeOf(dtype);
    const size_t at = static_cast<size_t>(bad) * size;
    FAIL() << what << ": element " << bad << " is " << hex(image.data() + region.start() + at, size)
           << ", CPU gives " << hex(want.data() + at, size);
  }
}

// Reduces random a and b of `count` elements of `dtype` with every layout (offsets of a, b
// and dst; in place into a and into b) on `backend` and compares with kernels::reduce.
// all_layouts=false tries a few layouts only (for the largest count).
void checkReduce(Backend& backend, DataType dtype, ReduceOp op, size_t count, bool all_layouts,
                 std::mt19937_64& rng) {
  const size_t size = sizeOf(dtype);
  const std::vector<uint8_t> a = randomElements(dtype, count, rng);
  const std::vector<uint8_t> b = randomElements(dtype, count, rng);
  std::vector<uint8_t> want(count * size);
  kernels::reduce(want.data(), a.data(), b.data(), count, dtype, op);

  struct Layout {
    size_t a, b, dst;
  };
  std::vector<Layout> layouts;
  if (all_layouts) {
    for (size_t oa : kOffsets) {
      for (size_t ob : kOffsets) {
        for (size_t od : kOffsets) layouts.push_back({oa, ob, od});
      }
    }
  } else {
    layouts = {{0, 0, 0}, {1, 1, 1}, {3, 3, 3}, {0, 1, 3}};
  }
  for (const Layout& layout : layouts) {
    const Region ra{layout.a * size, count * size};
    const Region rb{layout.b * size, count * size};
    const Region rd{layout.dst * size, count * size};
    const std::string what = describe(dtype, op, count) + " offsets a " + std::to_string(layout.a) +
                             " b " + std::to_string(layout.b) + " dst " +
                             std::to_string(layout.dst);
    Images images{image(ra, a), image(rb, b), image(rd, std::vector<uint8_t>(count * size, 0))};
    backend.reduce(images, ra, rb, rd, InPlace::kNone, count, dtype, op);
    expectImage(images.a, ra, a, dtype, what + " (a changed)");
    expectImage(images.b, rb, b, dtype, what + " (b changed)");
    expectImage(images.dst, rd, want, dtype, what);
    if (::testing::Test::HasFatalFailure()) return;
    // In place: dst is a (layout.a) or b (layout.b); only when a and b share the offset would
    // that be redundant, so every combination runs.
    for (InPlace mode : {InPlace::kIntoA, InPlace::kIntoB}) {
      Images in_place{image(ra, a), image(rb, b), image(rd, {})};
      backend.reduce(in_place, ra, rb, rd, mode, count, dtype, op);
      const bool into_a = mode == InPlace::kIntoA;
      expectImage(into_a ? in_place.a : in_place.b, into_a ? ra : rb, want, dtype,
                  what + (into_a ? " in place into a" : " in place into b"));
      expectImage(into_a ? in_place.b : in_place.a, into_a ? rb : ra, into_a ? b : a, dtype,
                  what + " (other input changed)");
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// Buffers at byte offsets that are not a multiple of the element size (the bytewise path).
void checkMisaligned(Backend& backend, DataType dtype, ReduceOp op, size_t count,
                     std::mt19937_64& rng) {
  const size_t size = sizeOf(dtype);
  const std::vector<uint8_t> a = randomElements(dtype, count, rng);
  const std::vector<uint8_t> b = randomElements(dtype, count, rng);
  std::vector<uint8_t> want(count * size);
  kernels::reduce(want.data(), a.data(), b.data(), count, dtype, op);
  const size_t layouts[][3] = {{1, 1, 1}, {1, 0, 0}, {0, 2, 0}, {0, 0, 3}, {3, 5, 7}};
  for (const auto& layout : layouts) {
    const Region ra{layout[0], count * size};
    const Region rb{layout[1], count * size};
    const Region rd{layout[2], count * size};
    const std::string what = describe(dtype, op, count) + " byte offsets " +
                             std::to_string(layout[0]) + "/" + std::to_string(layout[1]) + "/" +
                             std::to_string(layout[2]);
    Images images{image(ra, a), image(rb, b), image(rd, std::vector<uint8_t>(count * size, 0))};
    backend.reduce(images, ra, rb, rd, InPlace::kNone, count, dtype, op);
    expectImage(images.dst, rd, want, dtype, what);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

void checkDivide(Backend& backend, DataType dtype, size_t count, size_t divisor,
                 std::mt19937_64& rng) {
  const size_t size = sizeOf(dtype);
  const std::vector<uint8_t> data = randomElements(dtype, count, rng);
  std::vector<uint8_t> want = data;
  kernels::divide(want.data(), count, dtype, divisor);
  for (size_t offset : {size_t{0}, size, 3 * size, size_t{1}}) {
    const Region region{offset, count * size};
    std::vector<uint8_t> buffer = image(region, data);
    backend.divide(buffer, region, count, dtype, divisor);
    expectImage(buffer, region, want, dtype,
                "divide " + std::string(name(dtype)) + " count " + std::to_string(count) + " by " +
                    std::to_string(divisor) + " byte offset " + std::to_string(offset));
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Every dtype x op x length (x layout) through `backend`.
void checkAll(Backend& backend, bool include_huge) {
  std::mt19937_64 rng(20261130);
  const size_t limit = maxCount();
  for (DataType dtype : kDtypes) {
    for (ReduceOp op : kOps) {
      for (size_t count : kLengths) {
        if (count > limit || (count == kHuge && !include_huge)) continue;
        checkReduce(backend, dtype, op, count, count != kHuge, rng);
        if (::testing::Test::HasFatalFailure()) return;
      }
      if (sizeOf(dtype) > 1) {
        for (size_t count : {size_t{1}, size_t{17}, size_t{1000}}) {
          checkMisaligned(backend, dtype, op, count, rng);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

void checkAllDivides(Backend& backend) {
  std::mt19937_64 rng(7);
  const size_t limit = maxCount();
  for (DataType dtype : kDtypes) {
    for (size_t divisor :
         {size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{256}, size_t{1000}, size_t{1} << 40}) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{17}, size_t{4096 + 5}}) {
        if (count > limit) continue;
        checkDivide(backend, dtype, count, divisor, rng);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

// ---- CudaRuntime: every build ------------------------------------------------------------

TEST(CudaRuntime, CompiledInMatchesTheBuild) {
  EXPECT_EQ(gpu::compiledIn(), static_cast<bool>(RAILSHARD_TEST_EXPECT_CUDA));
  if (!gpu::compiledIn()) {
    EXPECT_FALSE(gpu::available());
    EXPECT_NE(gpu::unavailableReason().find("built without CUDA"), std::string::npos)
        << gpu::unavailableReason();
  }
}

TEST(CudaRuntime, ReasonIsEmptyExactlyWhenAvailable) {
  const std::string reason = gpu::unavailableReason();
  std::printf("cuda: available=%d devices=%d reason: %s\n", gpu::available(), gpu::deviceCount(),
              reason.empty() ? "(none)" : reason.c_str());
  if (gpu::available()) {
    EXPECT_TRUE(reason.empty()) << reason;
    EXPECT_GT(gpu::deviceCount(), 0);
    return;
  }
  EXPECT_EQ(gpu::deviceCount(), 0);
  ASSERT_FALSE(reason.empty());
  std::string lowered = reason;
  for (char& c : lowered) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // "built without CUDA ...", "no NVIDIA driver ...", "no CUDA device ...": names the cause.
  EXPECT_TRUE(lowered.find("without cuda") != std::string::npos ||
              lowered.find("driver") != std::string::npos ||
              lowered.find("device") != std::string::npos)
      << reason;
  // Asked again, the same answer (checked once per process).
  EXPECT_EQ(gpu::unavailableReason(), reason);
}

TEST(CudaRuntime, HostPointersAreHost) {
  int on_stack = 0;
  auto on_heap = std::make_unique<std::vector<double>>(1000);
  EXPECT_EQ(gpu::pointerKind(&on_stack), gpu::PointerKind::kHost);
  EXPECT_EQ(gpu::pointerKind(on_heap->data()), gpu::PointerKind::kHost);
  EXPECT_EQ(gpu::pointerKind(nullptr), gpu::PointerKind::kHost);
  EXPECT_EQ(gpu::pointerKind(reinterpret_cast<const void*>(uintptr_t{0x10})),
            gpu::PointerKind::kHost);
  EXPECT_EQ(gpu::pointerDevice(&on_stack), -1);
  EXPECT_EQ(gpu::pointerDevice(nullptr), -1);
}

template <typename Fn>
void expectConfigErrorWithReason(Fn fn, const char* what) {
  try {
    fn();
    ADD_FAILURE() << what << " did not throw";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find(gpu::unavailableReason()), std::string::npos)
        << what << ": " << error.what();
  } catch (const std::exception& error) {
    ADD_FAILURE() << what << " threw something other than ConfigError: " << error.what();
  }
}

TEST(CudaRuntime, WithoutDeviceEveryCallRaisesConfigErrorWithTheReason) {
  if (gpu::available()) GTEST_SKIP() << "a device is available";
  std::vector<float> host(16, 1.0f);
  expectConfigErrorWithReason(
      [&] {
        gpu::reduce(host.data(), host.data(), host.data(), host.size(), DataType::kFloat32,
                    ReduceOp::kSum, nullptr);
      },
      "reduce");
  expectConfigErrorWithReason(
      [&] { gpu::divide(host.data(), host.size(), DataType::kFloat32, 2, nullptr); }, "divide");
  expectConfigErrorWithReason([] { gpu::allocateDevice(1024); }, "allocateDevice");
  expectConfigErrorWithReason([] { gpu::allocatePinned(1024); }, "allocatePinned");
  expectConfigErrorWithReason([] { gpu::createStream(); }, "createStream");
  expectConfigErrorWithReason([] { gpu::createEvent(); }, "createEvent");
  expectConfigErrorWithReason([] { gpu::currentDevice(); }, "currentDevice");
  expectConfigErrorWithReason([] { gpu::setDevice(0); }, "setDevice");
  expectConfigErrorWithReason([] { gpu::deviceName(0); }, "deviceName");
  expectConfigErrorWithReason([] { gpu::synchronizeStream(nullptr); }, "synchronizeStream");
  expectConfigErrorWithReason([&] { gpu::copy(host.data(), host.data(), 4); }, "copy");
  expectConfigErrorWithReason([&] { gpu::copyAsync(host.data(), host.data(), 4, nullptr); },
                              "copyAsync");
  expectConfigErrorWithReason([&] { gpu::memsetAsync(host.data(), 0, 4, nullptr); }, "memsetAsync");
  // Releasing nothing is not an error, so RAII wrappers work unchanged without a device.
  EXPECT_NO_THROW(gpu::freeDevice(nullptr));
  EXPECT_NO_THROW(gpu::freePinned(nullptr));
  EXPECT_NO_THROW(gpu::destroyStream(nullptr));
  EXPECT_NO_THROW(gpu::destroyEvent(nullptr));
}

// ---- CudaKernelBody: the kernel body on the CPU ------------------------------------------

TEST(CudaKernelBody, PlanSplitsIntoHeadVectorsTail) {
  alignas(64) static uint8_t memory[256];
  using gpu::detail::makePlan;
  // Equally misaligned f32 pointers: 3 scalars reach the boundary, then packs of 4.
  auto plan = makePlan(memory + 4, memory + 68, memory + 132, 30, 4);
  EXPECT_FALSE(plan.bytewise);
  EXPECT_EQ(plan.head, 3u);
  EXPECT_EQ(plan.vectors, 6u);
  EXPECT_EQ(plan.tail, 3u);
  // Misaligned differently: all scalar.
  plan = makePlan(memory + 4, memory + 8, memory + 128, 30, 4);
  EXPECT_EQ(plan.head, 30u);
  EXPECT_EQ(plan.vectors, 0u);
  // Not element-aligned: bytewise.
  plan = makePlan(memory + 2, memory + 64, memory + 128, 30, 4);
  EXPECT_TRUE(plan.bytewise);
  EXPECT_EQ(plan.head, 30u);
  // Fewer elements than the head would take.
  plan = makePlan(memory + 1, memory + 65, memory + 129, 5, 1);
  EXPECT_EQ(plan.head, 5u);
  EXPECT_EQ(plan.vectors + plan.tail, 0u);
  // Unary (divide): b is ignored.
  plan = makePlan(memory, memory, nullptr, 33, 8);
  EXPECT_EQ(plan.head, 0u);
  EXPECT_EQ(plan.vectors, 16u);
  EXPECT_EQ(plan.tail, 1u);
}

TEST(CudaKernelBody, MatchesCpuOnOneThread) {
  EmulatedGrid grid(1);
  checkAll(grid, false);
}

TEST(CudaKernelBody, MatchesCpuOnAGridSmallerThanTheWork) {
  EmulatedGrid grid(37);
  checkAll(grid, false);  // the largest length runs on the device only: it adds no new split
}

TEST(CudaKernelBody, MatchesCpuOnAGridLargerThanTheWork) {
  EmulatedGrid grid(2048);
  std::mt19937_64 rng(3);
  for (DataType dtype : kDtypes) {
    for (size_t count : {size_t{1}, size_t{17}, size_t{255}}) {
      checkReduce(grid, dtype, ReduceOp::kSum, count, true, rng);
      checkReduce(grid, dtype, ReduceOp::kMin, count, true, rng);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(CudaKernelBody, DivideMatchesCpu) {
  EmulatedGrid grid(37);
  checkAllDivides(grid);
}

// ---- CudaDevice: the kernels on a GPU ------------------------------------------------------

class CudaDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu::available()) GTEST_SKIP() << "no usable CUDA device: " << gpu::unavailableReason();
    gpu::setDevice(0);
    stream_ = gpu::createStream();
  }
  void TearDown() override {
    if (stream_ != nullptr) gpu::destroyStream(stream_);
  }
  gpu::Stream stream_ = nullptr;
};

TEST_F(CudaDevice, DescribesTheDevice) {
  const std::string device = gpu::deviceName(0);
  std::printf("device 0: %s (%d devices)\n", device.c_str(), gpu::deviceCount());
  EXPECT_NE(device.find("sm_"), std::string::npos) << device;
  EXPECT_EQ(gpu::currentDevice(), 0);
  EXPECT_THROW(gpu::setDevice(gpu::deviceCount()), InvalidArgument);
  EXPECT_THROW(gpu::deviceName(-1), InvalidArgument);
}

TEST_F(CudaDevice, ReduceMatchesCpuForEveryDtypeOpLengthAndLayout) {
  RealDevice device(stream_);
  checkAll(device, true);
}

TEST_F(CudaDevice, DivideMatchesCpu) {
  RealDevice device(stream_);
  checkAllDivides(device);
}

TEST_F(CudaDevice, PointerKinds) {
  void* device = gpu::allocateDevice(4096);
  void* pinned = gpu::allocatePinned(4096);
  std::vector<char> pageable(4096);
  EXPECT_EQ(gpu::pointerKind(device), gpu::PointerKind::kDevice);
  EXPECT_EQ(gpu::pointerKind(static_cast<char*>(device) + 100), gpu::PointerKind::kDevice);
  EXPECT_EQ(gpu::pointerDevice(device), 0);
  EXPECT_EQ(gpu::pointerKind(pinned), gpu::PointerKind::kHost);
  EXPECT_EQ(gpu::pointerDevice(pinned), -1);
  EXPECT_EQ(gpu::pointerKind(pageable.data()), gpu::PointerKind::kHost);
  gpu::freeDevice(device);
  gpu::freePinned(pinned);
  // A freed pointer is unknown to CUDA: host, and the failed query leaves no error behind
  // for the next launch to report.
  EXPECT_EQ(gpu::pointerKind(device), gpu::PointerKind::kHost);
  EXPECT_EQ(gpu::allocateDevice(0), nullptr);
  std::mt19937_64 rng(1);
  RealDevice backend(stream_);
  checkReduce(backend, DataType::kFloat32, ReduceOp::kSum, 100, false, rng);
}

TEST_F(CudaDevice, ErrorsNameTheCallAndDoNotLinger) {
  try {
    gpu::allocateDevice(size_t{1} << 62);
    FAIL() << "a 4 EiB cudaMalloc succeeded";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("cudaMalloc failed: cudaErrorMemoryAllocation"),
              std::string::npos)
        << error.what();
  }
  // The next launch must not report the old failure.
  std::mt19937_64 rng(2);
  RealDevice backend(stream_);
  checkReduce(backend, DataType::kInt32, ReduceOp::kMax, 1000, false, rng);
}

TEST_F(CudaDevice, InvalidArgumentsNameTheValue) {
  void* buffer = gpu::allocateDevice(64);
  try {
    gpu::reduce(buffer, buffer, buffer, 4, static_cast<DataType>(99), ReduceOp::kSum, stream_);
    ADD_FAILURE() << "dtype 99 accepted";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("99"), std::string::npos) << error.what();
  }
  try {
    gpu::reduce(buffer, buffer, buffer, 4, DataType::kFloat32, static_cast<ReduceOp>(42), stream_);
    ADD_FAILURE() << "op 42 accepted";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("42"), std::string::npos) << error.what();
  }
  EXPECT_THROW(gpu::divide(buffer, 4, DataType::kFloat32, 0, stream_), InvalidArgument);
  EXPECT_THROW(gpu::divide(buffer, 4, DataType::kFloat32, size_t{1} << 63, stream_),
               InvalidArgument);
  EXPECT_THROW(gpu::divide(buffer, 4, static_cast<DataType>(7), 2, stream_), InvalidArgument);
  // count 0 launches nothing, whatever the pointers.
  EXPECT_NO_THROW(
      gpu::reduce(nullptr, nullptr, nullptr, 0, DataType::kFloat32, ReduceOp::kSum, stream_));
  EXPECT_NO_THROW(gpu::divide(nullptr, 0, DataType::kFloat32, 3, stream_));
  gpu::synchronizeStream(stream_);
  gpu::freeDevice(buffer);
}

// Copy in, reduce, copy out, all queued on one created stream, then a second stream that
// waits on an event: the results must be those of the reduction.
TEST_F(CudaDevice, StreamOrdering) {
  constexpr size_t kCount = (size_t{1} << 22) + 3;
  const size_t bytes = kCount * sizeof(float);
  std::vector<float> a(kCount), b(kCount), want(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    a[i] = static_cast<float>(i % 1000) * 0.5f;
    b[i] = static_cast<float>(i % 77) - 30.0f;
  }
  kernels::reduce(want.data(), a.data(), b.data(), kCount, DataType::kFloat32, ReduceOp::kSum);
  auto* pinned = static_cast<float*>(gpu::allocatePinned(bytes));
  void* da = gpu::allocateDevice(bytes);
  void* db = gpu::allocateDevice(bytes);
  gpu::memsetAsync(da, 0xff, bytes, stream_);  // NaN everywhere until the copy lands
  gpu::copyAsync(da, a.data(), bytes, stream_);
  gpu::copyAsync(db, b.data(), bytes, stream_);
  gpu::reduce(da, da, db, kCount, DataType::kFloat32, ReduceOp::kSum, stream_);
  gpu::copyAsync(pinned, da, bytes, stream_);
  gpu::synchronizeStream(stream_);
  EXPECT_EQ(std::memcmp(pinned, want.data(), bytes), 0);

  // Second round: reduce again on stream_, and copy out on another stream after an event.
  kernels::reduce(want.data(), want.data(), b.data(), kCount, DataType::kFloat32, ReduceOp::kSum);
  gpu::Stream other = gpu::createStream();
  gpu::Event done = gpu::createEvent();
  gpu::reduce(da, da, db, kCount, DataType::kFloat32, ReduceOp::kSum, stream_);
  gpu::recordEvent(done, stream_);
  gpu::streamWaitEvent(other, done);
  gpu::copyAsync(pinned, da, bytes, other);
  gpu::synchronizeStream(other);
  EXPECT_TRUE(gpu::eventDone(done));
  EXPECT_EQ(std::memcmp(pinned, want.data(), bytes), 0);
  gpu::destroyEvent(done);
  gpu::destroyStream(other);
  gpu::freeDevice(da);
  gpu::freeDevice(db);
  gpu::freePinned(pinned);
}

}  // namespace
}  // namespace railshard
