#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "transport/links/ibverbs/credit_window.h"
#include "transport/links/ibverbs/rdma_driver.h"
#include "transport/links/ibverbs/wire_format.h"
#include "transport/links/link.h"
#include "transport/messaging/messenger.h"

namespace railshard::transport::links::ibverbs {

// Page-aligned host memory registered with one protection domain.
struct RegisteredBuffer {
  uint8_t* data = nullptr;
  size_t bytes = 0;
  ibv_mr* mr = nullptr;
};

// One lane: a reliable-connected queue pair to one peer on one rail. A frame is copied into a
// registered staging slot (header and payload; from GPU memory the HCA reads the payload
// itself) and written with one RDMA WRITE WITH IMMEDIATE into the same slot of the peer's
// receive ring; the immediate names the slot. The receiver takes the frame out of its slot
// (the messenger says where its payload goes) and hands slots back in batches with zero-length
// writes whose immediate carries the count (credit_window.h). No staged write targets user
// memory, so a peer can never write into a buffer the caller freed after a failure; only the
// one-sided moves of a rendezvous do, and only into memory registered for them, deregistered
// the moment the group fails.
//
// Connected by records (wire_format.h LaneInfo) its messenger exchanges over a working link:
// at start-up, on first use, and again after a failure once its queue pair's work has all
// completed. Its state is guarded by its messenger's lock; the driver's thread reports
// completions under it.
//
// NEVER RUN ON RDMA HARDWARE (docs/rdma.md).
class RdmaLane final : public Link {
 public:
  RdmaLane(RdmaDriver& driver, uint32_t index, int peer, int rail, LinkAttributes attributes);
  ~RdmaLane() override;

  const LinkAttributes& attributes() const override { return attributes_; }
  bool canPost() const override;
  bool post(const messaging::OutFramePtr& frame) override;
  void postControl(const messaging::FrameHeader& header, const std::string& payload) override;
  void shutdown() override;
  void detach() override;
  std::string connectRecord(uint32_t generation) override;
  std::string acceptRecord(uint32_t generation, const std::string& record) override;
  void completeRecord(uint32_t generation, const std::string& record) override;
  MemoryKey registerMemory(void* address, size_t bytes, int access) override;
  void deregister(MemoryKey& key) override;
  bool canPostOneSided(bool write) const override;
  bool postOneSided(bool write, uint8_t* local, const MemoryKey& local_key, uint64_t remote,
                    uint64_t remote_key, size_t bytes, uint64_t cookie) override;

  // --- the driver's thread, with the messenger's lock held ---
  void completionLocked(const ibv_wc& wc);
  // An asynchronous event put its queue pair (number `qp_num`, when `of_qp`) or its port in
  // error. By number: the event is acknowledged before it is handed out, after which its
  // queue pair may be gone and its address reused.
  void asyncFailureLocked(bool of_qp, uint32_t qp_num, const std::string& why);
  // What the driver's thread reports for it: a failure found while posting (the messenger
  // was calling in then), and, once it is shut and nothing posted is left, that it is quiet.
  void reportLocked();
  // Nothing of this rank's is still posted on it (or it is down).
  bool idleLocked() const;
  // Frees its queue pair, rings and registrations (the driver stops; nothing polls any more).
  void teardownLocked();
  int rail() const { return rail_; }
  ibv_qp* qp() const { return qp_; }

 private:
  // Destroys its queue pair, if any (a failure is logged: the queue pair is left behind).
  void destroyQueuePair();
  struct OneSided {
    bool busy = false;
    uint64_t cookie = 0;
  };
  struct Control {
    messaging::FrameHeader header;
    std::string payload;
  };
  std::string name() const;
  uint32_t id() const { return index_ | (uint32_t{generation_} << 16); }
  // Builds a new queue pair (INIT, receives posted) for generation `generation`.
  void makeQueuePair(uint32_t generation);
  void connectTo(const std::string& record);
  void prepareSendSide();
  int postSendLocked(ibv_send_wr& wr);
  // Writes one frame into the next slot: header, then the payload (copied, or from GPU
  // memory); false when it failed (the lane is failed then).
  bool writeFrame(const messaging::FrameHeader& header, const uint8_t* payload, bool device,
                  const messaging::OutFramePtr& frame);
  void postControlsLocked();
  void returnCreditsLocked(bool force);
  void onFrameLocked(uint32_t slot, uint32_t byte_len);
  // A frame whose receive completed after the lane failed or was shut.
  void lateFrameLocked(const ibv_wc& wc);
  // What a completed receive brought: a frame in the ring (landed), or credits (granted while
  // the lane is `live`). ProtocolError for a write without immediate data, or a bad frame.
  void takeReceiveLocked(const ibv_wc& wc, bool live);
  void failLocked(const std::string& why);

  RdmaDriver& driver_;
  uint32_t index_;
  int peer_;
  int rail_;
  LinkAttributes attributes_;
  uint16_t generation_ = 0;
  ibv_qp* qp_ = nullptr;
  LaneInfo local_;
  LaneInfo remote_;
  RegisteredBuffer recv_ring_;  // local_.slots x local_.slot_bytes, written by the peer
  RegisteredBuffer send_ring_;  // remote_.slots x remote_.slot_bytes, our staging copies
  std::optional<SendWindow> send_;
  std::optional<ReceiveWindow> recv_;
  int send_depth_ = 0;        // max_send_wr
  int send_outstanding_ = 0;  // posted on the send queue, completion not yet seen
  int posted_ = 0;            // work requests posted on this queue pair, not yet completed
  bool connected_ = false;    // its queue pair is at RTS
  bool failed_ = false;
  bool shut_ = false;
  bool quiet_reported_ = true;   // nothing to report until it is shut
  std::string pending_failure_;  // found while posting, reported by reportLocked()
  std::vector<messaging::OutFramePtr> in_flight_;  // by staging slot: the frame (null: control)
  std::deque<Control> controls_;                   // waiting for a slot
  std::vector<OneSided> reads_;                    // by read slot
  std::vector<OneSided> writes_;                   // by rendezvous-write slot
  std::set<ibv_mr*> registrations_;                // user memory registered on this lane
};

}  // namespace railshard::transport::links::ibverbs
