#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "base/clock.h"

#include "transport/messaging/frame.h"
#include "transport/messaging/out_frame.h"

namespace railshard::transport::messaging {
class Messenger;
}

namespace railshard::transport::links {

enum class LinkKind : uint8_t { kTcp, kRdma, kShm };

// How a link learns that a frame it sent arrived.
enum class Delivery : uint8_t {
  // Its local completion says the frame is in the peer's memory (an RDMA write's
  // acknowledgement; a shared-memory entry the peer reads).
  kCompletion,
  // Only the peer's word says so: the messenger acknowledges such links' frames (a socket's
  // completion means "in this host's kernel").
  kAck,
};

// What a link is and costs, as it describes itself (UCX's uct_iface_attr in spirit): the
// messenger above chooses from these numbers, and measures the rate from then on.
struct LinkAttributes {
  LinkKind kind = LinkKind::kTcp;
  std::string name;       // "rail0", "mlx5_0:1", "shm": logs, rail status, trace tracks
  std::string local;      // local address ("" for a default connection)
  std::string remote;     // the peer's address
  double latency_us = 0;  // α, nominal
  double gbps = 0;        // β, nominal payload rate (Gbit/s); 0 = unknown
  // Largest payload of one frame: a message is cut into pieces of at most this.
  uint64_t max_payload = UINT64_MAX;
  Delivery delivery = Delivery::kAck;
  // Registers memory and reads or writes the peer's registered memory (a rendezvous moves a
  // large message in place); `reads`: it reads too (else the peer writes).
  bool one_sided = false;
  bool reads = false;
  // Posts frames straight from GPU memory (GPUDirect); other links get a host copy.
  bool device_memory = false;
  // Ends when the peer's process ends (a socket: its kernel closes it): such a link closed by
  // the peer without a goodbye, with no other such link left, is the peer lost, even while
  // links that cannot see a process end (an RDMA lane) still look up.
  bool sees_peer_exit = false;
  // Re-made by its driver (a TCP connection is dialled again); else through the messenger's
  // connection records (an RDMA lane's queue pair).
  bool redials = false;
  // Only the messenger's waits move it along (shared memory): no thread of its own.
  bool polled = false;
  // How often a failed link is made again; zero: it stays out.
  Duration rejoin_interval = std::chrono::seconds(1);
  const char* trace_name = "send";  // its pieces' name in the trace
};

// What a registration allows (registerMemory).
enum MemoryAccess : int {
  kLocalRead = 0,    // the link reads it (the source of writes)
  kLocalWrite = 1,   // the link writes it (the destination of reads)
  kRemoteRead = 2,   // the peer reads it (an offer)
  kRemoteWrite = 4,  // the peer writes it (a grant)
};

// One region of this rank's memory registered with a link, for one-sided moves.
struct MemoryKey {
  uint64_t remote_key = 0;  // what the peer names it by (an rkey; a pid for shared memory)
  uint32_t local_key = 0;   // what this rank's link names it by (an lkey)
  void* handle = nullptr;   // the driver's (an ibv_mr)
  bool held() const { return handle != nullptr; }
};

// One connection to one peer (Gloo's transport::Pair in spirit): it moves frames and says what
// happened; everything else — numbering, matching, striping, keeping and re-sending, failover,
// re-admission, heartbeats, errors — is the messenger's, written once for every kind of link.
// Drivers own only I/O: sockets and their poll loop; verbs, completion queues and
// registration; a shared-memory segment and its futexes.
//
// Locking: a link's state is guarded by its messenger's lock. The messenger calls every method
// below with it held; a driver's thread takes it (Messenger::Guard) before it reports what
// happened on a link through the messenger's *Locked methods. A method the messenger calls never
// reports back into the messenger: it returns what it can say at once, and its driver reports
// the rest later from its own thread (or, for a polled link, from poll()).
class Link {
 public:
  virtual ~Link() = default;
  virtual const LinkAttributes& attributes() const = 0;

