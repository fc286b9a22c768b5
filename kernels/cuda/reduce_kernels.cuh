#pragma once

// The body of the CUDA reductions, shared by reduce_kernels.cu (where a __global__ wrapper
// runs it once per GPU thread) and tests/cuda_kernels_test.cc (where the host compiler runs it
// for every thread of a pretend grid in turn). That is how the vector/head/tail/bytewise
// indexing and the element semantics are checked against kernels::reduce on machines without
// a GPU. Everything here is plain C++ unless nvcc compiles it; only the f16/bf16 conversions
// differ on the device (one cvt instruction instead of kernels/half.h's bit arithmetic, with
// the same round-to-nearest-even result; only a NaN's payload may differ).
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "base/types.h"
#include "kernels/half.h"
#include "kernels/wrap_type.h"

#if defined(__CUDACC__)
#define RAILSHARD_HOST_DEVICE __host__ __device__
#else
#define RAILSHARD_HOST_DEVICE
#endif

namespace railshard::kernels::cuda::detail {

// One 16-byte load or store (ld.global.v4 on the device) carries kVectorBytes / sizeof(T)
// elements; it needs the address 16-byte aligned.
inline constexpr size_t kVectorBytes = 16;

// How one call splits its elements. Vector path: `head` scalar elements bring the three
// pointers (equally misaligned) to a 16-byte boundary, then `vectors` 16-byte packs, then
// `tail` scalar elements. Scalar path (pointers misaligned differently): head = count.
// Bytewise path (a pointer not even aligned to the element size, which a scalar load would
// fault on): head = count, every element assembled from single bytes.
struct Plan {
  size_t head = 0;
  size_t vectors = 0;
  size_t tail = 0;
  bool bytewise = false;
};

// b == nullptr for unary operations (divide).
inline Plan makePlan(const void* dst, const void* a, const void* b, size_t count, size_t size) {
  Plan plan;
  const auto d = reinterpret_cast<uintptr_t>(dst);
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = b != nullptr ? reinterpret_cast<uintptr_t>(b) : d;
  if (d % size != 0 || x % size != 0 || y % size != 0) {
    plan.head = count;
    plan.bytewise = true;
    return plan;
  }
  const uintptr_t misalignment = d % kVectorBytes;
  if (x % kVectorBytes != misalignment || y % kVectorBytes != misalignment) {
    plan.head = count;
    return plan;
  }
  const size_t lead = (kVectorBytes - misalignment) % kVectorBytes / size;
  plan.head = lead < count ? lead : count;
  const size_t lanes = kVectorBytes / size;
  plan.vectors = (count - plan.head) / lanes;
  plan.tail = count - plan.head - plan.vectors * lanes;
  return plan;
}

// The most threads any loop of a plan can keep busy; the grid never needs more.
inline size_t parallelism(const Plan& plan) {
  size_t most = plan.head;
  if (plan.vectors > most) most = plan.vectors;
  if (plan.tail > most) most = plan.tail;
  return most;
}

// ---- element types: how each DataType is stored and in which type it is computed ----------

template <typename T>
struct Plain {
  using Storage = T;
  using Compute = T;
  RAILSHARD_HOST_DEVICE static Compute load(Storage value) { return value; }
  RAILSHARD_HOST_DEVICE static Storage store(Compute value) { return value; }
};

struct Half {
  using Storage = uint16_t;
  using Compute = float;
  RAILSHARD_HOST_DEVICE static float load(uint16_t value) {
#if defined(__CUDA_ARCH__)
    float result;
    asm("cvt.f32.f16 %0, %1;" : "=f"(result) : "h"(value));
    return result;
#else
    return halfToFloat(value);
#endif
  }
  RAILSHARD_HOST_DEVICE static uint16_t store(float value) {
#if defined(__CUDA_ARCH__)
    // Round to nearest even, subnormals kept, overflow to Inf (no .ftz, no .sat).
    uint16_t result;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(result) : "f"(value));
    return result;
#else
    return floatToHalf(value);
#endif
  }
};

