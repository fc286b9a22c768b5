#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "transport/message_tag.h"
#include "transport/messaging/frame.h"
#include "transport/messaging/futex_word.h"

namespace railshard::transport::links::shm {

using messaging::FutexWord;

// What a rank publishes for one step, in one cache line: the step number (the flag others
// wait on), the collective's header, and a small message's data inline, so a reader of a
// small all-reduce takes a single cache miss per peer.
struct alignas(64) StepBox {
  FutexWord posted;  // holds step k once this box carries step k (boxes alternate by parity)
  uint32_t reserved;
  MessageTag header;  // the collective of that step (mismatch check)
  uint8_t inline_data[24];
};
static_assert(sizeof(StepBox) == 64, "one cache line");
inline constexpr size_t kInlineBytes = sizeof(StepBox::inline_data);

// Per-rank synchronisation block; ranks never share a cache line.
struct alignas(128) RankControl {
  StepBox box[2];                 // by step parity
  alignas(64) FutexWord reduced;  // step k: my reduced segment of step k is in my out-slot
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> left;  // closed its communicator: no more steps will come
  // The rank's doorbell: bumped by a peer that posted it a frame (shm_channel.h) or took one
  // it sent, and by whatever completes its requests (its group's Wake), so one word wakes the
  // rank whatever it waits for.
  alignas(64) FutexWord mail_doorbell;
  // Set-up's check of cross-memory reads: the address of a known value in this rank's process,
  // and which ranks' (bit r = local rank r) memory this rank could read (0 when it reads none,
  // or its RAILSHARD_P2P_SHM is 0).
  std::atomic<uint64_t> probe_address;
  std::atomic<uint64_t> readable_mask;
};

// One frame (messaging/frame.h) of one direction of a pair of ranks on one host
// (shm_channel.h): the header, and a payload of at most 64 KiB inside the entry. A pair has
// kMailEntries of them per direction, used in turn by frame number.
struct alignas(64) MailEntry {
  FutexWord posted;  // frame number + 1 once the sender filled this entry with it
  FutexWord taken;   // frame number + 1 once the receiver took it
  uint8_t reserved[56];
  messaging::FrameHeader header;
  uint8_t reserved2[48];
  // 64 KiB: up to there a message is cheaper copied twice (eager, the sender never waits for
  // the receiver) than read once after a hand-off (measured with benchmarks/p2p_bench.py:
  // 64 KiB read across took 97 us one way, eager over loopback TCP 33 us).
  uint8_t payload[64 << 10];
};
static_assert(sizeof(MailEntry) == (64 << 10) + 192, "a line of words, header, payload");
inline constexpr size_t kMailPayloadBytes = sizeof(MailEntry::payload);
// Entries per direction of a pair: a sender that is this many frames ahead of its receiver
// waits for it. 8 ranks on a host: 64 pairs x 4 x 64 KiB = 16.8 MiB of /dev/shm.
inline constexpr uint32_t kMailEntries = 4;

struct alignas(128) SegmentHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t world_size;
  uint64_t slot_bytes;
  std::atomic<uint32_t> sleepers;  // processes inside futex wait on any word
  FutexWord aborted;               // non-zero once any rank aborted
  // The first rank to abort claims the message before writing it: two ranks that detect a
  // mismatch at the same moment would otherwise write their texts over each other (seen:
  // "rank 0 has float, rank 0 has int32", half of each).
  std::atomic<uint32_t> abort_claimed;
  std::atomic<int32_t> abort_rank;
  // The rank the abort says was lost (a group rank), or -1: the host's other ranks record it
  // as lost too, so that their errors name it (with its host) and shrink() knows whom to drop,
  // though they have no connection of their own to it that ended.
  std::atomic<int32_t> abort_lost;
  std::atomic<uint32_t> abort_kind;
  char abort_message[2048];
};

// One POSIX shared-memory segment per job on one host: a control block per rank, per rank
// two in-slots and two out-slots (step parity) of slot_bytes each, and the message entries of
// every ordered pair — reserved in /dev/shm only once the pair sends a message (n^2 x 4 x
// 64 KiB is 4 GiB at 128 ranks, 16 GiB at 256: reserving and zeroing all of it at start-up
// made a one-host start-up grow faster than n^2, and past /dev/shm's size it failed). Rank 0
// creates it,
// the others attach, and rank 0 unlinks the name as soon as everyone is attached, so nothing
// is left in /dev/shm even if the job is killed later; a job killed during start-up leaves a
// name with a dead creator pid, which the next creator removes (removeStale).
class ShmSegment {
 public:
  static std::unique_ptr<ShmSegment> create(const std::string& name, int world_size,
                                            size_t slot_bytes);
  static std::unique_ptr<ShmSegment> attach(const std::string& name, int world_size,
                                            size_t slot_bytes);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // Removes the name (the mapping stays valid for everyone attached).
  void unlink();
  // Unlinks /dev/shm/railshard-<pid>-* names whose creating process no longer exists.
  static int removeStale();
  // "railshard-<pid>-<random>"
  static std::string makeName();

  SegmentHeader& header() { return *header_; }
  RankControl& control(int rank) { return controls_[rank]; }
  uint8_t* inSlot(int rank, uint32_t step) { return slot(rank, step & 1u); }
  uint8_t* outSlot(int rank, uint32_t step) { return slot(rank, 2 + (step & 1u)); }
  // Whether the message entries between local ranks a and b are reserved in /dev/shm; nothing
  // may touch them before (a touched hole takes a page, and with /dev/shm full that is a
  // SIGBUS rather than an error).
  bool pairReady(int a, int b) const {
    return pair_ready_[pairIndex(a, b)].load(std::memory_order_acquire) != 0;
  }
  // Reserves both directions' entries of the pair and marks it ready: empty, or why not (no
  // room in /dev/shm). Either rank of the pair may call it, both at once too.
  std::string reservePair(int a, int b);
  // The entry that carries message `number` from local rank `from` to local rank `to`.
  MailEntry& mail(int from, int to, uint64_t number) {
    return mail_[(static_cast<size_t>(from) * static_cast<size_t>(world_size_) +
                  static_cast<size_t>(to)) *
                     kMailEntries +
                 number % kMailEntries];
  }
  size_t slotBytes() const { return slot_bytes_; }
  int worldSize() const { return world_size_; }
  const std::string& name() const { return name_; }

 private:
  ShmSegment(std::string name, int world_size, size_t slot_bytes, void* base, size_t bytes);
  static size_t totalBytes(int world_size, size_t slot_bytes);
  // The header, the controls and the pairs' flags: what precedes the slots.
  static size_t controlBytes(int world_size);
  uint8_t* slot(int rank, uint32_t index);
  size_t pairIndex(int a, int b) const {
    const auto low = static_cast<size_t>(std::min(a, b));
    const auto high = static_cast<size_t>(std::max(a, b));
    return low * static_cast<size_t>(world_size_) + high;
  }

  std::string name_;
  int world_size_;
  size_t slot_bytes_;
  void* base_;
  size_t bytes_;
  int fd_ = -1;  // kept open: the pairs' entries are reserved through it
  bool linked_ = false;
  SegmentHeader* header_;
  RankControl* controls_;
  std::atomic<uint8_t>* pair_ready_;  // n x n, indexed by pairIndex()
  uint8_t* data_;
  MailEntry* mail_;
};

// The slot size for a new segment: `requested` when non-zero, else 1 MiB; halved until the
// segment takes at most half of the free space in /dev/shm. Error when even 64 KiB slots do
// not fit.
size_t chooseSlotBytes(size_t requested, int world_size);

}  // namespace railshard::transport::links::shm
