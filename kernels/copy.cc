#include "kernels/copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu_features.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace railshard::kernels {
namespace {

// Below this, memcpy's small-size paths are as good as anything.
constexpr size_t kVectorThreshold = 4096;

#if defined(__x86_64__)
__attribute__((target("avx2"))) void copyAvx2(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  size_t i = 0;
  for (; i + 128 <= bytes; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
  if (i < bytes) std::memcpy(d + i, s + i, bytes - i);
}

// The same with non-temporal stores: the destination's lines are written without being read
// first (no read-for-ownership) and without evicting the cache.
__attribute__((target("avx2"))) void streamAvx2(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  // Up to the destination's next 32-byte boundary the ordinary way.
  const size_t head = std::min(bytes, (32 - reinterpret_cast<uintptr_t>(d) % 32) % 32);
  if (head > 0) std::memcpy(d, s, head);
  size_t i = head;
  for (; i + 128 <= bytes; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
  _mm_sfence();  // the streamed stores are weakly ordered: visible before any later flag
  if (i < bytes) std::memcpy(d + i, s + i, bytes - i);
}
#endif

}  // namespace

void streamCopy(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  static const bool avx2 = cpuFeatures().avx2;
  if (avx2 && bytes >= kVectorThreshold) return streamAvx2(dst, src, bytes);
#endif
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

void copy(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  static const bool avx2 = cpuFeatures().avx2;
  if (avx2 && bytes >= kVectorThreshold) return copyAvx2(dst, src, bytes);
#endif
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

}  // namespace railshard::kernels
