#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <string>

#include "transport/links/link.h"
#include "transport/links/tcp/socket.h"
#include "transport/messaging/messenger.h"

namespace railshard::transport::links::tcp {

class TcpDriver;

// One TCP connection to one peer: a rail, one socket of a rail, or the default connection.
// Frames go out with one writev of header and payload straight from the sender's buffer
// (written from the posting thread when nothing is queued ahead, else by the driver's thread
// once the socket has room), and arrive straight into the buffer the messenger names, so a
// large message is not copied in user space. Its driver's thread reads it; the messenger's
// lock guards its send side and its descriptor.
class TcpLink final : public Link {
 public:
  // `target`: the peer's listener for this rail ("ip:port"), to dial again; `local`: the local
  // rail address to bind ("" for the default connection).
  TcpLink(TcpDriver& driver, LinkAttributes attributes, Fd fd, int peer, int channel,
          std::string target, std::string local_address);
  ~TcpLink() override;

  const LinkAttributes& attributes() const override { return attributes_; }
  bool canPost() const override;
  bool post(const messaging::OutFramePtr& frame) override;
  void postControl(const messaging::FrameHeader& header, const std::string& payload) override;
  void shutdown() override;
  void detach() override;
  void rateChanged(double gbps) override;
  uint64_t bytesTaken() const override { return taken_; }
  void redial(uint32_t generation) override;

  int peer() const { return peer_; }
  int channel() const { return channel_; }
  const std::string& target() const { return target_; }
  const std::string& localAddress() const { return local_address_; }
  int fd() const { return fd_.get(); }

  // --- the driver's thread ---
  // With the messenger's lock held: writes what is queued until the socket blocks; the data
  // frames that completed (0 or 1).
  int flushLocked();
  // Reads and takes apart what the socket holds, up to a budget; reports into the messenger.
  // `after_send_failure`: a send to it failed already; read what arrived before that anyway.
  void readable(bool after_send_failure = false);
  // With the lock held: the socket is shut (shutdown() was called, or it broke): closes it.
  // True when it was open.
  bool closeLocked();
  // A send on it failed (set under the lock, reported by the driver's thread).
  const std::string& brokenLocked() const { return broken_; }
  bool sendsEmptyLocked() const { return sends_.empty(); }
  bool readClosed() const { return read_closed_.load(); }
  bool wantsClose() const { return shut_.load(); }
  // A connection dialled again (re-admission): a fresh stream, the reader starting over.
  void adoptLocked(Fd fd);
  // Tests: shuts the socket as a failing NIC would (the failover path runs without root).
  void breakForTesting();
  // Closing: no more writes; the peer sees the end of the stream after what is queued.
  void halfCloseLocked();

 private:
  struct Item {
    messaging::FrameHeader header;
    messaging::OutFramePtr frame;  // a data frame the messenger posted; null for control
    // The payload: the frame's (user memory), or payload bytes [owned_from, length) in `owned`
    // (a control frame's, or what is left of a detached frame's).
    const uint8_t* data = nullptr;
    std::string owned;
    size_t owned_from = 0;
    size_t written = 0;  // of header + payload
    size_t total() const { return sizeof(header) + header.length; }
    const uint8_t* payloadAt(size_t offset) const {
      return data != nullptr ? data + offset
                             : reinterpret_cast<const uint8_t*>(owned.data()) + offset - owned_from;
    }
  };
  // Writes queued items until the socket blocks or the queue is empty; control items only
  // when `control_only`. Returns the data frames completed.
  int writeLocked(bool control_only);
  void setWriteInterest(bool on);
  void brokeLocked(const std::string& why);
  void startFrame();
  // Reports into the messenger (the lock taken around each call).
  void failed(const std::string& why, bool peer_closed);

  TcpDriver& driver_;
  LinkAttributes attributes_;
  int peer_;
  int channel_;
  std::string target_;
  std::string local_address_;
  Fd fd_;  // guarded by the messenger's lock (closed only under it)

  // Send side: guarded by the messenger's lock.
  std::deque<Item> sends_;
  int data_items_ = 0;
  int unreported_ = 0;  // frames written by post() ahead of one still on its way
  bool write_interest_ = false;
  int sndbuf_ = 0;
  uint64_t taken_ = 0;  // bytes the kernel accepted, every connection (the messenger's lock)
  std::string broken_;
  std::atomic<bool> shut_{false};

  // Receive side: the driver's thread only.
  messaging::FrameHeader header_;
  size_t header_got_ = 0;
  bool in_payload_ = false;
  uint64_t payload_got_ = 0;
  messaging::Messenger::Landing landing_;
  bool drain_ = false;  // the payload is dropped
  std::atomic<bool> read_closed_{false};
};

}  // namespace railshard::transport::links::tcp
