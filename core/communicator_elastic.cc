// The Communicator's elastic calls (docs/reliability.md): shrink(), grow(), join() and
// joinersWaiting() over its Membership, which decides who is in the next generation; this
// makes it.
#include <algorithm>

#include "base/error.h"
#include "base/logging.h"
#include "core/channels.h"
#include "core/collectives/shm_engine.h"
#include "core/communicator.h"
#include "core/diagnostics.h"
#include "core/membership.h"
#include "transport/links/shm/shared_buffers.h"

namespace railshard {

Duration Communicator::retire(const char* by, Timeout timeout_arg) {
  membership_->checkUsable(by);
  const Duration timeout = timeoutFor(by, timeout_arg);
  // The old group is finished for this rank: stop its publisher and fail its links (a no-op
  // when a failure already did), without telling peers, who are re-forming too.
  diagnostics_->stopPublishing();
  const std::string why = std::string("this communicator was re-formed by ") + by + "()";
  channels_->mesh().abort(
      makeError(ErrorKind::kPeerLost, "rank " + std::to_string(rank_) + ": " + why), false);
  if (channels_->engine() != nullptr) channels_->engine()->abort(ErrorKind::kPeerLost, why);
  membership_->retire(by, channels_->mesh().lostPeers());
  return timeout;
}

std::unique_ptr<Communicator> Communicator::shrink(Timeout timeout_arg) {
  const Duration timeout = retire("shrink", timeout_arg);
  auto shrunk = create(*membership_->store(), membership_->shrink(config_, timeout));
  // Whatever this communicator kept alive (rank 0's store server, say) the new one needs too.
  for (const auto& resource : resources_) shrunk->keepAlive(resource);
  return shrunk;
}

std::unique_ptr<Communicator> Communicator::grow(Timeout timeout_arg) {
  const Duration timeout = retire("grow", timeout_arg);
  std::unique_ptr<Communicator> grown;
  Membership::Growth growth;
  try {
    growth = membership_->grow(config_, timeout);
    grown = create(*membership_->store(), growth.options);
  } catch (const Error& e) {
    // A joiner that died after it asked leaves the new generation unable to connect: the
    // members fall back to themselves (Membership::withoutJoiners).
    const ErrorKind kind = kindOf(e);
    if (growth.joined == 0 || (kind != ErrorKind::kTimeout && kind != ErrorKind::kPeerLost)) {
      throw;
    }
    grown = create(*membership_->store(),
                   membership_->withoutJoiners(config_, timeout, growth, e.what()));
  }
  for (const auto& resource : resources_) grown->keepAlive(resource);
  return grown;
}

std::unique_ptr<Communicator> Communicator::join(const Options& options, Timeout timeout) {
  if (!options.store) {
    throw InvalidArgument("join: Options::store is null: a joiner finds the job through its store");
  }
  if (timeout <= Timeout::zero()) {
    throw InvalidArgument("join: timeout must be positive, got " + std::to_string(timeout.count()) +
                          " ms");
  }
  return create(*options.store,
                Membership::join(options, std::chrono::duration_cast<Duration>(timeout)));
}

int Communicator::joinersWaiting(Timeout timeout) {
  membership_->checkUsable("joinersWaiting");
  int64_t waiting = rank_ == 0 ? membership_->joinersAsked() : 0;
  broadcast(&waiting, 1, DataType::kInt64, 0, timeout);
  return static_cast<int>(waiting);
}

void Communicator::waitForDevice(void* stream, int device, Timeout timeout) {
  device_->waitForDevice(stream, device, timeoutFor("waitForDevice", timeout));
}

// Buffers the host's peers map once and read with plain loads (the single-copy all-reduce's
// fastest path, shm_single_copy.cc): memfd regions, not tied to this communicator's segment.
void* Communicator::allocateSharedBuffer(size_t bytes) {
  return transport::links::shm::allocateShared(bytes);
}

void Communicator::freeSharedBuffer(void* buffer) {
  transport::links::shm::releaseShared(buffer);
}

}  // namespace railshard
