#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/store.h"
#include "transport/bootstrap/exchange.h"
#include "transport/links/tcp/socket.h"

namespace railshard::transport::bootstrap {

struct RingOptions {
  int rank = 0;
  int size = 1;
  std::string token;           // the job token: a connection without it is refused
  std::string advertise_host;  // where this rank listens ("" = 127.0.0.1)
  std::string key_prefix;      // the group's store prefix (a generation has its own)
  Duration timeout = std::chrono::seconds(60);  // each call's, from its start
};

// The ranks in a ring of TCP connections, each to the next rank: what the store is not asked.
// Set-up costs two store requests per rank (its listening address published, its
// successor's read), whatever the size; an all-gather then passes every rank's value around
// the ring, N - 1 steps of one value each way, with no store request at all (NCCL's
// bootstrap does the same). Two descriptors per rank, held only while the group forms.
class RingExchange final : public Exchange {
 public:
  // Blocks until this rank is connected to both neighbours (TimeoutError naming the one that
  // did not come). Size 1: no sockets and no store request.
  RingExchange(Store& store, const RingOptions& options);
  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  std::vector<std::string> allGather(const std::string& mine, const std::string& what) override;

 private:
  // One step: `out` to the next rank while a value arrives from the previous one, side by
  // side (either may be larger than the sockets' buffers).
  std::string step(const std::string& out, uint32_t origin_out, uint32_t origin_in, uint32_t call,
                   uint64_t what_hash, const std::string& what, Deadline deadline);
  std::string describeStep(const std::string& what) const;
  // Set-up: what the next rank did with this rank's hello so far. Refused: it read the hello
  // and closed the connection. Gone: the connection was reset, never taken — the next rank
  // closed its listener (it gave up on a wait of its own, or exited), which is no reason to
  // stop waiting for the previous rank: its absence, if it is absent, is the error to report.
  // Gone is remembered: a reset is reported once, and the socket reads as closed after it.
  enum class NextState { kWaiting, kReplied, kRefused, kGone };
  NextState nextState();
  std::string refusedText(const std::string& what) const;

  RingOptions options_;
  int next_rank_ = 0;
  int prev_rank_ = 0;
  links::tcp::Fd next_;    // connected to the next rank
  std::string next_gone_;  // why the connection to the next rank was reset ("": it was not)
  links::tcp::Fd prev_;    // accepted from the previous rank
  uint32_t calls_ = 0;     // all-gathers so far: each carries its number
};

}  // namespace railshard::transport::bootstrap
