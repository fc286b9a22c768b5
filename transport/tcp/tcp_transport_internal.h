#pragma once

// Internals of TcpTransport shared by its implementation files: tcp_transport.cc (requests,
// progress, writing), tcp_transport_read.cc (reading, reassembly, acks),
// tcp_transport_connect.cc (mesh set-up), tcp_transport_rails.cc (rail failure, failover,
// tail stealing), tcp_transport_rejoin.cc (re-admission), tcp_transport_failure.cc (fatal
// failures, aborts, lost connections), tcp_transport_trace.cc (trace events). Not part of the
// interface.
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/messaging/message_book.h"
#include "transport/rails/rail_scheduler.h"
#include "transport/tcp/tcp_transport.h"

namespace railshard::transport::tcp {

namespace detail {

constexpr uint64_t kWakeToken = ~uint64_t{0};
constexpr uint64_t kListenToken = ~uint64_t{0} - 1;  // unused by epoll; listeners are polled
// Largest message staged when it arrives before its receive is posted. Bounds what a
// confused or hostile peer can make us allocate.
constexpr uint64_t kMaxStagedBytes = uint64_t{1} << 34;
// Bytes read from one connection per epoll event before others get a turn.
constexpr size_t kReadBudget = size_t{8} << 20;
// How long a closing transport waits for its peers' goodbyes so that no connection is reset
// while a peer may still read from it.
constexpr auto kLinger = std::chrono::seconds(2);
// Multi-rail: pieces up to this size are copied when written, so their send completes at
// once; larger ones are kept by reference until the peer acknowledges them.
constexpr size_t kCopyPieceBytes = size_t{64} << 10;
// Multi-rail: the receiver acknowledges at least every this many bytes, and at every frame
// boundary where its socket runs dry.
constexpr uint64_t kAckEveryBytes = uint64_t{256} << 10;
// Multi-rail: a rail that runs dry takes over work from the back of a slower rail's queue,
// no less than this at a time.
constexpr uint64_t kMinStealBytes = uint64_t{64} << 10;
// Rate samples shorter than this are latency, not bandwidth; they are not recorded.
constexpr uint64_t kMinSampleBytes = uint64_t{128} << 10;

// Multi-rail: a connection's kernel send buffer holds about this much of its rail's rate,
// within these bounds (the kernel doubles the value for its bookkeeping).
constexpr double kRailBufferSeconds = 0.001;
constexpr int kMinRailBuffer = 128 << 10;
constexpr int kMaxRailBuffer = 8 << 20;

inline uint64_t channelToken(int peer, int channel) {
  return (static_cast<uint64_t>(peer) << 16) | static_cast<uint64_t>(channel);
}

}  // namespace detail

// A send the user posted. Completes when every piece is released (written to the socket on a
// single connection; with several, acknowledged by the peer or copied).
struct TcpTransport::SendOp : Request {
  SendOp(int peer, size_t bytes, const MessageTag& tag) : Request(Kind::kSend, peer, bytes, tag) {}
  // Guarded by the peer's mutex.
  int outstanding = 0;  // pieces not yet released
  int unwritten = 0;    // pieces not yet fully written to a socket
  bool waited = false;  // someone waits for it: once all is written, copy what is unacked
};

// One frame queued on or written to a connection: a piece of a message, or a control frame.
struct TcpTransport::Segment {
  FrameHeader header;
  const uint8_t* data = nullptr;   // payload: user memory, or owned below
  std::string owned;               // payload copy (control text, small pieces, after failure)
  std::shared_ptr<SendOp> parent;  // the send this piece counts towards; null once released
  size_t written = 0;              // of header + payload
  uint64_t stream_begin = 0;       // connection stream offset of the header (once started)
  bool retained = false;           // multi-rail data: kept until the peer acknowledges it
  int64_t trace_begin_ns = 0;      // first byte handed to the socket (tracing on)
  uint64_t streamEnd() const { return stream_begin + sizeof(FrameHeader) + header.payload_bytes; }
  void own() {
    owned.assign(reinterpret_cast<const char*>(data), header.payload_bytes);
    data = reinterpret_cast<const uint8_t*>(owned.data());
  }
};

// One TCP connection to a peer (one rail, or one socket of a rail).
struct TcpTransport::Channel {
  int peer = -1;
  int index = 0;
  int rail = -1;         // index into Options::peer_rails[peer]; -1 for the default connection
  std::string name;      // "rail0", "rail0#1"; "tcp" for the default connection
  std::string local;     // local rail address ("" for the default connection)
  std::string remote;    // peer's address as host:port or IP
  std::string listener;  // the peer's listener for this rail ("ip:port"), to reconnect
  Fd fd;
  uint16_t generation = 0;  // bumped on both ranks each time the connection is re-made

