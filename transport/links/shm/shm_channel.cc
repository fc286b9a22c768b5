#include "transport/links/shm/shm_channel.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "transport/links/shm/cross_memory.h"

namespace railshard::transport::links::shm {

namespace {

// What set-up reads across processes to find out whether cross-memory reads work.
constexpr uint64_t kProbeValue = 0x52534d41494c3031ULL;  // "RSMAIL01"
const volatile uint64_t probe_value = kProbeValue;

// How long a peer may stay silent before we look at whether its process still exists.
constexpr auto kLivenessPeriod = std::chrono::milliseconds(100);

uint32_t mark(uint64_t number) {
  return static_cast<uint32_t>(number + 1);
}

}  // namespace

void ShmChannel::publishProbe(ShmSegment& segment, int local) {
  segment.control(local).probe_address.store(reinterpret_cast<uint64_t>(&probe_value),
                                             std::memory_order_release);
}

void ShmChannel::checkReadable(ShmSegment& segment, int local, bool enabled) {
  uint64_t mask = 0;
  if (enabled) {
    for (int r = 0; r < std::min(segment.worldSize(), 64); ++r) {
      const auto& control = segment.control(r);
      if (r == local ||
          canReadProcess(control.pid.load(), control.probe_address.load(std::memory_order_acquire),
                         kProbeValue)) {
        mask |= uint64_t{1} << r;
      }
    }
  }
  segment.control(local).readable_mask.store(mask, std::memory_order_release);
}

bool ShmChannel::readable(ShmSegment& segment, int reader, int owner) {
  if (reader >= 64 || owner >= 64) return false;
  return (segment.control(reader).readable_mask.load(std::memory_order_acquire) >> owner & 1u) != 0;
}

ShmChannel::ShmChannel(ShmSegment& segment, int local, int peer_local, bool one_sided)
    : segment_(segment), local_(local), peer_(peer_local) {
  attributes_.kind = LinkKind::kShm;
  attributes_.name = "shm";
  attributes_.local = "shm " + std::to_string(local);
  attributes_.remote = "shm " + std::to_string(peer_local);
  attributes_.latency_us = 1;
  attributes_.max_payload = kMailPayloadBytes;
  attributes_.delivery = Delivery::kCompletion;
  attributes_.one_sided = one_sided;
  attributes_.reads = one_sided;
  attributes_.polled = true;
  attributes_.rejoin_interval = Duration::zero();
  attributes_.trace_name = "shm";
}

void ShmChannel::ring(int local) {
  segment_.control(local).mail_doorbell.bump(segment_.header().sleepers);
}

bool ShmChannel::entryFree() const {
  // The entry last carried frame number - kMailEntries; it is free once that one was taken.
  const MailEntry& entry = const_cast<ShmChannel*>(this)->outgoing(sent_);
  return FutexWord::reached(entry.taken.load(), mark(sent_ - kMailEntries));
}

bool ShmChannel::reserved() {
  if (reserved_) return true;
  if (!segment_.pairReady(local_, peer_)) {
    std::string why = segment_.reservePair(local_, peer_);
    if (!why.empty()) {
      if (failure_.empty()) failure_ = std::move(why);
      return false;
    }
  }
  reserved_ = true;
  return true;
}

bool ShmChannel::canPost() const {
  const bool room = !shut_ && failure_.empty() && controls_.empty() &&
                    const_cast<ShmChannel*>(this)->reserved() && entryFree();
  if (!room) const_cast<ShmChannel*>(this)->full_ = true;
  return room;
}

void ShmChannel::write(const messaging::FrameHeader& header, const uint8_t* payload) {
  MailEntry& entry = outgoing(sent_);
  entry.header = header;
  if (header.length > 0) std::memcpy(entry.payload, payload, header.length);
  entry.posted.store(mark(sent_), segment_.header().sleepers);
  ++sent_;
  ring(peer_);
}

bool ShmChannel::post(const messaging::OutFramePtr& frame) {
  write(frame->header, frame->data);
  return true;  // in the peer's memory, and taken unless its process ends
}

void ShmChannel::postControl(const messaging::FrameHeader& header, const std::string& payload) {
  if (shut_ || !reserved()) return;  // not reserved: failure_ says why, the next poll reports
  if (controls_.empty() && entryFree()) {
    write(header, reinterpret_cast<const uint8_t*>(payload.data()));
    return;
  }
  controls_.push_back(Control{header, payload});
}

void ShmChannel::shutdown() {
  shut_ = true;
  controls_.clear();
}

MemoryKey ShmChannel::registerMemory(void* address, size_t bytes, int access) {
  (void)address;
  (void)bytes;
  (void)access;
  // Nothing to pin: the peer names this process and reads it (process_vm_readv).
  static int held;
  return MemoryKey{static_cast<uint64_t>(::getpid()), 0, &held};
}

bool ShmChannel::canPostOneSided(bool write) const {
  return !write && attributes_.reads && !shut_ && failure_.empty();
}

bool ShmChannel::postOneSided(bool write, uint8_t* local, const MemoryKey& local_key,
                              uint64_t remote, uint64_t remote_key, size_t bytes, uint64_t cookie) {
  (void)write;
  (void)local_key;
  (void)cookie;
  try {
    readFromProcess(static_cast<int>(remote_key), remote, local, bytes);
  } catch (const Error& e) {
    // The peer's process is gone (or refuses now): reported by the next poll.
    failure_ = std::string("reading from rank's process failed: ") + e.what();
    return false;
  }
  return true;
}

void ShmChannel::checkPeer() {
  const auto& control = segment_.control(peer_);
  const int32_t pid = control.pid.load();
  if (control.left.load() != 0) {
    failure_ = "it closed its communicator";
  } else if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) {
    failure_ = "its process (pid " + std::to_string(pid) + ") exited";
  }
}

