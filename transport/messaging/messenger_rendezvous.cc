// The zero-copy rendezvous for large host messages over one-sided links (RDMA lanes).
//
// Read rendezvous: the sender registers its buffer with every link and sends one frame, the
// offer: where the message is and each link's key. The receiver matches it like any message
// (MessageBook: tag and size checks, early messages), registers its destination (the receive's
// buffer, or the staging buffer when the receive is not posted yet) and reads the message
// straight into it, cut into pieces striped over the links by the rail scheduler, which times
// them as it times frames. When every read is done it sends a kReadDone on each link it read
// on, behind its reads there (a read request the HCA repeated travels ahead of it on the same
// queue pair, so the sender's HCA serves it before the sender deregisters); with all of them
// the sender deregisters and the send completes. Each byte crosses the wire once and no CPU
// copies it.
//
// Write rendezvous (the sender's links cannot read, or asked for; the default on software
// devices, whose RDMA READ is slow): the offer carries nothing; the receiver registers its
// destination for remote writes and answers with a grant, the sender writes the message there
// and sends a kWritten on each link it wrote on, behind its writes; with all of them the
// receiver deregisters and the receive completes.
//
// Registration is per message (a cache of host registrations cannot see free(): a later
// buffer at the same address would be moved from the old pages). After any failure every
// registration is dropped at once under the messenger's lock, so no HCA reads or writes a user
// buffer once the caller may have freed it. Pieces on a link that fails are done again on the
// others (moving the same bytes to the same place twice is harmless); its ends come again too
// (a second one is ignored).
//
// Run over Soft-RoCE (rdma_rxe) in the qemu guest and over the in-process emulation; NOT YET RUN
// ON RDMA HARDWARE.
#include <algorithm>
#include <cstring>

#include "base/logging.h"
#include "base/trace.h"
#include "transport/messaging/messenger_internal.h"
#include "transport/messaging/rendezvous.h"

namespace railshard::transport::messaging {

namespace {

void put(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(value >> (8 * i)));
}

uint64_t get(const std::vector<uint8_t>& in, size_t& at, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{in[at++]} << (8 * i);
  return value;
}

}  // namespace

std::string MemoryDescriptor::encode() const {
  std::string out;
  put(out, address, 8);
  put(out, keys.size(), 2);
  for (uint64_t key : keys) put(out, key, 8);
  return out;
}

MemoryDescriptor MemoryDescriptor::decode(const std::vector<uint8_t>& bytes, size_t links) {
  const size_t expected = 10 + 8 * links;
  if (bytes.size() != expected) {
    throw ProtocolError("a memory descriptor of " + std::to_string(bytes.size()) +
                        " bytes (expected " + std::to_string(expected) + " for " +
                        std::to_string(links) + " links)");
  }
  size_t at = 0;
  MemoryDescriptor d;
  d.address = get(bytes, at, 8);
  const uint64_t count = get(bytes, at, 2);
  if (count != links) {
    throw ProtocolError("a memory descriptor for " + std::to_string(count) +
                        " links on a pair of " + std::to_string(links));
  }
  if (d.address == 0) throw ProtocolError("a memory descriptor with a null address");
  for (size_t i = 0; i < links; ++i) d.keys.push_back(get(bytes, at, 8));
  return d;
}

bool Messenger::registerLocked(Rendezvous& move, int access, std::string& why) {
  move.keys.assign(links_.size(), links::MemoryKey{});
  for (auto& link : links_) {
    if (!link->data() || !link->up() || !link->attributes().one_sided) continue;
    try {
      move.keys[static_cast<size_t>(link->index)] =
          link->link->registerMemory(move.local, move.total, access);
    } catch (const Error& e) {
      why = e.what();
      deregisterLocked(move);
      return false;
    }
  }
  return true;
}

void Messenger::deregisterLocked(Rendezvous& move) {
  for (size_t i = 0; i < move.keys.size(); ++i) {
    if (move.keys[i].held()) links_[i]->link->deregister(move.keys[i]);
  }
}

