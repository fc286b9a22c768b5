// monitored_barrier of the torch.distributed backend: through the store, as gloo's is.
#include <algorithm>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/error.h"
#include "python/csrc/process_group.h"

namespace railshard::python {

void ProcessGroupRailshard::monitoredBarrier(const c10d::BarrierOptions& opts,
                                             bool wait_all_ranks) {
  guardedCall([&] {
    const auto timeout = std::chrono::duration_cast<Duration>(deadline(opts.timeout));
    const auto budget = opts.timeout.count() >= 0 ? opts.timeout : timeout_;
    const auto ms =
        std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(budget).count());
    const std::string prefix =
        "railshard/monitored_barrier/" + std::to_string(monitored_barriers_++) + "/";
    const Clock::time_point end = Clock::now() + std::chrono::duration_cast<Duration>(budget);
    auto left = [&] { return std::max(Duration::zero(), end - Clock::now()); };
    const int me = getRank();
    if (me != 0) {
      store_->setString(prefix + std::to_string(me), "arrived", timeout);
      try {
        store_->wait({prefix + "released"}, left());
      } catch (const TimeoutError&) {
        throw TimeoutError("Rank " + std::to_string(me) + " timed out in monitoredBarrier after " +
                           ms +
                           " ms: rank 0 did not release it (a rank did not arrive, or rank "
                           "0 is not in the barrier)");
      }
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
      throw TimeoutError(std::string(missing.size() == 1 ? "Rank " : "Ranks ") + ranks +
                         " failed to pass monitoredBarrier in " + ms + " ms");
    }
    store_->setString(prefix + "released", "1", timeout);
  });
}

}  // namespace railshard::python
