#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace railshard {

// Element types a collective can carry. The numeric values travel on the wire in frame
// headers, so they are fixed and must never be renumbered.
enum class DataType : uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kUInt8 = 6,
};
inline constexpr int kNumDataTypes = 7;

// Reduction operators. Wire-visible like DataType.
enum class ReduceOp : uint8_t {
  kSum = 0,
  kProd = 1,
  kMin = 2,
  kMax = 3,
  kAvg = 4,
};
inline constexpr int kNumReduceOps = 5;

// Where a collective's buffers live. kAuto asks CUDA (cudaPointerGetAttributes) when this
// build has CUDA and a device is present; otherwise every buffer is host memory.
enum class MemoryKind : uint8_t { kAuto = 0, kHost = 1, kDevice = 2 };

size_t sizeOf(DataType dtype);
// Short names as nccl-tests prints them ("float", "half", "bfloat16", "int32", ...).
std::string_view name(DataType dtype);
std::string_view name(ReduceOp op);
// Accepts the short names above plus common aliases ("f32", "fp16", "bf16", "int", "uint8").
std::optional<DataType> parseDataType(std::string_view text);
std::optional<ReduceOp> parseReduceOp(std::string_view text);
bool isValid(DataType dtype);
bool isValid(ReduceOp op);

}  // namespace railshard
