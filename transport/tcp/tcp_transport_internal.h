#pragma once

// Internals of TcpTransport shared by its implementation files (tcp_transport.cc: data path
// and progress; tcp_transport_connect.cc: mesh set-up; tcp_transport_failure.cc: failures,
// aborts, lost connections). Not part of the interface.
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/tcp/tcp_transport.h"

namespace railshard::transport::tcp {

namespace detail {

constexpr uint64_t kWakeToken = ~uint64_t{0};
// Largest message staged when it arrives before its receive is posted. Bounds what a
// confused or hostile peer can make us allocate.
constexpr uint64_t kMaxStagedBytes = uint64_t{1} << 34;
// Bytes read from one peer per epoll event before others get a turn.
constexpr size_t kReadBudget = size_t{8} << 20;
// How long a closing transport waits for its peers' goodbyes so that no connection is reset
// while a peer may still read from it.
constexpr auto kLinger = std::chrono::seconds(2);

}  // namespace detail

struct TcpTransport::SendOp : Request {
  SendOp(int peer, const void* payload, size_t bytes, const MessageTag& tag, bool internal)
      : Request(Kind::kSend, peer, bytes, tag),
        data(static_cast<const uint8_t*>(payload)),
        internal(internal) {
    header.kind = static_cast<uint8_t>(FrameKind::kData);
    header.payload_bytes = bytes;
    header.tag = tag;
  }
  FrameHeader header;
  const uint8_t* data;
  size_t written = 0;  // of header + payload
  bool internal;       // abort/bye frames: nobody waits on them
  std::string owned;   // payload storage of internal frames
};

struct TcpTransport::RecvOp : Request {
  RecvOp(int peer, void* buffer, size_t bytes, const MessageTag& tag)
      : Request(Kind::kRecv, peer, bytes, tag), data(static_cast<uint8_t*>(buffer)) {}
  uint8_t* data;
};

// A data frame that arrived before its receive was posted.
struct TcpTransport::Staged {
  FrameHeader header;
  std::vector<uint8_t> bytes;
  bool complete = false;
  std::shared_ptr<RecvOp> claimer;  // receive posted while the payload was still arriving
};

struct TcpTransport::Peer {
  int rank = -1;
  Fd fd;
  std::string address;

  std::mutex mutex;  // guards everything below up to the reader state
  std::deque<std::shared_ptr<SendOp>> sends;
  bool write_interest = false;
  std::deque<std::shared_ptr<RecvOp>> recvs;
  std::deque<std::shared_ptr<Staged>> staged;
  bool bye_received = false;
  bool read_closed = false;  // peer half-closed after its goodbye; we may still write
  bool lost = false;

  // Reader state: touched by the progress thread only.
  FrameHeader header;
  size_t header_got = 0;
  bool in_payload = false;
  uint8_t* target = nullptr;
  size_t payload_got = 0;
  std::shared_ptr<RecvOp> target_op;
  std::shared_ptr<Staged> target_staged;
  std::string abort_text;
};

}  // namespace railshard::transport::tcp
