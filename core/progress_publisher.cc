#include "core/progress_publisher.h"

#include <algorithm>

#include "base/error.h"
#include "base/logging.h"

namespace railshard {

namespace {

// Store calls from here must not hold anything up for long: a store whose host died
// answers with an error at once, one that is merely slow gets this long.
constexpr auto kStoreCallTimeout = std::chrono::seconds(2);

}  // namespace

Duration publishPeriodFor(int ranks) {
  constexpr Duration kFastest = std::chrono::milliseconds(200);
  constexpr int kStoreRecordsPerSecond = 2000;
  const Duration spread =
      std::chrono::microseconds(1000000LL * std::max(ranks, 1) / kStoreRecordsPerSecond);
  return std::max(kFastest, spread);
}

ProgressPublisher::ProgressPublisher(std::shared_ptr<Store> store, std::string key, Duration period)
    : store_(std::move(store)), key_(std::move(key)), period_(period) {
  thread_ = std::thread([this] { run(); });
}

ProgressPublisher::~ProgressPublisher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void ProgressPublisher::post(std::string key, std::string value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    posts_.emplace_back(std::move(key), std::move(value));
  }
  wake_.notify_all();
}

void ProgressPublisher::flush() {
  publishPosition();
}

void ProgressPublisher::publishPosition() {
  std::lock_guard<std::mutex> lock(store_mutex_);
  const uint64_t position = sequence_.load(std::memory_order_acquire);
  if (position == published_ || failed_) return;
  const std::string value = std::to_string(position - 1) + " " + collective_.load();
  try {
    store_->setString(key_, value, kStoreCallTimeout);
    published_ = position;
  } catch (const Error& e) {
    failed_ = true;
    RS_LOG_DEBUG("progress publisher: store unavailable, stopping: {}", e.what());
  }
}

void ProgressPublisher::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, period_, [&] { return stop_ || !posts_.empty(); });
    std::vector<std::pair<std::string, std::string>> posts;
    posts.swap(posts_);
    lock.unlock();
    for (const auto& [key, value] : posts) {
      try {
        store_->setString(key, value, kStoreCallTimeout);
      } catch (const Error& e) {
        RS_LOG_DEBUG("progress publisher: could not write {}: {}", key, e.what());
      }
    }
    publishPosition();
    lock.lock();
  }
}

}  // namespace railshard