void Messenger::dropRegistrationsLocked() {
  for (auto* table : {&offered_, &granted_}) {
    for (auto& [message, move] : *table) deregisterLocked(*move);
    table->clear();
  }
  for (auto& move : moves_) deregisterLocked(*move);
  moves_.clear();
  cookies_.clear();
}

bool Messenger::offerLocked(const std::shared_ptr<SendOp>& op) {
  if (options_.rendezvous_bytes == 0 || op->bytes() < options_.rendezvous_bytes || op->device ||
      links_.size() > 64) {
    return false;
  }
  bool write = options_.write_rendezvous;
  for (const auto& link : links_) {
    if (!link->data()) continue;
    if (!link->attributes().one_sided) return false;  // a socket cannot take part
    if (link->up() && !link->attributes().reads) write = true;
  }
  auto move = std::make_shared<Rendezvous>();
  move->write = write;
  move->message = op->message;
  move->total = op->bytes();
  move->send = op;
  // Registration needs a writable pointer; with remote read (or local access) only, the pages
  // are never written.
  move->local = const_cast<uint8_t*>(op->data);
  std::string why;
  if (!registerLocked(*move, write ? links::kLocalRead : links::kRemoteRead, why)) {
    if (!registration_logged_) {
      registration_logged_ = true;
      RS_LOG_WARN(
          "rank {}: registering a {}-byte send buffer failed ({}): large messages are copied "
          "through the staging slots instead of moved in place",
          group_.rank, op->bytes(), why);
    }
    return false;
  }
  std::string descriptor;
  if (!write) {
    MemoryDescriptor d;
    d.address = reinterpret_cast<uint64_t>(op->data);
    for (const auto& key : move->keys) d.keys.push_back(key.remote_key);
    descriptor = d.encode();
  }
  auto offer = std::make_shared<OutFrame>();
  offer->header.kind = static_cast<uint8_t>(FrameKind::kOffer);
  offer->header.message = op->message;
  offer->header.total = op->bytes();
  offer->header.tag = op->tag();
  offer->header.length = descriptor.size();
  offer->owned = std::move(descriptor);
  offer->data = reinterpret_cast<const uint8_t*>(offer->owned.data());
  offer->op = op;
  ++op->outstanding;
  ++op->unwritten;
  op->rendezvous = move;
  offered_[op->message] = move;
  LinkState& via = at(link_of_rail_[static_cast<size_t>(scheduler_->fastest())]);
  via.queue.push_back(std::move(offer));
  markBusyLocked(via);
  pumpLocked(via);
  return true;
}

