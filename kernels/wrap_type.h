#pragma once

// Integer reductions wrap (two's complement): signed types are computed in their unsigned
// twin, since signed overflow is undefined in C++ and optimisers (GCC's and nvcc's) assume it
// does not happen. Shared by the CPU kernels and the CUDA kernels (compiled as C++17 there),
// so both wrap the same way.
#include <type_traits>

namespace railshard::kernels {

template <typename T, bool = std::is_integral_v<T>>
struct WrapType {
  using type = T;
};
template <typename T>
struct WrapType<T, true> {
  using type = std::make_unsigned_t<T>;
};
// T itself for floating types, its unsigned twin for integers.
template <typename T>
using Wrap = typename WrapType<T>::type;

}  // namespace railshard::kernels
