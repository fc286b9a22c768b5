#pragma once

#include <cstdint>
#include <optional>

#include "transport/messaging/message_book.h"
#include "transport/request.h"

namespace railshard::transport::messaging {

// The layer that owns a peer's messages (its MessageBook), as a link that carries some of their
// pieces sees it. Called from the link's progress thread, with none of the link's locks held.
class PieceSink {
 public:
  virtual ~PieceSink() = default;

  struct Landing {
    uint8_t* target = nullptr;       // where the piece's `length` payload bytes go
    std::optional<Problem> problem;  // the piece must not land: the link fails with it
  };
  // A piece's header arrived from `peer`: before a payload byte is read.
  virtual Landing pieceArriving(int peer, const PieceInfo& piece) = 0;
  // `bytes` of that piece's payload are at the target: all of it, or what arrived before the
  // connection carrying it broke (possibly 0); the rest then comes again as another piece, at
  // offset + bytes.
  virtual void pieceLanded(int peer, const PieceInfo& piece, uint64_t bytes) = 0;
};

// Connections to every peer that carry pieces of another layer's messages beside their own:
// the shape of Gloo's Pair (post a piece with a completion; report failure through the
// transport's poisoning; describe its rate). The TCP transport is one, so the RDMA transport
// can stripe a message over its lanes and the TCP connections together.
class PieceLink {
 public:
  virtual ~PieceLink() = default;

  // Where arriving pieces go; set before any peer sends one. Setting another (or null)
  // returns once no call into the previous sink runs.
  virtual void setPieceSink(PieceSink* sink) = 0;
  // Starts sending `piece.length` bytes from `data` (the piece's own bytes, at piece.offset of
  // its message) to `peer`; `data` must stay valid until the request completes. Null when the
  // link has failed or lost the peer (its error says why).
  virtual RequestPtr sendPiece(int peer, const PieceInfo& piece, const void* data) = 0;
  // Nominal rate to `peer` in Gbit/s (the sum of its rails), 0 when unknown.
  virtual double pieceGbps(int peer) const = 0;
  // Payload bytes of pieces sent to `peer` so far.
  virtual uint64_t pieceBytesSent(int peer) const = 0;
};

}  // namespace railshard::transport::messaging