void Messenger::onOfferLocked(LinkState& link, const FrameHeader& header, Landing& landing) {
  const bool write = header.length == 0;
  MemoryDescriptor remote;
  if (!write) {
    try {
      remote = MemoryDescriptor::decode(landing.buffer, links_.size());
    } catch (const ProtocolError& e) {
      protocolErrorLocked(link.index, std::string("an offer with ") + e.what());
      return;
    }
  }
  // The whole message as one piece: the book checks it as it checks pieces of frames.
  MessageBook::Arrival arrival =
      book_.arrive(PieceInfo{header.message, header.tag, header.total, 0, header.total},
                   [&](const MessageTag& theirs) -> std::optional<std::string> {
                     if (group_.current == nullptr) return std::nullopt;
                     return group_.current->unsolicited(options_.peer, theirs);
                   });
  if (arrival.problem) {
    failLocked(arrival.problem->kind, arrival.problem->text);
    return;
  }
  auto move = std::make_shared<Rendezvous>();
  move->write = write;
  move->message = header.message;
  move->total = header.total;
  move->entry = std::move(arrival.entry);
  move->remote = std::move(remote);
  Incoming& entry = *move->entry;
  if (!entry.request) group_.wake->bump();  // an early message: a receive from any source
  if (!entry.staging && static_cast<const RecvOp&>(*entry.request).device) {
    move->bounce.resize(move->total);  // GPU memory: moved to the host, then copied in
    move->local = move->bounce.data();
  } else {
    move->local = entry.base();
  }
  std::string why;
  if (!registerLocked(*move, write ? links::kRemoteWrite : links::kLocalWrite, why)) {
    failLocked(ErrorKind::kGeneric, "rank " + std::to_string(group_.rank) + ": registering a " +
                                        std::to_string(move->total) + "-byte receive buffer for " +
                                        describe(header.tag) + " from rank " +
                                        std::to_string(options_.peer) + " failed: " + why +
                                        " (raise `ulimit -l`, or set RAILSHARD_IB_RENDEZVOUS=0 "
                                        "on every rank)");
    return;
  }
  if (write) {
    // The sender writes into it: the grant names it, ahead of this rank's queued sends, so
    // that the peer's writes wait for nothing else.
    MemoryDescriptor d;
    d.address = reinterpret_cast<uint64_t>(move->local);
    for (const auto& key : move->keys) d.keys.push_back(key.remote_key);
    auto grant = std::make_shared<OutFrame>();
    grant->owned = d.encode();
    grant->header.kind = static_cast<uint8_t>(FrameKind::kGrant);
    grant->header.message = header.message;
    grant->header.total = header.total;
    grant->header.tag = header.tag;
    grant->header.length = grant->owned.size();
    grant->data = reinterpret_cast<const uint8_t*>(grant->owned.data());
    granted_[header.message] = move;
    LinkState& via = at(link_of_rail_[static_cast<size_t>(scheduler_->fastest())]);
    via.queue.push_front(std::move(grant));
    markBusyLocked(via);
    pumpLocked(via);
    return;
  }
  planMovesLocked(*move);
  moves_.push_back(move);
  pumpOneSidedLocked();
}

void Messenger::onGrantLocked(const FrameHeader& header, const std::vector<uint8_t>& payload) {
  auto found = offered_.find(header.message);
  if (found == offered_.end() || found->second->granted || !found->second->write) {
    RS_LOG_DEBUG("rank {}: a grant for message {} from rank {} nobody waits for", group_.rank,
                 header.message, options_.peer);
    return;
  }
  const std::shared_ptr<Rendezvous> move = found->second;
  try {
    move->remote = MemoryDescriptor::decode(payload, links_.size());
  } catch (const ProtocolError& e) {
    failLocked(ErrorKind::kProtocol, "rank " + std::to_string(group_.rank) + ": " + peerName() +
                                         " sent a grant with " + e.what());
    return;
  }
  move->granted = true;
  planMovesLocked(*move);
  moves_.push_back(move);
  pumpOneSidedLocked();
}

void Messenger::planMovesLocked(Rendezvous& move) {
  // Striped as frames of the same size would be, over the links where both sides registered
  // the buffers; each link's share in pieces.
  move.queued.assign(links_.size(), {});
  std::vector<int> usable;
  for (auto& link : links_) {
    const auto i = static_cast<size_t>(link->index);
    if (link->data() && link->up() && i < move.keys.size() && move.keys[i].held() &&
        i < move.remote.keys.size() && move.remote.keys[i] != 0) {
      usable.push_back(link->index);
    }
  }
  if (usable.empty()) {
    failLocked(ErrorKind::kPeerLost, "rank " + std::to_string(group_.rank) + ": no link to " +
                                         peerName() + " can move message " +
                                         std::to_string(move.message) + " in place (" +
                                         linksSummaryLocked() + ")");
    return;
  }
  size_t next = 0;
  for (const auto& piece : scheduler_->split(move.total)) {
    int link = link_of_rail_[static_cast<size_t>(piece.rail)];
    if (std::find(usable.begin(), usable.end(), link) == usable.end()) {
      link = usable[next++ % usable.size()];
    }
    for (uint64_t done = 0; done < piece.length;) {
      const uint64_t length = std::min(kOneSidedPieceBytes, piece.length - done);
      move.queued[static_cast<size_t>(link)].push_back(
          Rendezvous::Piece{link, piece.offset + done, length, {}, 0});
      done += length;
    }
  }
}