void ShmChannel::poll() {
  if (shut_) return;
  messaging::Messenger& m = messenger();
  // Until the pair's entries exist nothing has come, and they must not be touched.
  if (!reserved_ && segment_.pairReady(local_, peer_)) reserved_ = true;
  // Frames the peer wrote into this rank's entries, in order.
  while (!shut_ && reserved_) {
    MailEntry& entry = incoming(received_);
    if (!FutexWord::reached(entry.posted.load(), mark(received_))) break;
    const messaging::FrameHeader header = entry.header;
    try {
      messaging::validateFrameHeader(header, kMailPayloadBytes);
    } catch (const ProtocolError& e) {
      m.protocolErrorLocked(index(), e.what());
      shut_ = true;
      return;
    }
    messaging::Messenger::Landing landing = m.arrivingLocked(index(), header);
    if (header.length > 0 && !landing.discard && landing.target != nullptr) {
      std::memcpy(landing.target, entry.payload, header.length);
    }
    m.landedLocked(index(), header, landing);
    entry.taken.store(mark(received_), segment_.header().sleepers);
    ++received_;
    ring(peer_);
  }
  // Entries the peer freed: control frames first, then the messenger's.
  while (!controls_.empty() && entryFree() && !shut_) {
    Control control = std::move(controls_.front());
    controls_.pop_front();
    write(control.header, reinterpret_cast<const uint8_t*>(control.payload.data()));
  }
  if (full_ && reserved_ && controls_.empty() && entryFree() && !shut_) {
    full_ = false;
    m.roomLocked(index());
  }
  const Clock::time_point now = Clock::now();
  // Only an awaited peer is checked (a kill(pid, 0) per peer every 100 ms was 650,000 system
  // calls a second at 256 ranks on one host); one nobody waits on is checked when somebody
  // does, before the wait can hang on it.
  if (failure_.empty() && now >= next_check_ && m.busyLocked()) {
    next_check_ = now + kLivenessPeriod;
    checkPeer();
  }
  if (!failure_.empty() && !shut_) {
    const std::string why = failure_;
    m.linkFailedLocked(index(), why, true);
    shut_ = true;
  }
}

}  // namespace railshard::transport::links::shm
