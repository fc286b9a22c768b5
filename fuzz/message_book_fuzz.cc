// libFuzzer target: the messaging layer's book of one peer's messages
// (transport/messaging/message_book.h) fed what a hostile or broken peer can send: piece
// headers with any message number, tag, size, offset and length, interleaved with this
// rank's own receives. Every piece the book accepts is written where it says (base() +
// offset, `length` bytes) and counted, as the transports do, so ASan sees any piece it lets
// past its message's buffer; a broken invariant (asserted below) is a finding too.
//
// Input layout: byte 0 is unused (kept so that the corpus stays valid); then operations of 6
// bytes: kind, message, step, size, offset, length (small ranges, so that pieces meet the
// receives they belong to).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "transport/messaging/message_book.h"

namespace {

using railshard::transport::MessageTag;
using railshard::transport::Request;
using railshard::transport::messaging::IncomingPtr;
using railshard::transport::messaging::kMaxStagedBytes;
using railshard::transport::messaging::MessageBook;
using railshard::transport::messaging::PieceInfo;

void check(bool ok) {
  if (!ok) std::abort();
}

MessageTag tagOf(uint8_t step) {
  MessageTag tag;
  tag.sequence = 1;
  tag.count = 10;
  tag.collective = 1;
  tag.step = step % 4u;
  return tag;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  MessageBook book(0, 1, nullptr);
  std::deque<std::vector<uint8_t>> buffers;  // posted receives' memory, alive to the end
  for (size_t at = 1; at + 6 <= size; at += 6) {
    const uint8_t* op = data + at;
    switch (op[0] % 4) {
      case 0: {  // this rank posts a receive
        const uint64_t bytes = op[3] % 64u;
        buffers.emplace_back(bytes, 0);
        auto request = std::make_shared<Request>(Request::Kind::kRecv, 1, bytes, tagOf(op[2]));
        MessageBook::Posted posted = book.post(request, buffers.back().data(), bytes, tagOf(op[2]));
        if (posted.complete) {
          check(posted.complete->staging && posted.complete->total == bytes);
          check(posted.complete->landed == bytes);
          if (bytes > 0) std::memcpy(buffers.back().data(), posted.complete->staged.data(), bytes);
        }
        break;
      }
      case 1: {  // a piece arrives
        PieceInfo piece;
        piece.message = op[1] % 8u;
        piece.tag = tagOf(op[2]);
        piece.total = op[3] == 255 ? kMaxStagedBytes + 1 : op[3] % 64u;
        piece.offset = op[4] % 70u;
        piece.length = op[5] % 70u;
        MessageBook::Arrival arrival = book.arrive(piece, nullptr);
        check(!(arrival.entry && arrival.problem));
        if (!arrival.entry) break;
        railshard::transport::messaging::Incoming& entry = *arrival.entry;
        check(piece.offset + piece.length <= entry.total);
        check(entry.tag == piece.tag && entry.total == piece.total);
        if (piece.length > 0) std::memset(entry.base() + piece.offset, 0xAB, piece.length);
        IncomingPtr done = book.landed(piece.message, entry, piece.length);
        check(entry.landed <= entry.total);
        if (done) {
          check(done->request != nullptr && done->landed == done->total);
          if (done->staging && done->total > 0) {
            std::memcpy(done->user, done->staged.data(), done->total);
          }
        }
        break;
      }
      case 2:
        (void)book.nextArrivedTag();
        break;
      default:
        (void)book.awaitsFrom(op[1] % 8u);
        (void)book.checkStaged([](const MessageTag&) { return std::nullopt; });
        break;
    }
  }
  return 0;
}
