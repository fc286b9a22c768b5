#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/links/driver.h"
#include "transport/links/tcp/socket.h"
#include "transport/links/tcp/tcp_link.h"
#include "transport/messaging/failure_state.h"

namespace railshard::transport::links::tcp {

// A listening socket kept for rails that come back (re-admission).
struct Listener {
  Fd fd;
  std::string ip;  // "" for the default listener
};

// The I/O of one group's TCP links: one thread polls every socket (epoll; no thread per peer),
// reads what arrives and writes what the sockets had no room for; another (the keeper) accepts
// dialled links on the listeners, and a third (the dialer) dials them: links made again after
// a failure, and links connected on first use, which either rank of the pair may dial (so that
// two ranks dialling each other at once each still accept the other's). Every call into a
// messenger holds its lock.
class TcpDriver final : public Driver {
 public:
  struct Options {
    int rank = 0;
    int size = 1;
    std::string token;  // demanded in every re-dialled connection's hello
    messaging::FailureState* failure = nullptr;
  };
  TcpDriver(Options options, std::vector<std::unique_ptr<Listener>> listeners);
  ~TcpDriver() override;

  // A link over a connected socket, to be added to `peer`'s messenger. Its I/O starts with
  // start(), once every link is in its messenger.
  std::unique_ptr<TcpLink> makeLink(Fd fd, LinkAttributes attributes, int peer, int channel,
                                    std::string target, std::string local_address);
  void start() override;
  void linger(Deadline until) override;
  void stop() override;

  // --- the links ---
  void wake();
  void setWriteInterest(TcpLink& link, bool on);
  // The keeper dials `link` again at `generation` (it reports linkUpLocked when it worked).
  void redial(TcpLink& link, uint32_t generation);
  messaging::FailureState& failure() const { return *options_.failure; }
  // The reader saw the group's failure: no user memory is written from now on.
  void readerQuiesced() { quiesced_.store(true); }
  // Where it accepts re-dialled links ("127.0.0.2:40123"), the default listener's first.
  std::vector<std::string> listening() const;
  // Tests: the link `channel` to `peer` breaks as a failing NIC would.
  void breakForTesting(int peer, int channel);
  // Tests: while paused the driver's thread neither reads nor writes (returns once it stopped).
  void pauseForTesting(bool paused);

 private:
  struct Dial {
    TcpLink* link = nullptr;
    uint32_t generation = 0;
  };
  struct Adopted {
    TcpLink* link = nullptr;
    uint32_t generation = 0;
    Fd fd;
  };
  void progressLoop();
  void keeperLoop();
  void dialerLoop();
  void acceptRejoin(int listen_fd);
  void dialAgain(const Dial& dial);
  void adopt();
  void closeShut();
  void reportBroken();
  uint64_t tokenOf(const TcpLink& link) const;

  Options options_;
  std::vector<std::unique_ptr<Listener>> listeners_;
  Fd epoll_fd_;
  Fd wake_fd_;
  std::vector<TcpLink*> links_;  // epoll token = index
  std::thread progress_;
  std::thread keeper_;
  std::thread dialer_;
  std::condition_variable dials_changed_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> quiesced_{false};
  int quiescer_ = 0;
  std::mutex keeper_mutex_;
  std::vector<Dial> dials_;       // asked for, the keeper's
  std::vector<Adopted> adopted_;  // dialled or accepted, the progress thread's to install
  std::atomic<bool> paused_{false};
  std::atomic<bool> parked_{false};
};

}  // namespace railshard::transport::links::tcp
