#include "core/collective_tag.h"

#include <sstream>

namespace railshard {

std::string_view name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllreduce:
      return "allreduce";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllgather:
      return "allgather";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kBarrier:
      return "barrier";
    case CollectiveKind::kAllToAll:
      return "all_to_all";
    case CollectiveKind::kPointToPoint:
      return "send/recv";
  }
  return "unknown-collective";
}

transport::MessageTag makeTag(CollectiveKind kind, uint64_t sequence, DataType dtype, ReduceOp op,
                              uint64_t count, uint32_t root) {
  transport::MessageTag tag;
  tag.collective = static_cast<uint8_t>(kind);
  tag.sequence = sequence;
  tag.dtype = static_cast<uint8_t>(dtype);
  tag.op = static_cast<uint8_t>(op);
  tag.count = count;
  tag.root = root;
  return tag;
}

namespace {

std::string kindName(uint8_t value) {
  const auto text = name(static_cast<CollectiveKind>(value));
  return text == "unknown-collective" ? "collective-" + std::to_string(value) : std::string(text);
}

bool usesOp(uint8_t kind) {
  return kind == static_cast<uint8_t>(CollectiveKind::kAllreduce) ||
         kind == static_cast<uint8_t>(CollectiveKind::kReduceScatter);
}

// The block an all-to-all message carries, in elements.
uint64_t blockCount(const transport::MessageTag& tag) {
  return uint64_t{tag.step} | (uint64_t{tag.reserved2} << 32);
}

constexpr auto kPointToPoint = static_cast<uint8_t>(CollectiveKind::kPointToPoint);
constexpr auto kAllToAll = static_cast<uint8_t>(CollectiveKind::kAllToAll);

// "message #3 of this pair (tag 7, float, count 100)": the top bit of the sequence only
// separates the pair's numbering from the collectives'.
std::string describePointToPoint(const transport::MessageTag& tag) {
  std::ostringstream out;
  out << "message #" << (tag.sequence & ~(uint64_t{1} << 63)) << " of this pair (tag " << tag.root
      << ", " << name(static_cast<DataType>(tag.dtype)) << ", count " << tag.count << ")";
  return out.str();
}

}  // namespace

std::string describeTag(const transport::MessageTag& tag) {
  std::ostringstream out;
  if (tag.collective == kPointToPoint) return "send/recv " + describePointToPoint(tag);
  out << kindName(tag.collective) << " #" << tag.sequence;
  if (tag.collective == kAllToAll) {
    out << " (" << name(static_cast<DataType>(tag.dtype));
    if (tag.step != 0 || tag.reserved2 != 0) out << ", block of " << blockCount(tag);
    out << ")";
    return out.str();
  }
  if (tag.collective == static_cast<uint8_t>(CollectiveKind::kBarrier)) return out.str();
  out << " (" << name(static_cast<DataType>(tag.dtype));
  if (usesOp(tag.collective)) out << " " << name(static_cast<ReduceOp>(tag.op));
  out << ", count " << tag.count;
  if (tag.collective == static_cast<uint8_t>(CollectiveKind::kBroadcast)) {
    out << ", root " << tag.root;
  }
  out << ")";
  return out.str();
}

std::string describeMismatch(int my_rank, const transport::MessageTag& mine, int peer,
                             const transport::MessageTag& theirs) {
  std::ostringstream out;
  const std::string me = "rank " + std::to_string(my_rank);
  const std::string them = "rank " + std::to_string(peer);
  // Point-to-point and all-to-all name what the two sides of the pair disagree on directly.
  if (mine.collective == kPointToPoint && theirs.collective == kPointToPoint) {
    out << "send/recv: " << me << " expects " << describePointToPoint(mine) << ", " << them
        << " sent " << describePointToPoint(theirs);
    return out.str();
  }
  if (mine.collective == kAllToAll && theirs.collective == kAllToAll &&
      mine.sequence == theirs.sequence && mine.dtype == theirs.dtype &&
      blockCount(mine) != blockCount(theirs)) {
    out << describeTag(mine) << ": split sizes disagree: " << me << " expects " << blockCount(mine)
        << " element(s) from " << them << ", which sends " << blockCount(theirs);
    return out.str();
  }
  out << describeTag(mine) << ": ranks disagree:";
  auto field = [&](const char* what, const std::string& a, const std::string& b) {
    if (a != b)
      out << " " << what << ": " << me << " has " << a << ", " << them << " has " << b << ";";
  };
  field("collective", kindName(mine.collective), kindName(theirs.collective));
  field("sequence", std::to_string(mine.sequence), std::to_string(theirs.sequence));
  field("dtype", std::string(name(static_cast<DataType>(mine.dtype))),
        std::string(name(static_cast<DataType>(theirs.dtype))));
  if (usesOp(mine.collective) || usesOp(theirs.collective)) {
    field("op", std::string(name(static_cast<ReduceOp>(mine.op))),
          std::string(name(static_cast<ReduceOp>(theirs.op))));
  }
  field("count", std::to_string(mine.count), std::to_string(theirs.count));
  field("root", std::to_string(mine.root), std::to_string(theirs.root));
  if (mine.collective == theirs.collective && mine.sequence == theirs.sequence &&
      mine.count == theirs.count && mine.root == theirs.root && mine.dtype == theirs.dtype &&
      mine.op == theirs.op) {
    out << " algorithm step: " << me << " expected step " << mine.step << ", " << them
        << " sent step " << theirs.step << " (different RAILSHARD_CHUNK_BYTES?);";
  }
  std::string text = out.str();
  if (!text.empty() && text.back() == ';') text.pop_back();
  return text;
}

transport::TagFormatter tagFormatter() {
  transport::TagFormatter formatter;
  formatter.describe = describeTag;
  formatter.mismatch = describeMismatch;
  return formatter;
}

}  // namespace railshard
