// Re-admission of a failed lane (a link flap, a port reset, a queue pair in error): once all
// the failed queue pair's work has completed (Lane::posted, so every piece that landed on it
// has been taken) and its port is active, each side destroys it, makes a new one on the same
// rail (a new generation: wr_ids carry it), posts its receives and publishes the new
// connection record in the store; each side that finds the peer's record of the same
// generation moves its queue pair to RTS and says so; once both have, each probes its queue
// pair with one zero-length RDMA write (probing earlier would find the peer's queue pair not
// yet ready: a retry on hardware, an error in the emulation). The probe's acknowledgement
// says the peer's queue pair is connected to ours and the path works
// (a queue pair connects without sending anything: without the probe, a lane whose path is
// still down would be put back, given pieces and fail again after the retry budget, over and
// over). Then the lane is back in the peer's rotation, its rings starting over on both sides,
// with the rail scheduler's last estimate of it, which measurement then corrects. A failed
// probe fails the lane again, and it is tried again later. A thread of its own tries every
// readmit_interval (RAILSHARD_IB_READMIT_MS; the TCP transport's keeper reconnects a rail
// every second), talking to the store without the transport's lock: a store call that waits
// (another thread's request ahead of it on the client) never holds up the progress thread.
//
// Generations agree because each side makes a lane again once per failure of it, and a
// failure of one side is told to the other (kLaneDown), or found by it the next time it sends
// there. A lane is made again only beside a working one: with none left the peer is lost
// (PeerLostError), or, idle, counted lost when next needed. A peer that never answers (it
// ended) costs a store look-up per lane and interval.
//
// Run over the in-process emulation and over Soft-RoCE in the qemu guest; NOT YET RUN ON RDMA
// HARDWARE.

#include <algorithm>
#include <cstring>
#include <random>

#include "base/error.h"
#include "base/logging.h"
#include "transport/ibverbs/ibverbs_transport_internal.h"

