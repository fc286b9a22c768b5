#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include "base/clock.h"
#include "transport/links/link.h"
#include "transport/links/shm/shm_segment.h"
#include "transport/messaging/messenger.h"

namespace railshard::transport::links::shm {

// The channel between two ranks of one host through their host's segment: each direction has
// kMailEntries entries, used in turn by frame number; a frame and its payload (at most 64 KiB)
// are copied into the next free entry, and the receiver's doorbell rung. A larger message goes
// by the messenger's rendezvous: the offer names the sender's buffer and process, and the
// receiver reads it straight out of the sender's process (process_vm_readv) when the pair may
// read each other's memory (checked at set-up: readable()); else it is cut into 64 KiB frames.
//
// It has no thread: the group's waits move it along (poll(), under its messenger's lock), and
// its timer; a peer whose process is gone, or that closed its communicator, is noticed there
// (its pid and its left flag, every 100 ms).
class ShmChannel final : public Link {
 public:
  // `local` and `peer_local`: the two ranks' indices in the segment; `one_sided`: each of the
  // two may read the other's memory.
  ShmChannel(ShmSegment& segment, int local, int peer_local, bool one_sided);

  const LinkAttributes& attributes() const override { return attributes_; }
  bool canPost() const override;
  bool post(const messaging::OutFramePtr& frame) override;
  void postControl(const messaging::FrameHeader& header, const std::string& payload) override;
  void shutdown() override;
  void detach() override {}
  MemoryKey registerMemory(void* address, size_t bytes, int access) override;
  bool canPostOneSided(bool write) const override;
  bool postOneSided(bool write, uint8_t* local, const MemoryKey& local_key, uint64_t remote,
                    uint64_t remote_key, size_t bytes, uint64_t cookie) override;
  void poll() override;

  // Set-up, on every rank of the segment: publishes where a known value lives in this process;
  // then, after a barrier, checks which ranks' memory this one can read (`enabled` false:
  // none) and publishes that.
  static void publishProbe(ShmSegment& segment, int local);
  static void checkReadable(ShmSegment& segment, int local, bool enabled);
  // Whether `reader` may read `owner`'s memory (both indices in the segment), as checked.
  static bool readable(ShmSegment& segment, int reader, int owner);

 private:
  struct Control {
    messaging::FrameHeader header;
    std::string payload;
  };
  MailEntry& outgoing(uint64_t number) { return segment_.mail(local_, peer_, number); }
  MailEntry& incoming(uint64_t number) { return segment_.mail(peer_, local_, number); }
  bool entryFree() const;
  // The pair's entries reserved (by this rank or the peer) before this rank touches them;
  // false (failure_ says why) when /dev/shm has no room for them.
  bool reserved();
  void write(const messaging::FrameHeader& header, const uint8_t* payload);
  void ring(int local);
  void checkPeer();

  ShmSegment& segment_;
  int local_;
  int peer_;
  LinkAttributes attributes_;
  uint64_t sent_ = 0;      // frames written into the peer's entries
  uint64_t received_ = 0;  // frames taken out of ours
  bool full_ = false;      // said no to a frame since its last room
  bool shut_ = false;
  bool reserved_ = false;         // the pair's entries exist: see ShmSegment::pairReady
  std::string failure_;           // found outside poll(): reported by the next one
  std::deque<Control> controls_;  // waiting for a free entry
  Clock::time_point next_check_{};
};

}  // namespace railshard::transport::links::shm
