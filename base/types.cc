#include "base/types.h"

#include <array>
#include <string>

namespace railshard {
namespace {

struct DataTypeInfo {
  DataType dtype;
  size_t size;
  std::string_view name;
  std::array<std::string_view, 4> aliases;
};

constexpr std::array<DataTypeInfo, kNumDataTypes> kDataTypes{{
    {DataType::kFloat32, 4, "float", {"f32", "float32", "fp32", ""}},
    {DataType::kFloat64, 8, "double", {"f64", "float64", "fp64", ""}},
    {DataType::kFloat16, 2, "half", {"f16", "float16", "fp16", ""}},
    {DataType::kBFloat16, 2, "bfloat16", {"bf16", "", "", ""}},
    {DataType::kInt32, 4, "int32", {"int", "i32", "", ""}},
    {DataType::kInt64, 8, "int64", {"i64", "long", "", ""}},
    {DataType::kUInt8, 1, "uint8", {"u8", "byte", "", ""}},
}};

constexpr std::array<std::string_view, kNumReduceOps> kOpNames{"sum", "prod", "min", "max", "avg"};

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return out;
}

}  // namespace

bool isValid(DataType dtype) {
  return static_cast<unsigned>(dtype) < kNumDataTypes;
}
bool isValid(ReduceOp op) {
  return static_cast<unsigned>(op) < kNumReduceOps;
}

size_t sizeOf(DataType dtype) {
  return isValid(dtype) ? kDataTypes[static_cast<size_t>(dtype)].size : 0;
}

std::string_view name(DataType dtype) {
  return isValid(dtype) ? kDataTypes[static_cast<size_t>(dtype)].name : "invalid-dtype";
}

std::string_view name(ReduceOp op) {
  return isValid(op) ? kOpNames[static_cast<size_t>(op)] : "invalid-op";
}

std::optional<DataType> parseDataType(std::string_view text) {
  const std::string key = lower(text);
  if (key.empty()) return std::nullopt;
  for (const auto& info : kDataTypes) {
    if (info.name == key) return info.dtype;
    for (auto alias : info.aliases) {
      if (!alias.empty() && alias == key) return info.dtype;
    }
  }
  return std::nullopt;
}

std::optional<ReduceOp> parseReduceOp(std::string_view text) {
  const std::string key = lower(text);
  for (size_t i = 0; i < kOpNames.size(); ++i) {
    if (kOpNames[i] == key) return static_cast<ReduceOp>(i);
  }
  if (key == "product") return ReduceOp::kProd;
  if (key == "mean") return ReduceOp::kAvg;
  return std::nullopt;
}

}  // namespace railshard