struct BFloat16 {
  using Storage = uint16_t;
  using Compute = float;
  RAILSHARD_HOST_DEVICE static float load(uint16_t value) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(static_cast<uint32_t>(value) << 16);
#else
    return bf16ToFloat(value);
#endif
  }
  RAILSHARD_HOST_DEVICE static uint16_t store(float value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint16_t result;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(result) : "f"(value));
    return result;
#elif defined(__CUDA_ARCH__)
    // Before sm_80 there is no bf16 cvt: kernels/half.h's integer rounding, with CUDA's bit
    // casts instead of memcpy.
    const uint32_t bits = __float_as_uint(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
    return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
#else
    return floatToBf16(value);
#endif
  }
};

// ---- operators, exactly those of kernels/reduce_portable.cc --------------------------------

// Integers wrap: computed in their unsigned twin (kernels/wrap_type.h).

struct Sum {
  template <typename T>
  RAILSHARD_HOST_DEVICE static T apply(T x, T y) {
    return static_cast<T>(static_cast<Wrap<T>>(x) + static_cast<Wrap<T>>(y));
  }
};
struct Prod {
  template <typename T>
  RAILSHARD_HOST_DEVICE static T apply(T x, T y) {
    return static_cast<T>(static_cast<Wrap<T>>(x) * static_cast<Wrap<T>>(y));
  }
};
// x unless y is strictly smaller (larger): a NaN in x is kept, a NaN in y ignored, and
// min(+0, -0) is x's zero. Written as a compare and select on purpose: fminf/min.f32 would
// return the non-NaN operand and order -0 below +0.
struct Min {
  template <typename T>
  RAILSHARD_HOST_DEVICE static T apply(T x, T y) {
    return y < x ? y : x;
  }
};
struct Max {
  template <typename T>
  RAILSHARD_HOST_DEVICE static T apply(T x, T y) {
    return x < y ? y : x;
  }
};

// dst = a op b, computed in the element's compute type and stored once (one rounding).
template <typename Element, typename Op>
struct Reducer {
  using Storage = typename Element::Storage;
  static constexpr bool kBinary = true;
  RAILSHARD_HOST_DEVICE Storage operator()(Storage x, Storage y) const {
    return Element::store(Op::apply(Element::load(x), Element::load(y)));
  }
};

// data /= divisor as kernels::divide: integers in int64 truncating toward zero, floating
// types by the divisor converted (on the host, as the CPU path does) to the compute type.
template <typename Element>
struct Divider {
  using Storage = typename Element::Storage;
  using Compute = typename Element::Compute;
  using Divisor = std::conditional_t<std::is_integral_v<Compute>, int64_t, Compute>;
  static constexpr bool kBinary = false;
  Divisor divisor;
  RAILSHARD_HOST_DEVICE Storage operator()(Storage x, Storage) const {
    if constexpr (std::is_integral_v<Compute>) {
      return static_cast<Storage>(static_cast<int64_t>(x) / divisor);
    } else {
      return Element::store(Element::load(x) / divisor);
    }
  }
};

// ---- the body ------------------------------------------------------------------------------

template <typename T>
struct alignas(kVectorBytes) Pack {
  T lanes[kVectorBytes / sizeof(T)];
};

// An element at any byte address; only for the bytewise path.
template <typename T>
RAILSHARD_HOST_DEVICE T loadBytes(const unsigned char* from) {
  T value;
  auto* to = reinterpret_cast<unsigned char*>(&value);
  for (size_t k = 0; k < sizeof(T); ++k) to[k] = from[k];
  return value;
}
template <typename T>
RAILSHARD_HOST_DEVICE void storeBytes(unsigned char* to, T value) {
  const auto* from = reinterpret_cast<const unsigned char*>(&value);
  for (size_t k = 0; k < sizeof(T); ++k) to[k] = from[k];
}

