#pragma once

#include <functional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "transport/links/tcp/hello.h"
#include "transport/links/tcp/socket.h"

namespace railshard::transport::links::tcp {

// Accepts the connections of a start-up (the ring's, the data connections') on some listening
// sockets and reads their hellos side by side, so that one silent or slow connection delays
// nobody else's: each has kHelloTimeout to send its hello; beyond kMaxPendingHellos
// incomplete ones the oldest is closed, so a peer opening connections and never speaking
// cannot exhaust the descriptors, and real ranks (which send their hello at once) still get
// in. Every refused connection is closed and logged with why ("rank 3: refused a data
// connection from 127.0.0.1:5555: wrong job token").
class HelloAcceptor {
 public:
  static constexpr auto kHelloTimeout = std::chrono::seconds(5);
  static constexpr size_t kMaxPendingHellos = 64;

  // `who` names this rank in the log ("rank 3"), `what` the connections ("data connection").
  HelloAcceptor(std::string who, std::string what);

  // Whether a complete hello is acceptable, given the connection it came on: empty when it
  // is, else the reason to refuse it.
  using Check = std::function<std::string(const ReceivedHello& hello, int fd)>;
  // Takes an accepted connection; returns the reason to refuse it instead (e.g. its reply
  // could not be sent), or empty.
  using Admit =
      std::function<std::string(Fd fd, const ReceivedHello& hello, const std::string& from)>;

  // Accepts on `listen_fds` until `done()` holds. At `deadline` throws TimeoutError: "`who`:
  // " + missing() + " within N s".
  void run(const std::vector<int>& listen_fds, Deadline deadline, Duration timeout,
           const std::function<bool()>& done, const Check& check, const Admit& admit,
           const std::function<std::string()>& missing);

 private:
  struct Pending {
    Fd fd;
    std::string from;
    Deadline deadline;
    std::vector<uint8_t> bytes;   // received so far
    size_t want = sizeof(Hello);  // the whole hello once its fixed part is known
  };
  void refuse(const Pending& p, const std::string& reason) const;
  // Reads what has arrived; true when the connection is finished with (admitted, refused or
  // gone).
  bool read(Pending& p, const Check& check, const Admit& admit) const;

  std::string who_;
  std::string what_;
};

}  // namespace railshard::transport::links::tcp