  // Guarded by the peer's mutex.
  bool up = true;                                // gets new pieces
  bool lost = false;                             // socket gone (error, or taken out and closed)
  std::deque<std::shared_ptr<Segment>> sends;    // front may be partly written
  std::deque<std::shared_ptr<Segment>> unacked;  // written, awaiting the peer's ack
  bool write_interest = false;
  int sndbuf = 0;  // SO_SNDBUF we set (multi-rail), 0 = kernel autotuning
  uint64_t stream_written = 0;
  uint64_t acked = 0;  // peer consumed our stream up to here
  uint64_t payload_sent = 0;
  bool bye_received = false;
  bool read_closed = false;
  // Rate estimation: the connection is busy while it has unsent or unacknowledged data.
  bool busy = false;
  bool sample_open = false;     // the busy period's first ack has come: samples are timed
  uint64_t sample_peer_ns = 0;  // the peer's clock at the first ack of the sample
  uint64_t sample_bytes = 0;
  Clock::time_point last_progress{};  // last ack that advanced, or when it became busy
  Clock::time_point last_heard{};     // last byte read
  Clock::time_point pinged{};         // last ping sent on our behalf (stall suspicion)
  // Failover of this connection.
  bool report_sent = false;      // we told the peer how much of it we consumed
  uint64_t report_consumed = 0;  // ... namely this
  bool report_received = false;  // the peer told us; our undelivered data was re-sent
  Clock::time_point last_rejoin_attempt{};
  std::string down_reason;
  int32_t trace_track = 0;  // this connection's track in the trace, once it carried data

  // Reader state: touched by the progress thread only.
  FrameHeader header;
  size_t header_got = 0;
  bool in_payload = false;
  uint8_t* target = nullptr;
  size_t payload_got = 0;
  messaging::IncomingPtr target_in;  // the message the payload belongs to (kData)
  messaging::PieceInfo piece;        // the other layer's piece being read (kPiece)
  std::string abort_text;
  uint64_t consumed = 0;     // stream bytes read
  uint64_t ack_sent = 0;     // `consumed` in our last ack
  bool ack_wanted = false;   // a frame that asks for acknowledgement completed since then
  bool ping_wanted = false;  // a ping came: the ack goes back on this connection

  // A new connection for this rail (re-admission): what identifies the rail and what it has
  // carried so far stay; every per-connection state starts afresh.
  void restart(Fd new_fd, uint16_t new_generation) {
    Channel fresh;
    fresh.peer = peer;
    fresh.index = index;
    fresh.rail = rail;
    fresh.name = std::move(name);
    fresh.local = std::move(local);
    fresh.remote = std::move(remote);
    fresh.listener = std::move(listener);
    fresh.payload_sent = payload_sent;
    fresh.last_rejoin_attempt = last_rejoin_attempt;
    fresh.trace_track = trace_track;
    fresh.fd = std::move(new_fd);
    fresh.generation = new_generation;
    fresh.last_heard = Clock::now();
    *this = std::move(fresh);
  }
};

struct TcpTransport::Peer {
  int rank = -1;
  std::string address;  // for messages
  std::vector<std::unique_ptr<Channel>> channels;
  bool connector = false;  // this rank opened the connections (it is the higher rank)
  std::vector<std::string> rail_listeners;  // peer's "ip:port" listeners (for rejoin)

  std::mutex mutex;  // guards everything below and the channels' shared state
  std::unique_ptr<rails::RailScheduler> scheduler;  // several channels only
  messaging::MessageBook book{-1, -1, nullptr};     // numbering, matching, staging, checks
  uint64_t piece_bytes_sent = 0;                    // of kPiece frames (PieceLink)
  bool bye_received = false;
  uint64_t bye_messages = 0;  // messages the peer sent before its goodbye
  bool lost = false;          // no connection left
  // Heartbeat, progress thread only: when anything last arrived from the peer, and when we
  // last pinged it.
  Clock::time_point heard{};
  Clock::time_point heartbeat_sent{};

  bool multi() const { return channels.size() > 1; }
};

// A listening socket kept for rails that come back.
struct TcpTransport::Listener {
  Fd fd;
  std::string ip;  // "" for the default listener
};

// A connection re-established by the keeper, waiting for the progress thread to adopt it.
struct TcpTransport::Rejoined {
  int peer = -1;
  int channel = -1;
  uint16_t generation = 0;
  Fd fd;
};

}  // namespace railshard::transport::tcp