// What one thread (`thread` of `threads`) does: its share of each part of the plan, grid-
// stride. Each element is read and written by the same thread within one iteration, so dst
// may alias a or b. F::kBinary false: b is never read (and may be null).
template <typename F>
RAILSHARD_HOST_DEVICE void runThread(void* dst, const void* a, const void* b, const Plan& plan,
                                     const F& f, size_t thread, size_t threads) {
  using T = typename F::Storage;
  constexpr size_t kLanes = kVectorBytes / sizeof(T);
  if (plan.bytewise) {
    auto* d = static_cast<unsigned char*>(dst);
    const auto* x = static_cast<const unsigned char*>(a);
    const auto* y = static_cast<const unsigned char*>(b);
    for (size_t i = thread; i < plan.head; i += threads) {
      const size_t at = i * sizeof(T);
      const T other = F::kBinary ? loadBytes<T>(y + at) : T{};
      storeBytes(d + at, f(loadBytes<T>(x + at), other));
    }
    return;
  }
  auto* d = static_cast<T*>(dst);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = thread; i < plan.head; i += threads) d[i] = f(x[i], F::kBinary ? y[i] : T{});

  auto* dv = reinterpret_cast<Pack<T>*>(d + plan.head);
  const auto* xv = reinterpret_cast<const Pack<T>*>(x + plan.head);
  const auto* yv = reinterpret_cast<const Pack<T>*>(F::kBinary ? y + plan.head : nullptr);
  for (size_t v = thread; v < plan.vectors; v += threads) {
    const Pack<T> p = xv[v];
    Pack<T> q{};
    if constexpr (F::kBinary) q = yv[v];
    Pack<T> r;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (size_t lane = 0; lane < kLanes; ++lane) r.lanes[lane] = f(p.lanes[lane], q.lanes[lane]);
    dv[v] = r;
  }

  const size_t start = plan.head + plan.vectors * kLanes;
  for (size_t i = start + thread; i < start + plan.tail; i += threads) {
    d[i] = f(x[i], F::kBinary ? y[i] : T{});
  }
}

// ---- from (dtype, op) to the operator type --------------------------------------------------

// Calls visit(Element{}) with the element type of `dtype` (which must be valid).
template <typename Visitor>
void visitElement(DataType dtype, Visitor&& visit) {
  switch (dtype) {
    case DataType::kFloat32:
      return visit(Plain<float>{});
    case DataType::kFloat64:
      return visit(Plain<double>{});
    case DataType::kFloat16:
      return visit(Half{});
    case DataType::kBFloat16:
      return visit(BFloat16{});
    case DataType::kInt32:
      return visit(Plain<int32_t>{});
    case DataType::kInt64:
      return visit(Plain<int64_t>{});
    case DataType::kUInt8:
      return visit(Plain<uint8_t>{});
  }
}

// Calls visit(f) with the Reducer for (dtype, op), both valid; kAvg reduces as kSum.
template <typename Visitor>
void visitReducer(DataType dtype, ReduceOp op, Visitor&& visit) {
  visitElement(dtype, [&](auto element) {
    using Element = decltype(element);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return visit(Reducer<Element, Sum>{});
      case ReduceOp::kProd:
        return visit(Reducer<Element, Prod>{});
      case ReduceOp::kMin:
        return visit(Reducer<Element, Min>{});
      case ReduceOp::kMax:
        return visit(Reducer<Element, Max>{});
    }
  });
}

// Calls visit(f) with the Divider for `dtype` (valid) and divisor (1 .. INT64_MAX), the
// divisor converted on the host exactly as kernels::divide converts it.
template <typename Visitor>
void visitDivider(DataType dtype, size_t divisor, Visitor&& visit) {
  visitElement(dtype, [&](auto element) {
    using D = Divider<decltype(element)>;
    visit(D{static_cast<typename D::Divisor>(divisor)});
  });
}

}  // namespace railshard::kernels::cuda::detail