  // Room for one more frame through post() now. When it says no, the driver reports
  // Messenger::roomLocked later.
  virtual bool canPost() const = 0;
  // Starts sending `frame` (its header and header.length payload bytes at frame->data); the
  // link keeps a reference until it reports the frame complete (Messenger::completedLocked, in
  // posting order) or is shut down. True when it completed already (a socket took it whole):
  // then it is never reported, and every frame posted before it had completed too.
  virtual bool post(const messaging::OutFramePtr& frame) = 0;
  // A small control frame (acks, pings, reports, aborts), sent ahead of queued frames at the
  // next frame boundary; the payload is copied. Best effort: dropped when the link is down.
  virtual void postControl(const messaging::FrameHeader& header, const std::string& payload) = 0;
  // Stops the link (it failed, or the peer took it out): nothing more is sent or taken from it,
  // and frames posted on it are forgotten (the messenger re-sends what the peer did not take).
  // The driver reports Messenger::quiescedLocked once nothing more can arrive from it.
  virtual void shutdown() = 0;
  // The group failed: a frame half on the wire finishes from a private copy (the peer's parser
  // stays in step and the abort can follow it), nothing else of user memory is read or written.
  virtual void detach() = 0;
  // A new rate estimate (Gbit/s) for the link (a socket sizes its send buffer by it).
  virtual void rateChanged(double gbps) { (void)gbps; }
  // Bytes its network has taken from it so far (a socket: what the kernel accepted, which it
  // does only as the peer acknowledges), with the messenger's lock held. Progress short of a
  // whole frame: on a slow link shared by many connections one frame can take longer than the
  // stall rule's timeout. 0 for links whose completions are their progress (RDMA).
  virtual uint64_t bytesTaken() const { return 0; }

  // Connection by records (attributes().redials false): generation `generation` of the link.
  // The initiating rank's record for the peer; the accepting rank's answer, with its side
  // connected to the initiator's; the initiator connects its side to that. Error when the
  // link cannot be made (tried again later).
  virtual std::string connectRecord(uint32_t generation) {
    (void)generation;
    return {};
  }
  virtual std::string acceptRecord(uint32_t generation, const std::string& record) {
    (void)generation;
    (void)record;
    return {};
  }
  virtual void completeRecord(uint32_t generation, const std::string& record) {
    (void)generation;
    (void)record;
  }
  // A re-dialling link (attributes().redials): the messenger allows generation `generation`
  // now; the driver dials (or accepts) it and reports Messenger::linkUpLocked.
  virtual void redial(uint32_t generation) { (void)generation; }

  // One-sided moves (attributes().one_sided). Error naming why when the memory cannot be
  // registered.
  virtual MemoryKey registerMemory(void* address, size_t bytes, int access) {
    (void)address;
    (void)bytes;
    (void)access;
    return {};
  }
  virtual void deregister(MemoryKey& key) { key = {}; }
  virtual bool canPostOneSided(bool write) const {
    (void)write;
    return false;
  }
  // Reads `bytes` from the peer's memory at `remote` (its key `remote_key`) into `local` (write
  // = false), or writes them from `local` there. The driver reports
  // Messenger::oneSidedDoneLocked(cookie) when done; true when done already.
  virtual bool postOneSided(bool write, uint8_t* local, const MemoryKey& local_key, uint64_t remote,
                            uint64_t remote_key, size_t bytes, uint64_t cookie) {
    (void)write;
    (void)local;
    (void)local_key;
    (void)remote;
    (void)remote_key;
    (void)bytes;
    (void)cookie;
    return false;
  }

  // A polled link (attributes().polled): moves what it can along, reporting through the
  // messenger's *Locked methods. Called by waits with the messenger's lock held.
  virtual void poll() {}

  // Set when the messenger adopts the link.
  void attach(messaging::Messenger* messenger, int index) {
    messenger_ = messenger;
    index_ = index;
  }
  messaging::Messenger& messenger() const { return *messenger_; }
  int index() const { return index_; }

 private:
  messaging::Messenger* messenger_ = nullptr;
  int index_ = -1;
};

}  // namespace railshard::transport::links
