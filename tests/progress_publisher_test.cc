// The progress records a rank keeps in the store for diagnosing hangs: what reaches a real
// store server, and how often at any N.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "core/progress_publisher.h"
#include "launcher/tcp_store.h"
#include "launcher/tcp_store_server.h"
#include "transport/links/tcp/socket.h"

namespace railshard {
namespace {

using namespace std::chrono_literals;

constexpr char kToken[] = "progress-token";

double seconds(Duration d) {
  return std::chrono::duration<double>(d).count();
}

TEST(ProgressPublisher, PeriodKeepsTheStoresLoadBoundedAtAnyRankCount) {
  for (int ranks : {1, 2, 16, 256, 400}) {
    EXPECT_EQ(publishPeriodFor(ranks), Duration(200ms)) << ranks << " ranks";
  }
  for (int ranks : {401, 1024, 4096, 65536, 1 << 20}) {
    const Duration period = publishPeriodFor(ranks);
    EXPECT_GT(period, Duration(200ms)) << ranks << " ranks";
    // Records a second at the store, all ranks together: within 2,000 (one rounding step).
    EXPECT_LE(ranks / seconds(period), 2000.5) << ranks << " ranks";
    EXPECT_GE(ranks / seconds(period), 1999.0) << ranks << " ranks";
  }
}

// A fast loop of collectives costs the store one record a period, the latest position.
TEST(ProgressPublisher, PublishesTheLatestPositionOncePerPeriodToARealStore) {
  launcher::TcpStoreServer server(transport::links::tcp::resolve("127.0.0.1:0", "test"), kToken);
  auto store = std::make_shared<launcher::TcpStore>("127.0.0.1:" + std::to_string(server.port()),
                                                    kToken, 5s);
  const auto start = std::chrono::steady_clock::now();
  uint64_t sequence = 0;
  {
    ProgressPublisher publisher(store, "job/entered/3", 100ms);
    while (std::chrono::steady_clock::now() - start < 1s) {
      publisher.entered(sequence++, "allreduce");
      std::this_thread::sleep_for(100us);
    }
    publisher.flush();
  }
  const double lived = seconds(std::chrono::steady_clock::now() - start);
  const launcher::StoreStats stats = server.stats();
  // Thousands of collectives, about ten records (one per 100 ms, the flush, scheduling slack).
  EXPECT_GT(sequence, 1000u);
  EXPECT_GE(stats.sets, 5u) << stats.describe();
  EXPECT_LE(stats.sets, static_cast<uint64_t>(lived / 0.1) + 2) << stats.describe();
  EXPECT_EQ(store->getString("job/entered/3", 5s), std::to_string(sequence - 1) + " allreduce");
}

}  // namespace
}  // namespace railshard