void Messenger::pumpOneSidedLocked() {
  // A link that moves synchronously (shared memory) is done at once: those completions are
  // taken after the loop, and a pump they ask for meanwhile runs as another round.
  if (pumping_one_sided_) {
    repump_one_sided_ = true;
    return;
  }
  pumping_one_sided_ = true;
  do {
    repump_one_sided_ = false;
    std::vector<std::pair<int, uint64_t>> done;
    const std::vector<std::shared_ptr<Rendezvous>> moves = moves_;
    for (const auto& move : moves) {
      for (size_t i = 0; i < move->queued.size() && !failed(); ++i) {
        LinkState& link = *links_[i];
        auto& queue = move->queued[i];
        while (!queue.empty() && link.up() && link.link->canPostOneSided(move->write)) {
          Rendezvous::Piece piece = queue.front();
          queue.pop_front();
          piece.posted = now();
          piece.trace_ns = trace::enabled() ? trace::now() : 0;
          const uint64_t cookie = next_cookie_++;
          move->in_flight[cookie] = piece;
          move->links_used |= uint64_t{1} << i;
          cookies_[cookie] = move;
          if (link.link->postOneSided(move->write, move->local + piece.offset, move->keys[i],
                                      move->remote.address + piece.offset, move->remote.keys[i],
                                      piece.length, cookie)) {
            done.emplace_back(static_cast<int>(i), cookie);
          }
        }
      }
    }
    for (const auto& [link, cookie] : done) oneSidedDoneLocked(link, cookie);
  } while (repump_one_sided_ && !failed());
  pumping_one_sided_ = false;
}

void Messenger::oneSidedDoneLocked(int index, uint64_t cookie) {
  auto found = cookies_.find(cookie);
  if (found == cookies_.end()) return;  // its move was moved elsewhere or given up
  const std::shared_ptr<Rendezvous> move = found->second;
  cookies_.erase(found);
  auto piece_it = move->in_flight.find(cookie);
  if (piece_it == move->in_flight.end()) return;
  const Rendezvous::Piece piece = piece_it->second;
  move->in_flight.erase(piece_it);
  LinkState& link = at(index);
  // A rendezvous message's bytes count once, on the rank that reads or writes them.
  link.bytes_sent += piece.length;
  link.bytes_in_place += piece.length;
  link.last_progress = now();
  if (piece.trace_ns != 0 && trace::enabled()) {
    OutFrame shown;
    shown.header.length = piece.length;
    shown.trace_ns = piece.trace_ns;
    traceRailLocked(link, shown, move->write ? "rdma_write" : "rdma_read");
  }
  // Service time: pieces queue behind each other, so a piece's time starts when the one before
  // it on this link finished, if that was after it was posted.
  const Clock::time_point t = now();
  const Clock::time_point start = std::max(piece.posted, link.last_one_sided);
  link.last_one_sided = t;
  if (data_links_ > 1 && options_.links.weights == RailWeights::kAdaptive && t > start) {
    scheduler_->record(link.rail, piece.length, std::chrono::duration<double>(t - start).count());
  }
  const bool all_done =
      move->in_flight.empty() && std::all_of(move->queued.begin(), move->queued.end(),
                                             [](const auto& q) { return q.empty(); });
  if (all_done) oneSidedFinishedLocked(move);
  pumpOneSidedLocked();
}

void Messenger::sendEndsLocked(const Rendezvous& move, FrameKind kind) {
  const auto lanes = static_cast<uint64_t>(__builtin_popcountll(move.links_used));
  for (size_t i = 0; i < links_.size(); ++i) {
    if ((move.links_used & (uint64_t{1} << i)) == 0) continue;
    auto end = std::make_shared<OutFrame>();
    end->header.kind = static_cast<uint8_t>(kind);
    end->header.message = move.message;
    end->header.link = static_cast<uint16_t>(i);
    end->header.total = lanes;
    // Behind the pieces on the link they went on; another link when that one is down.
    LinkState* via = links_[i]->up() ? links_[i].get()
                     : dataLinkUpLocked()
                         ? &at(link_of_rail_[static_cast<size_t>(scheduler_->fastest())])
                         : nullptr;
    if (via == nullptr) return;
    via->queue.push_back(std::move(end));
    markBusyLocked(*via);
    pumpLocked(*via);
  }
}

