#include "core/shm_messages.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "base/error.h"
#include "core/collective_tag.h"
#include "transport/links/shm/cross_memory.h"

namespace railshard {

using transport::messaging::FutexWord;
using transport::links::shm::MailEntry;

namespace {

// What set-up reads across processes to find out whether cross-memory reads work.
constexpr uint64_t kProbeValue = 0x52534d41494c3031ULL;  // "RSMAIL01"
const volatile uint64_t probe_value = kProbeValue;

// How long a peer may stay silent before we look at whether its process still exists.
constexpr auto kLivenessPeriod = std::chrono::milliseconds(100);

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

uint32_t mark(uint64_t number) {
  return static_cast<uint32_t>(number + 1);
}

}  // namespace

// One posted message (shared with the waiter through the RequestPtr).
class ShmMessages::Pending : public transport::Request {
 public:
  Pending(Kind kind, int peer, int local_peer, size_t bytes, const transport::MessageTag& tag,
          uint64_t number, void* data)
      : Request(kind, peer, bytes, tag), local_peer(local_peer), number(number), data(data) {}
  int local_peer;
  uint64_t number;
  void* data;  // receive: where the message goes
  std::exception_ptr error;
};

void ShmMessages::publishProbe(transport::links::shm::ShmSegment& segment, int local_rank) {
  segment.control(local_rank)
      .probe_address.store(reinterpret_cast<uint64_t>(&probe_value), std::memory_order_release);
}

void ShmMessages::checkReadable(transport::links::shm::ShmSegment& segment, int local_rank, bool enabled) {
  uint64_t mask = 0;
  if (enabled) {
    for (int r = 0; r < std::min(segment.worldSize(), 64); ++r) {
      const auto& control = segment.control(r);
      if (r == local_rank ||
          transport::links::shm::canReadProcess(control.pid.load(),
                                         control.probe_address.load(std::memory_order_acquire),
                                         kProbeValue)) {
        mask |= uint64_t{1} << r;
      }
    }
  }
  segment.control(local_rank).readable_mask.store(mask, std::memory_order_release);
}

ShmMessages::ShmMessages(Options options)
    : segment_(*options.segment),
      local_rank_(options.local_rank),
      local_of_(std::move(options.local_of)),
      rank_of_(static_cast<size_t>(options.segment->worldSize()), -1),
      spin_(options.spin),
      oversubscribed_(static_cast<unsigned>(options.segment->worldSize()) >
                      std::max(1u, std::thread::hardware_concurrency())),
      health_check_(std::move(options.health_check)),
      fail_(std::move(options.fail)) {
  for (size_t r = 0; r < local_of_.size(); ++r) {
    if (local_of_[r] >= 0) rank_of_[static_cast<size_t>(local_of_[r])] = static_cast<int>(r);
  }
}

bool ShmMessages::carries(int from, int to) const {
  const int f = localOf(from);
  const int t = localOf(to);
  if (f < 0 || t < 0 || f >= 64) return false;
  return (segment_.control(t).readable_mask.load(std::memory_order_acquire) >> f & 1u) != 0;
}

bool ShmMessages::owns(const transport::RequestPtr& request) {
  return dynamic_cast<const Pending*>(request.get()) != nullptr;
}

void ShmMessages::ring(int local_rank) {
  segment_.control(local_rank).mail_doorbell.bump(segment_.header().sleepers);
}

transport::RequestPtr ShmMessages::isend(int peer, const void* data, size_t bytes,
                                         const transport::MessageTag& tag, uint64_t number,
                                         Deadline deadline) {
  const int to = localOf(peer);
  MailEntry& entry = segment_.mail(local_rank_, to, number);
  // The entry last carried message number - kMailEntries; it is free once that one was taken
  // (at once unless the receiver is that many messages behind).
  const uint32_t free_mark = mark(number - transport::links::shm::kMailEntries);
  waitUntil(
      [&] {
        progress();  // the receiver may be waiting for one of ours
        return FutexWord::reached(entry.taken.load(), free_mark);
      },
      peer, deadline,
      "a free message entry to rank " + std::to_string(peer) +
          " (it has not received this rank's earlier messages)");
  entry.tag = tag;
  entry.bytes = bytes;
  entry.pid = static_cast<int32_t>(::getpid());
  entry.address = reinterpret_cast<uint64_t>(data);
  entry.refused.store(0, std::memory_order_relaxed);
  const bool eager = bytes <= transport::links::shm::kMailInlineBytes;
  if (eager && bytes > 0) std::memcpy(entry.inline_data, data, bytes);
  entry.posted.store(mark(number), segment_.header().sleepers);
  ring(to);
  auto request = std::make_shared<Pending>(transport::Request::Kind::kSend, peer, to, bytes, tag,
                                           number, nullptr);
  if (eager) {
    request->markDone();  // the bytes are in the entry; the send buffer is free again
  } else {
    std::lock_guard lock(mutex_);
    pending_.push_back(request);
  }
  return request;
}

transport::RequestPtr ShmMessages::irecv(int peer, void* data, size_t bytes,
                                         const transport::MessageTag& tag, uint64_t number) {
  auto request = std::make_shared<Pending>(transport::Request::Kind::kRecv, peer, localOf(peer),
                                           bytes, tag, number, data);
  std::lock_guard lock(mutex_);
  // Completed here when it already arrived and nothing earlier is pending (earlier receives
  // come first so that a failure is reported in posting order).
  if (!(pending_.empty() && tryComplete(*request))) pending_.push_back(request);
  return request;
}

bool ShmMessages::arrived(int peer, uint64_t number,
                          const std::function<bool(const transport::MessageTag&)>& accept) {
  const MailEntry& entry = segment_.mail(localOf(peer), local_rank_, number);
  return FutexWord::reached(entry.posted.load(), mark(number)) && accept(entry.tag);
}

bool ShmMessages::tryComplete(Pending& request) {
  if (request.kind() == transport::Request::Kind::kSend) {
    MailEntry& entry = segment_.mail(local_rank_, request.local_peer, request.number);
    if (!FutexWord::reached(entry.taken.load(), mark(request.number))) return false;
    if (entry.refused.load() != 0) {
      const size_t length = strnlen(reinterpret_cast<const char*>(entry.inline_data),
                                    transport::links::shm::kMailInlineBytes);
      request.error = std::make_exception_ptr(
          MismatchError(std::string(reinterpret_cast<const char*>(entry.inline_data), length) +
                        " [reported by rank " + std::to_string(request.peer()) + "]"));
    }
    request.markDone();
    return true;
  }
  const MailEntry& entry = segment_.mail(request.local_peer, local_rank_, request.number);
  if (!FutexWord::reached(entry.posted.load(), mark(request.number))) return false;
  complete(request, entry);
  return true;
}

void ShmMessages::complete(Pending& request, const MailEntry& posted) {
  MailEntry& entry = const_cast<MailEntry&>(posted);
  const int me = rank_of_[static_cast<size_t>(local_rank_)];
  try {
    if (!(entry.tag == request.tag())) {
      // Before a byte lands: the receive's buffer is untouched, the sender learns why.
      const std::string text = describeMismatch(me, request.tag(), request.peer(), entry.tag);
      const size_t length = std::min(text.size(), transport::links::shm::kMailInlineBytes - 1);
      std::memcpy(entry.inline_data, text.data(), length);
      entry.inline_data[length] = 0;
      entry.refused.store(1);
      request.error = std::make_exception_ptr(MismatchError(text));
      if (fail_) fail_(ErrorKind::kMismatch, text);
    } else if (entry.bytes <= transport::links::shm::kMailInlineBytes) {
      if (entry.bytes > 0) std::memcpy(request.data, entry.inline_data, entry.bytes);
    } else {
      transport::links::shm::readFromProcess(entry.pid, entry.address, request.data, entry.bytes);
    }
  } catch (const Error& e) {
    request.error = std::make_exception_ptr(e);
    if (kindOf(e) == ErrorKind::kPeerLost) {
      request.error =
          makeError(ErrorKind::kPeerLost, "rank " + std::to_string(me) + ": rank " +
                                              std::to_string(request.peer()) + "'s " + e.what());
    }
  }
  entry.taken.store(mark(request.number), segment_.header().sleepers);
  ring(request.local_peer);
  request.markDone();
}

void ShmMessages::progress() {
  std::lock_guard lock(mutex_);
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (tryComplete(**it)) {
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
}

void ShmMessages::wait(const transport::RequestPtr& request, Deadline deadline) {
  auto& pending = static_cast<Pending&>(*request);
  if (!request->done()) {
    const bool send = request->kind() == transport::Request::Kind::kSend;
    waitUntil(
        [&] {
          progress();
          return request->done();
        },
        request->peer(), deadline,
        "rank " + std::to_string(request->peer()) +
            " has not posted the matching send or recv (same-host message through shared "
            "memory" +
            (send ? "; a large send completes when its receiver has read it)" : ")"));
  }
  if (pending.error) std::rethrow_exception(pending.error);
}

void ShmMessages::waitUntil(const std::function<bool()>& ready, int peer, Deadline deadline,
                            const std::string& what) {
  if (ready()) return;
  // Poll first (a futex wake-up of an idle virtual CPU costs hundreds of microseconds); with
  // another process on our core the peer needs it, so yield after a few microseconds.
  const Clock::time_point start = Clock::now();
  for (uint32_t i = 1;; ++i) {
    if (i < 64 && !oversubscribed_) {
      cpuRelax();
    } else {
      sched_yield();
    }
    if (ready()) return;
    if ((i & 15u) == 0 && Clock::now() - start >= spin_) break;
  }
  auto& doorbell = segment_.control(local_rank_).mail_doorbell;
  const auto& control = segment_.control(localOf(peer));
  Clock::time_point next_check = Clock::now();
  while (true) {
    const uint32_t seen = doorbell.load();
    if (ready()) return;
    const auto now = Clock::now();
    if (now >= next_check) {
      if (health_check_) health_check_();
      const int32_t pid = control.pid.load();
      if (control.left.load() != 0 || (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH)) {
        throw PeerLostError("rank " + std::to_string(rank_of_[static_cast<size_t>(local_rank_)]) +
                            ": rank " + std::to_string(peer) +
                            (control.left.load() != 0
                                 ? " closed its communicator"
                                 : " (pid " + std::to_string(pid) + ") exited") +
                            " while this rank waited: " + what);
      }
      next_check = now + kLivenessPeriod;
    }
    if (now >= deadline) throw TimeoutError(what);
    doorbell.sleepWhile(seen, std::min<Duration>(kLivenessPeriod, deadline - now),
                        segment_.header().sleepers);
  }
}

}  // namespace railshard
