// monitored_barrier of the torch.distributed backend: through the store, as gloo's is.
#include <algorithm>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/error.h"
#include "python/csrc/process_group.h"

namespace railshard::python {

namespace {
constexpr Duration kVerdictGrace = std::chrono::seconds(1);
}  // namespace

void ProcessGroupRailshard::monitoredBarrier(const c10d::BarrierOptions& opts,
                                             bool wait_all_ranks) {
  guardedCall([&] {
    if (!store_) {
      // An ElasticGroup's generations share the job's store under railshard's own keys;
      // barrier() waits the same way and names who never came.
      throw InvalidArgument(
          "monitored_barrier is not available on an ElasticGroup's process group (use "
          "barrier(): its TimeoutError names the ranks that did not arrive)");
    }
    const auto timeout = std::chrono::duration_cast<Duration>(deadline(opts.timeout));
    const auto budget = opts.timeout.count() >= 0 ? opts.timeout : timeout_;
    const auto ms =
        std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(budget).count());
    const std::string prefix =
        "railshard/monitored_barrier/" + std::to_string(monitored_barriers_++) + "/";
    const Clock::time_point end = Clock::now() + std::chrono::duration_cast<Duration>(budget);
    auto left = [&] { return std::max(Duration::zero(), end - Clock::now()); };
    const int me = getRank();
    // Rank 0 publishes its verdict under "released": "1", or the reason the barrier failed,
    // so a rank that did arrive learns at once who did not (gloo's ranks only learn that
    // rank 0 went quiet). The first words are gloo's, which torch's own tests match.
    const auto arrivedButFailed = [&](const std::string& why) {
      return "Rank " + std::to_string(me) +
             " successfully reached monitoredBarrier, but received errors while waiting for "
             "send/recv from rank 0: " +
             why;
    };
    if (me != 0) {
      store_->setString(prefix + std::to_string(me), "arrived", timeout);
      // Rank 0's deadline ends when ours does (or later, if it entered later): a second
      // more lets its verdict, rather than our own timeout, say what went wrong.
      std::string verdict;
      try {
        verdict = store_->getString(prefix + "released", left() + kVerdictGrace);
      } catch (const TimeoutError&) {
        throw TimeoutError(
            arrivedButFailed("rank 0 did not release it within " + ms +
                             " ms and 1 s of grace (rank 0 is not in the barrier, or is stuck)"));
      }
      if (verdict != "1") throw TimeoutError(arrivedButFailed("rank 0 reports: " + verdict));
      return;
    }
    if (budget.count() <= 0 && getSize() > 1) {
      throw TimeoutError("Rank 0 timed out in monitoredBarrier after 0 ms");
    }
    std::vector<int> missing;
    for (int r = 1; r < getSize(); ++r) {
      try {
        store_->wait({prefix + std::to_string(r)}, missing.empty() ? left() : Duration::zero());
      } catch (const TimeoutError&) {
        missing.push_back(r);
        if (!wait_all_ranks) break;
      }
    }
    if (!missing.empty()) {
      std::string ranks;
      for (size_t i = 0; i < missing.size(); ++i) {
        ranks += (i == 0 ? "" : ", ") + std::to_string(missing[i]);
      }
      const std::string why = std::string(missing.size() == 1 ? "Rank " : "Ranks ") + ranks +
                              " failed to pass monitoredBarrier in " + ms + " ms";
      // Best effort: the ranks that arrived wait for this; if the store is gone they time
      // out on their own deadline instead.
      try {
        store_->setString(prefix + "released", why, timeout);
      } catch (const Error&) {
      }
      throw TimeoutError(why);
    }
    store_->setString(prefix + "released", "1", timeout);
  });
}

}  // namespace railshard::python
