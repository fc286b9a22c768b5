#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <vector>

#include "base/clock.h"
#include "base/error.h"
#include "transport/message_tag.h"
#include "transport/request.h"
#include "transport/links/shm/shm_segment.h"

namespace railshard {

// Point-to-point messages between ranks of one host through the host's shared-memory segment
// (docs/point_to_point.md). Each direction of a pair has a few message entries
// (transport::links::shm::MailEntry), used in turn by message number: the sender fills one with its
// header and, for a small message, the bytes; a larger message stays in the sender's buffer
// and the receiver copies it straight out of the sender's process (process_vm_readv), so its
// bytes cross memory once instead of through a socket's two copies.
//
// Completion: a small send is done once posted (eager); a larger one when the receiver has
// read it (rendezvous, as gloo's sends are). Receives complete when their message is there.
// Every wait moves every pending request of this rank along, whichever it waits for, so an
// exchange both ranks post as send-then-receive (batch_isend_irecv) always progresses; two
// ranks that each block in a large send before posting their receive wait for each other
// until the deadline, as with gloo.
//
// The receiver checks the sender's header (tag, count, dtype, message number) before it copies
// a byte: a disagreement fails the whole communicator (`fail`), the same as over TCP.
class ShmMessages {
 public:
  struct Options {
    transport::links::shm::ShmSegment* segment = nullptr;
    int local_rank = 0;
    std::vector<int> local_of;  // communicator rank -> local rank on this host, -1 elsewhere
    Duration spin{};            // poll this long before sleeping (Config::spin)
    // Throws when the communicator has failed (peer lost elsewhere, a mismatch reported).
    std::function<void()> health_check;
    // Fails the communicator for every rank (kind, text); called before a mismatch is thrown.
    std::function<void(ErrorKind, const std::string&)> fail;
  };

  // After every local rank of the segment has run publishProbe() and a barrier.
  explicit ShmMessages(Options options);

  // Set-up, on every local rank: publish where a known value lives in this process; then,
  // after a barrier, check which local ranks' memory this one can read (`enabled` false: none),
  // and publish that. All ranks read each other's results after a second barrier.
  static void publishProbe(transport::links::shm::ShmSegment& segment, int local_rank);
  static void checkReadable(transport::links::shm::ShmSegment& segment, int local_rank, bool enabled);

  // Whether messages from `from` to `to` (communicator ranks) go through shared memory: both
  // on this host, and `to` could read `from`'s memory. The same answer on both ranks.
  bool carries(int from, int to) const;

  transport::RequestPtr isend(int peer, const void* data, size_t bytes,
                              const transport::MessageTag& tag, uint64_t number, Deadline deadline);
  transport::RequestPtr irecv(int peer, void* data, size_t bytes, const transport::MessageTag& tag,
                              uint64_t number);
  // True for the requests isend/irecv above returned.
  static bool owns(const transport::RequestPtr& request);
  void wait(const transport::RequestPtr& request, Deadline deadline);
  // Whether message `number` from `peer` is posted and `accept` takes its header.
  bool arrived(int peer, uint64_t number,
               const std::function<bool(const transport::MessageTag&)>& accept);

 private:
  class Pending;
  using PendingPtr = std::shared_ptr<Pending>;

  int localOf(int rank) const { return local_of_[static_cast<size_t>(rank)]; }
  // Completes what it can of the pending requests (under mutex_).
  void progress();
  bool tryComplete(Pending& request);
  void complete(Pending& request, const transport::links::shm::MailEntry& entry);
  // Spin, then sleep on this rank's doorbell until `ready` or the deadline; liveness checks of
  // `peer` and the health check every 100 ms. `what` names the wait for its TimeoutError.
  void waitUntil(const std::function<bool()>& ready, int peer, Deadline deadline,
                 const std::string& what);
  void ring(int local_rank);

  transport::links::shm::ShmSegment& segment_;
  int local_rank_;
  std::vector<int> local_of_;
  std::vector<int> rank_of_;  // local rank -> communicator rank
  Duration spin_;
  bool oversubscribed_;  // more ranks on the host than cores: yield at once, never pause
  std::function<void()> health_check_;
  std::function<void(ErrorKind, const std::string&)> fail_;
  std::mutex mutex_;
  std::list<PendingPtr> pending_;  // posted, not yet complete, in posting order
};

}  // namespace railshard
