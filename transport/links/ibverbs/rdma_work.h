#pragma once

#include <cstdint>

namespace railshard::transport::links::ibverbs {

// A work request's id: its lane (index in the driver, 16 bits, and the generation of the
// lane's queue pair, 16 bits; RdmaLane::id()) | kind (8) | slot or count (24).
enum class WorkKind : uint8_t { kData = 1, kCredit = 2, kRecv = 3, kRead = 4, kWrite = 5 };

inline uint64_t makeWorkId(uint32_t lane, WorkKind kind, uint32_t value) {
  return (uint64_t{lane} << 32) | (uint64_t{static_cast<uint8_t>(kind)} << 24) |
         (value & 0xffffffu);
}
inline uint32_t workLane(uint64_t id) {
  return static_cast<uint32_t>(id >> 32);
}
inline WorkKind workKind(uint64_t id) {
  return static_cast<WorkKind>((id >> 24) & 0xff);
}
inline uint32_t workValue(uint64_t id) {
  return static_cast<uint32_t>(id & 0xffffffu);
}

}  // namespace railshard::transport::links::ibverbs
