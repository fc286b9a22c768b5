#pragma once

#include <cstdint>
#include <cstring>

// IEEE binary16 and bfloat16 conversions, round-to-nearest-even, NaN and Inf preserved.
// Scalar and header-only so the portable kernels and the tests' reference share nothing but
// the bit layout (the tests carry their own reference conversion).
namespace railshard::kernels {

inline float bitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint32_t floatToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

inline float bf16ToFloat(uint16_t h) {
  return bitsToFloat(static_cast<uint32_t>(h) << 16);
}

inline uint16_t floatToBf16(float f) {
  const uint32_t bits = floatToBits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

inline float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bitsToFloat(sign | 0x7f800000u | (mant << 13));  // Inf/NaN
  if (exp == 0) {
    if (mant == 0) return bitsToFloat(sign);
    // Subnormal: normalise.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3ffu;
    return bitsToFloat(sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant << 13));
  }
  return bitsToFloat(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

inline uint16_t floatToHalf(float f) {
  const uint32_t bits = floatToBits(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to Inf
  if (abs < 0x38800000u) {
    // Result is subnormal or zero: add the magic that aligns the mantissa, let the FPU round.
    const float magic = bitsToFloat(0x3f000000u);  // 0.5
    const float v = bitsToFloat(abs) + magic;
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(floatToBits(v) - 0x3f000000u));
  }
  const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);  // round to nearest even
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

}  // namespace railshard::kernels