void Messenger::oneSidedFinishedLocked(const std::shared_ptr<Rendezvous>& move) {
  moves_.erase(std::remove(moves_.begin(), moves_.end(), move), moves_.end());
  deregisterLocked(*move);
  if (failed()) return;
  if (move->write) {
    // Every write acknowledged: the send is done, its buffer no longer needed; the receiver
    // learns it from the ends behind the writes.
    offered_.erase(move->message);
    move->finished = true;
    if (auto send = move->send.lock(); send && send->outstanding == 0) completeLocked(*send);
    sendEndsLocked(*move, FrameKind::kWritten);
    return;
  }
  sendEndsLocked(*move, FrameKind::kReadDone);
  IncomingPtr done = book_.landed(move->message, *move->entry, move->total);
  if (done) {
    completeIncomingLocked(*done, !move->bounce.empty() ? move->bounce.data()
                                  : done->staging       ? done->staged.data()
                                                        : nullptr);
  }
}

void Messenger::onEndLocked(const FrameHeader& header) {
  const bool read_done = kindOf(header) == FrameKind::kReadDone;
  auto& table = read_done ? offered_ : granted_;
  auto found = table.find(header.message);
  if (found == table.end()) {
    // Sent again after the link carrying the first one failed unacknowledged: both arrived.
    RS_LOG_DEBUG("rank {}: a second end of message {} from rank {}", group_.rank, header.message,
                 options_.peer);
    return;
  }
  const std::shared_ptr<Rendezvous> move = found->second;
  if (read_done == move->write) {
    failLocked(ErrorKind::kProtocol, "rank " + std::to_string(group_.rank) + ": " + peerName() +
                                         " ended message " + std::to_string(header.message) +
                                         " as the other kind of rendezvous");
    return;
  }
  // Taken only once every link that carried pieces said so.
  move->ends_seen |= uint64_t{1} << header.link;
  if (static_cast<uint64_t>(__builtin_popcountll(move->ends_seen)) < header.total) return;
  table.erase(found);
  deregisterLocked(*move);
  if (read_done) {
    move->finished = true;
    if (auto send = move->send.lock(); send && send->outstanding == 0) completeLocked(*send);
    return;
  }
  IncomingPtr done = book_.landed(move->message, *move->entry, move->total);
  if (done) {
    completeIncomingLocked(*done, !move->bounce.empty() ? move->bounce.data()
                                  : done->staging       ? done->staged.data()
                                                        : nullptr);
  }
}

void Messenger::failOverOneSidedLocked(LinkState& link) {
  const auto failed_link = static_cast<size_t>(link.index);
  for (const auto& move : moves_) {
    std::vector<int> usable;
    for (auto& other : links_) {
      const auto i = static_cast<size_t>(other->index);
      if (other.get() != &link && other->up() && i < move->keys.size() && move->keys[i].held() &&
          move->remote.keys[i] != 0) {
        usable.push_back(other->index);
      }
    }
    if (usable.empty()) continue;  // the peer is lost: reported by the caller
    size_t next = 0;
    auto reassign = [&](Rendezvous::Piece piece) {
      piece.link = usable[next++ % usable.size()];
      move->queued[static_cast<size_t>(piece.link)].push_back(piece);
    };
    // A read or a write of the same bytes to the same place is idempotent: one that failed may
    // have landed part of its bytes; it is done again.
    for (auto it = move->in_flight.begin(); it != move->in_flight.end();) {
      if (it->second.link != link.index) {
        ++it;
        continue;
      }
      cookies_.erase(it->first);
      reassign(it->second);
      it = move->in_flight.erase(it);
    }
    if (failed_link < move->queued.size()) {
      for (const auto& piece : move->queued[failed_link]) reassign(piece);
      move->queued[failed_link].clear();
    }
  }
  pumpOneSidedLocked();
}

}  // namespace railshard::transport::messaging
