#pragma once

// Internals of Messenger shared by its implementation files: messenger.cc (set-up, posting,
// the peer's state), messenger_send.cc (striping, keeping, acknowledgements, rates, tail
// stealing), messenger_receive.cc (what arrives), messenger_links.cc (failover, re-admission,
// heartbeats, stalls), messenger_rendezvous.cc (one-sided moves). Not part of the interface.
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "transport/messaging/messenger.h"

namespace railshard::transport::messaging {

// Pieces up to this size are copied when written on a link the messenger acknowledges, so
// that their send completes at once; larger ones are kept by reference until acknowledged.
constexpr uint64_t kCopyPieceBytes = uint64_t{64} << 10;
// The receiver acknowledges at least every this many bytes, and whenever its link runs dry.
constexpr uint64_t kAckEveryBytes = uint64_t{256} << 10;
// A link that runs dry takes over work from the back of a slower link's queue, no less than
// this at a time.
constexpr uint64_t kMinStealBytes = uint64_t{64} << 10;
// Rate samples shorter than this are latency, not bandwidth; they are not recorded.
constexpr uint64_t kMinSampleBytes = uint64_t{128} << 10;
// A rendezvous message is read (or written) in pieces of at most this: the unit the rail
// scheduler times and a failed link's pieces move in. Depth x piece (2 MiB) is what a lane has
// requested and not yet received: it must arrive well within the ACK timeout, or the requester
// retries reads the responder is still serving (seen over rxe with 8 x 1 MiB and a 268 ms
// timeout; 1 MiB pieces were no faster there than 256 KiB ones).
constexpr uint64_t kOneSidedPieceBytes = uint64_t{256} << 10;

struct Messenger::LinkState {
  std::unique_ptr<links::Link> link;
  int index = 0;
  int rail = -1;  // in the scheduler (data links); -1: control only
  State state = State::kConnecting;
  bool ever_up = false;
  uint32_t generation = 0;          // of the connection now (or being made)
  std::deque<OutFramePtr> queue;    // not yet posted, in order
  std::deque<OutFramePtr> posted;   // posted, completion on the link not yet seen
  std::deque<OutFramePtr> unacked;  // complete on the link, kept until the peer has them
  uint64_t next_seq = 0;            // sequenced frames posted this generation
  // What arrived from the peer on it this generation.
  uint64_t landed = 0;  // sequenced frames taken whole
  uint64_t ack_sent = 0;
  uint64_t ack_bytes = 0;  // payload landed since the last acknowledgement
  bool ack_wanted = false;
  bool bye = false;     // the peer said goodbye on it
  bool closed = false;  // ... and closed it: its status stays, nothing more goes on it
  // Failover: the rank that takes it out reports, once nothing more can arrive on it, how many
  // of the peer's frames it took; each re-sends the rest of its own after the other's report.
  bool quiesced = false;
  bool report_sent = false;
  bool report_received = false;
  uint64_t report_consumed = 0;
  std::string down_reason;
  uint64_t outages = 0;  // times taken out while up (RailStatus::outages)
  // Re-admission and connection by records.
  Connect connect = Connect::kIdle;
  Clock::time_point last_attempt{};
  bool attempt_warned = false;  // a failed attempt to re-make it was logged (once per outage)
  // Rate: busy while it has frames queued, posted or kept; samples from the first delivery of
  // a busy period on (the receiver's clock for acknowledged links).
  bool busy = false;
  bool sample_open = false;
  uint64_t sample_ns = 0;
  uint64_t sample_bytes = 0;
  Clock::time_point last_progress{};   // last delivery, or when it became busy
  uint64_t taken_seen = 0;             // link->bytesTaken() when the stall rule last looked
  Clock::time_point last_heard{};      // last frame that arrived on it
  Clock::time_point pinged{};          // last ping sent for it (stall suspicion)
  uint64_t bytes_sent = 0;             // payload handed to it (of messages)
  uint64_t bytes_in_place = 0;         // of those, moved one-sided
  Clock::time_point last_one_sided{};  // its last one-sided completion (service-time samples)
  int32_t trace_track = 0;

  const links::LinkAttributes& attributes() const { return link->attributes(); }
  bool up() const { return state == State::kUp; }
  bool data() const { return rail >= 0; }
};

}  // namespace railshard::transport::messaging
