#pragma once

#include <cstdint>
#include <string_view>

namespace railshard {

// FNV-1a, 64 bit: a fast, stable fingerprint for comparing things across ranks (topology
// graphs, dispatch plans) and for short store keys. Not cryptographic: it catches
// disagreement, not adversaries.
class Fnv1a {
 public:
  Fnv1a& add(std::string_view bytes) {
    for (const char c : bytes) byte(static_cast<unsigned char>(c));
    return *this;
  }
  Fnv1a& add(uint64_t value) {
    for (int i = 0; i < 8; ++i) byte(static_cast<unsigned char>(value >> (8 * i)));
    return *this;
  }
  uint64_t value() const { return hash_; }

 private:
  void byte(unsigned char b) {
    hash_ ^= b;
    hash_ *= 0x100000001b3ULL;
  }
  uint64_t hash_ = 0xcbf29ce484222325ULL;
};

}  // namespace railshard
