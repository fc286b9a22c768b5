#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "transport/message_tag.h"
#include "transport/request.h"
#include "transport/transport.h"

namespace railshard::transport::messaging {

// Largest message staged when it arrives before its receive is posted. Bounds what a confused
// or hostile peer can make a rank allocate.
constexpr uint64_t kMaxStagedBytes = uint64_t{1} << 34;

// What went wrong with a message; the transport poisons itself with it (every rank then
// raises it, or the abort it forwards).
struct Problem {
  ErrorKind kind = ErrorKind::kMismatch;
  std::string text;
};

// What a piece of a message says about itself on arrival (its frame header, whatever the link).
struct PieceInfo {
  uint64_t message = 0;  // per-peer message number
  MessageTag tag;
  uint64_t total = 0;  // bytes of the whole message
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Where a chosen receive puts the message that arrived for it (or why it refuses it).
struct Choice {
  uint8_t* data = nullptr;
  std::optional<Problem> problem;
};
using Chooser = std::function<Choice(const MessageTag& tag, uint64_t total)>;

// One message being received from the peer: a posted receive, or one whose first piece came
// before its receive was posted, then staged in `staged` until it is complete (and copied
// into the receive's buffer once, at completion, when the receive was posted meanwhile).
struct Incoming {
  MessageTag tag;
  uint64_t total = 0;
  uint64_t landed = 0;      // bytes of it that arrived
  RequestPtr request;       // the posted receive; null while nobody asked for it
  uint8_t* user = nullptr;  // that receive's buffer
  bool staging = false;     // pieces land in `staged`, not in `user`
  // A receive that chooses its buffer once the message says its tag and size (postChosen);
  // empty once chosen, and for every other receive.
  Chooser choose;
  std::vector<uint8_t> staged;  // the early message (staging only)
  uint8_t* base() { return staging ? staged.data() : user; }
};
using IncomingPtr = std::shared_ptr<Incoming>;

// Messages between this rank and one peer, whatever links carry them: the numbering of both
// directions (messages match in posting order, FIFO per direction), posted receives, early
// messages staged until their receive is posted, and every check an arriving piece passes
// before a byte of it lands: the collective tag and size against the posted receive (a
// MismatchError names both sides), a piece of a message already complete, pieces that
// disagree, a piece beyond its message. Pieces land whole or not at all (a link that breaks
// mid-piece lands nothing of it; the messenger re-sends it whole on another link, and never
// twice: messenger.h), so they are counted in bytes. Pure logic, no I/O and no lock (the
// caller holds its peer's), so it is tested on synthetic arrivals.
class MessageBook {
 public:
  // `formatter` words tags and disagreements for error texts; it must outlive the book.
  MessageBook(int my_rank, int peer, const TagFormatter* formatter);

  // The number of the next message sent to the peer.
  uint64_t numberSend() { return next_send_++; }
  uint64_t sent() const { return next_send_; }

  // A receive of `bytes` into `data`, completed by `request`, for the peer's next message.
  struct Posted {
    uint64_t message = 0;
    std::optional<Problem> problem;  // the early message disagrees with the receive
    // The early message had fully arrived: the caller copies `complete->staged` into
    // `data` and completes the request (the book has forgotten it).
    IncomingPtr complete;
  };
  Posted post(RequestPtr request, void* data, uint64_t bytes, const MessageTag& tag);
  // A receive for the peer's next message whatever its tag and size: `choose` sees them
  // before a byte lands (when its first piece arrives, or now when it is staged already) and
  // says where it goes, or refuses it. NCCL's receives are of this kind: a buffer may be
  // larger than what was sent, and the buffers of a grouped receive are told apart by tag.
  Posted postChosen(RequestPtr request, Chooser choose);
  // Whether the next receive would find its message (or its first piece) already here.
  bool nextArrived() const;
  // That message's tag, or null while it has not begun to arrive (a receive from any source
  // reads it to choose the peer).
  const MessageTag* nextArrivedTag() const;
  uint64_t received() const { return next_recv_; }

  // A piece arrives; `unsolicited` says whether a message nobody asked for yet is of another
  // collective than the one this rank is in (the mismatch text), as CurrentCollective does.
  struct Arrival {
    IncomingPtr entry;  // where it goes: entry->base() + offset; null when wrong
    std::optional<Problem> problem;
  };
  using UnsolicitedCheck = std::function<std::optional<std::string>(const MessageTag&)>;
  Arrival arrive(const PieceInfo& piece, const UnsolicitedCheck& unsolicited);
  // `bytes` of the message landed where arrive() said (a whole piece). Returns the entry when
  // that completed a posted receive: the caller copies `staged` into `user` when `staging`,
  // then completes `request`.
  IncomingPtr landed(uint64_t message, Incoming& entry, uint64_t bytes);

  // Whether a posted receive waits for a message numbered `from` or later.
  bool awaitsFrom(uint64_t from) const;
  bool awaitsAny() const { return awaitsFrom(0); }
  // The first early message nobody asked for that `unsolicited` calls a mismatch.
  std::optional<std::string> checkStaged(const UnsolicitedCheck& unsolicited) const;
  // After a failure: forgets every message (user buffers are off limits from now on).
  void clear() { incoming_.clear(); }

 private:
  std::string sizeMismatch(const MessageTag& tag, uint64_t expected, uint64_t sent) const;
  std::string tagMismatch(const MessageTag& mine, const MessageTag& theirs) const;
  std::string from() const;
  // A chosen receive learns its message: its buffer, tag and size from now on.
  std::optional<Problem> choose(Incoming& entry, const MessageTag& tag, uint64_t total);

  int my_rank_;
  int peer_;
  const TagFormatter* formatter_;
  uint64_t next_send_ = 0;
  uint64_t next_recv_ = 0;
  std::map<uint64_t, IncomingPtr> incoming_;  // by message number
};

}  // namespace railshard::transport::messaging
