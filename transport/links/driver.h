#pragma once

#include "base/clock.h"

namespace railshard::transport::links {

// What owns the I/O of some links (a thread polling sockets, one polling completion queues):
// the group that uses them stops it before the links' messengers go.
class Driver {
 public:
  virtual ~Driver() = default;
  // Starts its threads, once every link it made is in its messenger.
  virtual void start() = 0;
  // Closing: lets what is queued go out, then waits (until `until`) for the peers to close
  // their ends too, so that nothing is reset while a peer may still read from it.
  virtual void linger(Deadline until) { (void)until; }
  // Stops its threads: after it returns nothing calls into any messenger any more.
  virtual void stop() = 0;
};

}  // namespace railshard::transport::links
