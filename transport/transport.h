#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <string>

#include "core/base/clock.h"
#include "transport/message_tag.h"
#include "transport/request.h"

namespace railshard::transport {

// Turns tags into words for error messages ("allreduce #12 (float sum, count 1000)"), and
// explains a disagreement between two ranks' tags. Supplied by the layer that knows what the
// tag fields mean (core); the transport only compares them.
struct TagFormatter {
  std::function<std::string(const MessageTag&)> describe;
  std::function<std::string(int my_rank, const MessageTag& mine, int peer,
                            const MessageTag& theirs)>
      mismatch;
};

// Point-to-point messaging between the ranks of one communicator. Messages between a pair of
// ranks are matched in the order they are posted (FIFO per direction), which is all the
// deterministic collective algorithms need. Every blocking call has a deadline. After any
// fatal error the transport is poisoned: every pending and later call raises that error.
class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;

  // Starts sending `bytes` from `data` to `peer`; `data` must stay valid until completion.
  virtual RequestPtr isend(int peer, const void* data, size_t bytes, const MessageTag& tag) = 0;
  // Starts receiving exactly `bytes` into `data` from `peer`. The peer's message must carry
  // the same tag and size, else MismatchError on both sides.
  virtual RequestPtr irecv(int peer, void* data, size_t bytes, const MessageTag& tag) = 0;
  // Blocks until `request` completes. Raises TimeoutError at `deadline` (naming the peer and
  // the tag), or the error that poisoned the transport.
  virtual void wait(const RequestPtr& request, Deadline deadline) = 0;

  // Poisons the transport with `error`; when `tell_peers`, sends it to every peer so that
  // they fail fast with the same message instead of waiting for their deadlines.
  virtual void abort(std::exception_ptr error, bool tell_peers) = 0;
  // Throws the poisoning error if any.
  virtual void checkHealthy() const = 0;
};

}  // namespace railshard::transport