namespace railshard::transport::ibverbs {

namespace {

// Store calls of re-admission: short.
constexpr auto kStoreTimeout = std::chrono::seconds(5);
// After publishing, the peer's side is looked for every 20 ms this long, then every
// interval: a peer that never answers (it closed its communicator) costs little.
constexpr auto kQuickLooks = std::chrono::seconds(5);

}  // namespace

void IbverbsTransport::readmitLoop() {
  // With re-admission off (lazy lanes only), wanted notices are still looked for.
  const Duration interval = options_.readmit_interval > Duration::zero()
                                ? options_.readmit_interval
                                : Duration(std::chrono::seconds(1));
  std::unique_lock<std::mutex> lock(readmit_mutex_);
  Duration pause = interval;
  while (!stopping_.load()) {
    readmit_wake_.wait_for(lock, pause, [this] { return stopping_.load() || readmit_kick_; });
    if (stopping_.load()) break;
    readmit_kick_ = false;
    lock.unlock();
    bool under_way = lazy_ && exchangeWanted();
    under_way = readmitLanes() || under_way;
    lock.lock();
    pause = under_way ? Duration(std::chrono::milliseconds(20)) : interval;
  }
}

bool IbverbsTransport::readmitLanes() {
  struct Step {
    Lane* lane = nullptr;
    Lane::Readmit stage = Lane::Readmit::kIdle;
    uint16_t generation = 0;
    std::vector<uint8_t> record;  // kIdle: ours, to publish
  };
  std::vector<Step> steps;
  bool under_way = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (poisoned_.load()) return false;
    for (auto& owned : lanes_) {
      Lane& lane = *owned;
      if (!lane.failed) continue;
      const Peer& peer = *peers_[static_cast<size_t>(lane.peer)];
      if (!lane.ever_up) {
        // Its first connection (lazy, ibverbs_transport_lazy.cc): once the peer is wanted,
        // and until it is up, whatever its peer's other lanes do.
        if (!peer.wanted) continue;
      } else if (options_.readmit_interval == Duration::zero() ||
                 std::none_of(peer.lanes.begin(), peer.lanes.end(),
                              [](const Lane* other) { return !other->failed; })) {
        continue;
      }
      if (lane.readmit == Lane::Readmit::kPublished || lane.readmit == Lane::Readmit::kConnected) {
        steps.push_back(Step{&lane, lane.readmit, lane.generation, {}});
        if (Clock::now() - lane.readmit_since < kQuickLooks) under_way = true;
        continue;
      }
      if (lane.readmit == Lane::Readmit::kProbing) {
        under_way = true;  // its completion decides
        continue;
      }
      if (lane.posted > 0) continue;  // completions of the old queue pair still to come
      const Rail& rail = *rails_[static_cast<size_t>(lane.rail)];
      ibv_port_attr port{};
      if (api_.query_port(rail.context, static_cast<uint8_t>(rail.port.port), &port) != 0 ||
          port.state != IBV_PORT_ACTIVE) {
        continue;  // its link is down here
      }
      try {
        if (lane.qp != nullptr) api_.destroy_qp(lane.qp);
        lane.qp = nullptr;
        ++lane.generation;
        lane.send_outstanding = 0;
        lane.ends.clear();
        if (lane.recv_ring.data == nullptr) allocateReceiveRing(lane);  // its first connection
        lane.recv.emplace(lane.local.slots);
        lane.local.psn = std::random_device{}() & 0xffffffu;
        createQueuePair(lane);  // INIT, receives posted: before anyone learns its number
      } catch (const Error& e) {
        if (!lane.ever_up) {
          // Its first connection (lazy): what eager start-up would have raised, raised now.
          failLocked(ErrorKind::kConfig, "rank " + std::to_string(options_.rank) + ": " +
                                             laneName(lane) + ": cannot connect: " + e.what());
          break;
        }
        RS_LOG_WARN("rank {}: {}: cannot make its queue pair again: {}", options_.rank,
                    laneName(lane), e.what());
        continue;
      }
      lane.readmit = Lane::Readmit::kPublished;
      lane.readmit_since = Clock::now();
      under_way = true;
      steps.push_back(Step{&lane, Lane::Readmit::kIdle, lane.generation, lane.local.encode()});
    }
  }
  const auto key = [&](const char* what, int from, int to, int rail) {
    return laneKey(std::string("readmit/") + what, from, to, rail);
  };
  for (const Step& step : steps) {
    Lane& lane = *step.lane;
    const int me = options_.rank;
    std::string gen = "/";  // (not "/" + ...: GCC 12 warns falsely about that, -Wrestrict)
    gen += std::to_string(step.generation);
    try {
      if (step.stage == Lane::Readmit::kIdle) {
        store_->setString(key("lane", me, lane.peer, lane.rail) + gen, toHex(step.record),
                          kStoreTimeout);
        store_->add(key("published", me, lane.peer, lane.rail), 1, kStoreTimeout);
      } else if (step.stage == Lane::Readmit::kPublished) {
        if (store_->add(key("published", lane.peer, me, lane.rail), 0, kStoreTimeout) <
            step.generation) {
          continue;  // not yet
        }
        const LaneInfo remote = LaneInfo::decode(
            fromHex(store_->getString(key("lane", lane.peer, me, lane.rail) + gen, kStoreTimeout)));
        {
          std::lock_guard<std::mutex> lock(mutex_);
          if (poisoned_.load() || lane.generation != step.generation ||
              lane.readmit != Lane::Readmit::kPublished) {
            continue;
          }
          // A ring the staging ring was sized for, when the lane had been connected before.
          if (remote.rank != static_cast<uint32_t>(lane.peer) ||
              remote.rail != static_cast<uint16_t>(lane.rail) ||
              (lane.send_ring.data != nullptr && (remote.slots != lane.remote.slots ||
                                                  remote.slot_bytes != lane.remote.slot_bytes))) {
            throw ProtocolError("a connection record for another lane or ring");
          }
          lane.remote = remote;
          try {
            prepareSendSide(lane);
            moveToRts(lane);
          } catch (const Error& e) {
            if (lane.ever_up) throw;
            failLocked(ErrorKind::kConfig, "rank " + std::to_string(me) + ": " + laneName(lane) +
                                               ": cannot connect: " + e.what());
            break;
          }
          lane.readmit = Lane::Readmit::kConnected;
        }
        store_->add(key("connected", me, lane.peer, lane.rail), 1, kStoreTimeout);
      } else {
        if (store_->add(key("connected", lane.peer, me, lane.rail), 0, kStoreTimeout) <
            step.generation) {
          continue;  // not yet
        }
        {
          std::lock_guard<std::mutex> lock(mutex_);
          if (poisoned_.load() || lane.generation != step.generation ||
              lane.readmit != Lane::Readmit::kConnected) {
            continue;  // (or up already: something arrived on it)
          }
          // The probe: a zero-length write into the peer's ring (no immediate, so no receive
          // of the peer's is consumed); onProbedLocked() when it is acknowledged.
          ibv_send_wr wr{};
          wr.wr_id = makeWorkId(lane.id(), WorkKind::kProbe, 0);
          wr.num_sge = 0;
          wr.opcode = IBV_WR_RDMA_WRITE;
          wr.send_flags = IBV_SEND_SIGNALED;
          wr.wr.rdma.remote_addr = lane.remote.ring_addr;
          wr.wr.rdma.rkey = lane.remote.ring_rkey;
          if (const int rc = postSend(lane, wr); rc != 0) {
            throw Error("ibv_post_send of the probe failed: " + std::string(std::strerror(rc)));
          }
          ++lane.send_outstanding;
          lane.readmit = Lane::Readmit::kProbing;
        }
      }
    } catch (const std::exception& e) {
      // The store unreachable, or a queue pair that would not connect: tried again later.
      RS_LOG_DEBUG("rank {}: {}: re-admission step failed: {}", options_.rank, laneName(lane),
                   e.what());
    }
  }
  raisePendingFailure();
  return under_way;
}

void IbverbsTransport::onProbedLocked(Lane& lane, bool acknowledged) {
  --lane.send_outstanding;
  if (lane.readmit != Lane::Readmit::kProbing) return;  // (up already: something arrived)
  if (!acknowledged || poisoned_.load()) {
    lane.readmit = Lane::Readmit::kIdle;
    // The path is still down (or the peer's queue pair is not ours): made again later, once
    // this one's work has all completed. The queue pair is in error already.
    RS_LOG_DEBUG("rank {}: {}: the re-admission probe failed; tried again later", options_.rank,
                 laneName(lane));
    return;
  }
  laneUpLocked(lane);
}

void IbverbsTransport::laneUpLocked(Lane& lane) {
  lane.readmit = Lane::Readmit::kIdle;
  Peer& peer = *peers_[static_cast<size_t>(lane.peer)];
  lane.failed = false;
  lane.last_completion = Clock::now();
  peer.scheduler->markUp(lane.rail);
  if (lane.ever_up) {
    RS_LOG_WARN(
        "rank {}: {} is back (queue pair made again, generation {}); re-admitted at "
        "{:.3f} Gbit/s",
        options_.rank, laneName(lane), lane.generation, peer.scheduler->gbps(lane.rail));
  } else {
    RS_LOG_DEBUG("rank {}: {} connected on first use (generation {})", options_.rank,
                 laneName(lane), lane.generation);
  }
  lane.ever_up = true;
  if (!peer.connected) peerConnectedLocked(peer);
  postWhatFitsLocked(peer, lane);
}

}  // namespace railshard::transport::ibverbs
