// Lanes connected when a pair first talks (RAILSHARD_IB_CONNECT=lazy, or auto beyond
// kEagerPeers RDMA peers). Eager start-up gives every lane to every RDMA peer its queue pair
// and two registered rings (2 x slots x slot_bytes, 8 MiB by default): at 64 hosts x 8 ranks
// x 8 rails that is ~32 GiB pinned per rank, while a ring or two-level all-reduce talks to
// two or three peers. A lazy lane starts out of rotation (failed, never connected, no rings)
// and is connected by the re-admission exchange (ibverbs_transport_readmit.cc): generation 1
// of its queue pair is made, published, connected and probed like any re-made lane. Sends to
// a peer made before its first lane is up wait unplanned (Peer::deferred) and are cut into
// pieces, in message order, when it is.
//
// Both sides must make their queue pair. In the collectives both do on their own: a rank
// that sends to a peer is received from by it, and a receive wants its peer too. For the rest
// (a peer that only ever sends to this rank first, a receive from any source), a rank that
// wants a peer tells it through the store: a counter per rank, `<prefix>/ib/want/<rank>`, and
// one key per notice naming who wants it; the re-admission thread reads its own counter each
// time it runs (every RAILSHARD_IB_READMIT_MS, 1 s when re-admission is off, 20 ms while an
// exchange is under way).
//
// Run over the in-process emulation and over Soft-RoCE in the qemu guest; NOT YET RUN ON RDMA
// HARDWARE.

#include "base/error.h"
#include "base/logging.h"
#include "transport/ibverbs/ibverbs_transport_internal.h"

namespace railshard::transport::ibverbs {

namespace {

constexpr auto kStoreTimeout = std::chrono::seconds(5);

}  // namespace

void IbverbsTransport::wantLocked(Peer& peer) {
  if (peer.connected || peer.wanted) return;
  peer.wanted = true;
  {
    std::lock_guard<std::mutex> lock(readmit_mutex_);  // (after mutex_: never the other way)
    readmit_kick_ = true;
  }
  readmit_wake_.notify_all();
}

bool IbverbsTransport::exchangeWanted() {
  const std::string prefix = options_.key_prefix + "/ib/want/";
  std::vector<int> tell;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (poisoned_.load()) return false;
    for (auto& peer : peers_) {
      if (!peer || !peer->wanted || peer->asked || peer->announced) continue;
      peer->announced = true;
      tell.push_back(peer->rank);
    }
  }
  bool learnt = false;
  try {
    for (int rank : tell) {
      const int64_t n = store_->add(prefix + std::to_string(rank), 1, kStoreTimeout);
      store_->setString(prefix + std::to_string(rank) + "/" + std::to_string(n),
                        std::to_string(options_.rank), kStoreTimeout);
    }
    const std::string mine = prefix + std::to_string(options_.rank);
    const int64_t notices = store_->add(mine, 0, kStoreTimeout);
    for (; wanted_seen_ < notices; ++wanted_seen_) {
      // Its writer counted it first, then names itself: the name may take a moment.
      const std::string who =
          store_->getString(mine + "/" + std::to_string(wanted_seen_ + 1), kStoreTimeout);
      int rank = -1;
      try {
        rank = std::stoi(who);
      } catch (const std::exception&) {
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (rank < 0 || rank >= options_.size || !peers_[static_cast<size_t>(rank)]) {
        RS_LOG_WARN("rank {}: ibverbs: a lane request from '{}', not an RDMA peer; ignored",
                    options_.rank, who);
        continue;
      }
      Peer& peer = *peers_[static_cast<size_t>(rank)];
      peer.asked = true;
      if (!peer.connected && !peer.wanted) {
        peer.wanted = true;
        learnt = true;
      }
    }
  } catch (const std::exception& e) {
    // The store unreachable: looked at again next time (an announcement is not repeated: the
    // peer wants this rank too in every collective).
    RS_LOG_DEBUG("rank {}: ibverbs: lane requests through the store failed: {}", options_.rank,
                 e.what());
  }
  return learnt;
}

void IbverbsTransport::peerConnectedLocked(Peer& peer) {
  peer.connected = true;
  while (!peer.deferred.empty() && !poisoned_.load()) {
    const std::shared_ptr<SendOp> op = peer.deferred.front();
    peer.deferred.pop_front();
    try {
      planSendLocked(peer, op);
    } catch (const std::exception& e) {
      failLocked(kindOf(e), "rank " + std::to_string(options_.rank) + ": " + e.what());
    }
  }
}

}  // namespace railshard::transport::ibverbs
