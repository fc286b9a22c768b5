#include "transport/messaging/message_book.h"

namespace railshard::transport::messaging {

MessageBook::MessageBook(int my_rank, int peer, const TagFormatter* formatter)
    : my_rank_(my_rank), peer_(peer), formatter_(formatter) {}

std::string MessageBook::from() const {
  return "rank " + std::to_string(my_rank_) + ": rank " + std::to_string(peer_);
}

std::string MessageBook::tagMismatch(const MessageTag& mine, const MessageTag& theirs) const {
  if (formatter_ != nullptr && formatter_->mismatch) {
    return formatter_->mismatch(my_rank_, mine, peer_, theirs);
  }
  return "rank " + std::to_string(my_rank_) + ": rank " + std::to_string(peer_) +
         " sent a message with another tag (step " + std::to_string(theirs.step) + ", expected " +
         std::to_string(mine.step) + ")";
}

std::string MessageBook::sizeMismatch(const MessageTag& tag, uint64_t expected,
                                      uint64_t sent) const {
  const std::string what = formatter_ != nullptr && formatter_->describe
                               ? formatter_->describe(tag)
                               : "message #" + std::to_string(tag.sequence);
  return "rank " + std::to_string(my_rank_) + " expected " + std::to_string(expected) +
         " bytes for " + what + " but rank " + std::to_string(peer_) + " sent " +
         std::to_string(sent) + " (do all ranks use the same RAILSHARD_CHUNK_BYTES?)";
}

MessageBook::Posted MessageBook::post(RequestPtr request, void* data, uint64_t bytes,
                                      const MessageTag& tag) {
  Posted result;
  result.message = next_recv_++;
  auto found = incoming_.find(result.message);
  if (found == incoming_.end()) {
    auto entry = std::make_shared<Incoming>();
    entry->tag = tag;
    entry->total = bytes;
    entry->request = std::move(request);
    entry->user = static_cast<uint8_t*>(data);
    incoming_.emplace(result.message, std::move(entry));
    return result;
  }
  // Its first piece came before this receive: it is being staged.
  Incoming& staged = *found->second;
  if (!(staged.tag == tag)) {
    result.problem = Problem{ErrorKind::kMismatch, tagMismatch(tag, staged.tag)};
  } else if (staged.total != bytes) {
    result.problem = Problem{ErrorKind::kMismatch, sizeMismatch(tag, bytes, staged.total)};
  } else {
    staged.request = std::move(request);
    staged.user = static_cast<uint8_t*>(data);
    if (staged.landed == staged.total) {
      result.complete = found->second;
      incoming_.erase(found);
    }
  }
  return result;
}

std::optional<Problem> MessageBook::choose(Incoming& entry, const MessageTag& tag, uint64_t total) {
  Chooser chooser = std::move(entry.choose);
  entry.choose = nullptr;
  Choice choice = chooser(tag, total);
  if (choice.problem) return choice.problem;
  if (choice.data == nullptr && total > 0) {
    return Problem{ErrorKind::kProtocol, from() + ": no buffer chosen for its message of " +
                                             std::to_string(total) + " bytes"};
  }
  entry.tag = tag;
  entry.total = total;
  entry.user = choice.data;
  return std::nullopt;
}

MessageBook::Posted MessageBook::postChosen(RequestPtr request, Chooser chooser) {
  Posted result;
  result.message = next_recv_++;
  auto found = incoming_.find(result.message);
  if (found == incoming_.end()) {
    auto entry = std::make_shared<Incoming>();
    entry->request = std::move(request);
    entry->choose = std::move(chooser);
    incoming_.emplace(result.message, std::move(entry));
    return result;
  }
  Incoming& staged = *found->second;
  staged.choose = std::move(chooser);
  const MessageTag tag = staged.tag;
  const uint64_t total = staged.total;
  if (auto problem = choose(staged, tag, total)) {
    result.problem = std::move(problem);
    return result;
  }
  staged.request = std::move(request);
  if (staged.landed == staged.total) {
    result.complete = found->second;
    incoming_.erase(found);
  }
  return result;
}

bool MessageBook::nextArrived() const {
  return incoming_.count(next_recv_) != 0;
}

const MessageTag* MessageBook::nextArrivedTag() const {
  auto it = incoming_.find(next_recv_);
  return it == incoming_.end() ? nullptr : &it->second->tag;
}

MessageBook::Arrival MessageBook::arrive(const PieceInfo& piece,
                                         const UnsolicitedCheck& unsolicited) {
  Arrival result;
  auto fail = [&](ErrorKind kind, std::string text) {
    result.problem = Problem{kind, std::move(text)};
    return result;
  };
  if (piece.offset > piece.total || piece.length > piece.total - piece.offset) {
    return fail(ErrorKind::kProtocol, from() + " sent a piece [" + std::to_string(piece.offset) +
                                          ", +" + std::to_string(piece.length) +
                                          ") outside its message of " +
                                          std::to_string(piece.total) + " bytes");
  }
  auto found = incoming_.find(piece.message);
  if (found == incoming_.end()) {
    if (piece.message < next_recv_) {
      return fail(ErrorKind::kProtocol, from() + " sent more of message " +
                                            std::to_string(piece.message) +
                                            ", which was already complete");
    }
    if (piece.total > kMaxStagedBytes) {
      return fail(ErrorKind::kMismatch, from() + " sent an unsolicited message of " +
                                            std::to_string(piece.total) + " bytes (at most " +
                                            std::to_string(kMaxStagedBytes) + " are staged)");
    }
    if (unsolicited) {
      if (auto mismatch = unsolicited(piece.tag)) return fail(ErrorKind::kMismatch, *mismatch);
    }
    auto staged = std::make_shared<Incoming>();
    staged->tag = piece.tag;
    staged->total = piece.total;
    staged->staging = true;
    staged->staged.resize(piece.total);
    found = incoming_.emplace(piece.message, std::move(staged)).first;
  }
  Incoming& entry = *found->second;
  if (entry.choose) {
    // A chosen receive's first piece: its tag and size decide where it goes.
    if (auto problem = choose(entry, piece.tag, piece.total)) {
      result.problem = std::move(problem);
      return result;
    }
  }
  if (!entry.staging && !(entry.tag == piece.tag)) {
    return fail(ErrorKind::kMismatch, tagMismatch(entry.tag, piece.tag));
  }
  if (!entry.staging && entry.total != piece.total) {
    return fail(ErrorKind::kMismatch, sizeMismatch(entry.tag, entry.total, piece.total));
  }
  if (!(entry.tag == piece.tag) || entry.total != piece.total) {
    return fail(ErrorKind::kProtocol, from() + " sent pieces of message " +
                                          std::to_string(piece.message) +
                                          " that disagree on its tag or size");
  }
  if (entry.landed + piece.length > entry.total) {
    return fail(ErrorKind::kProtocol, from() + " sent more bytes of message " +
                                          std::to_string(piece.message) + " than its size");
  }
  result.entry = found->second;
  return result;
}

IncomingPtr MessageBook::landed(uint64_t message, Incoming& entry, uint64_t bytes) {
  entry.landed += bytes;
  if (entry.landed < entry.total || !entry.request) return nullptr;
  auto found = incoming_.find(message);
  if (found == incoming_.end() || found->second.get() != &entry) return nullptr;
  IncomingPtr done = std::move(found->second);
  incoming_.erase(found);
  return done;
}

bool MessageBook::awaitsFrom(uint64_t from_message) const {
  for (auto it = incoming_.lower_bound(from_message); it != incoming_.end(); ++it) {
    if (it->second->request) return true;
  }
  return false;
}

std::optional<std::string> MessageBook::checkStaged(const UnsolicitedCheck& unsolicited) const {
  for (const auto& [message, entry] : incoming_) {
    if (entry->request) continue;
    if (auto mismatch = unsolicited(entry->tag)) return mismatch;
  }
  return std::nullopt;
}

}  // namespace railshard::transport::messaging
