#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/clock.h"
#include "transport/links/link.h"
#include "transport/messaging/message_book.h"
#include "transport/messaging/out_frame.h"

namespace railshard::transport::messaging {

// Where a message can be read (the sender's buffer, in an offer) or written (the receiver's,
// in a grant): its address and, per link of the pair (by index), the key of its registration
// there (0: not registered there). Little-endian on the wire.
struct MemoryDescriptor {
  uint64_t address = 0;
  std::vector<uint64_t> keys;
  std::string encode() const;
  // ProtocolError naming what is wrong unless `bytes` describes a buffer for `links` links.
  static MemoryDescriptor decode(const std::vector<uint8_t>& bytes, size_t links);
};

// One large message moved in place over the one-sided links (messenger_rendezvous.cc): read by
// the receiver from the sender's registered buffer, or written by the sender into the buffer
// the receiver granted. Each rank keeps one per message while its part runs.
struct Rendezvous {
  struct Piece {
    int link = 0;
    uint64_t offset = 0;
    uint64_t length = 0;
    Clock::time_point posted{};
    int64_t trace_ns = 0;
  };
  bool write = false;  // the sender writes (else the receiver reads)
  uint64_t message = 0;
  uint64_t total = 0;
  // The sender's side. Weak: the send holds its rendezvous (SendOp::rendezvous), and a
  // strong pointer back made a cycle that outlived every rendezvous (LeakSanitizer).
  std::weak_ptr<SendOp> send;
  IncomingPtr entry;                   // the receiver's side: the message in its book
  uint8_t* local = nullptr;            // this rank's buffer: the send's data, or where it lands
  std::vector<uint8_t> bounce;         // a receive in GPU memory: moved here, then copied in
  std::vector<links::MemoryKey> keys;  // this rank's registrations, by link
  MemoryDescriptor remote;             // the peer's buffer and keys
  // The pieces this rank moves: not yet posted (by link), and in flight (by cookie).
  std::vector<std::deque<Piece>> queued;
  std::map<uint64_t, Piece> in_flight;
  uint64_t links_used = 0;  // a bit per link a piece went on: an end goes behind them on each
  uint64_t ends_seen = 0;   // the peer's ends so far (a bit per link)
  bool granted = false;     // the sender's: a grant arrived (a second one is ignored)
  bool finished = false;    // the sender's: its buffer is no longer needed
};

}  // namespace railshard::transport::messaging
