// Who is where, what went wrong and with whom (diagnostics.h).
#include "core/diagnostics.h"

#include <cstdlib>
#include <optional>
#include <thread>

#include "base/error.h"
#include "base/metrics.h"
#include "base/trace.h"
#include "core/channels.h"
#include "core/collective_tag.h"
#include "core/membership.h"
#include "core/point_to_point.h"
#include "core/progress_publisher.h"

namespace railshard {

namespace {

// The value of `key` if it is set, without waiting.
std::optional<std::string> peek(Store& store, const std::string& key) {
  try {
    return store.getString(key, Duration::zero());
  } catch (const TimeoutError&) {
    return std::nullopt;
  }
}

std::string joinRanks(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) text += ',';
    text += std::to_string(ranks[i]);
  }
  return text;
}

}  // namespace

Diagnostics::Diagnostics(const Config& config, const Membership& membership,
                         const Channels& channels, const Planner& planner)
    : config_(config), membership_(membership), channels_(channels), planner_(planner) {}

// The publisher's thread stops before the store it uses goes away.
Diagnostics::~Diagnostics() {
  // Its last description stays with the trace, for the file written at exit.
  if (trace_provider_ != 0) trace::removeMetadataProvider(trace_provider_);
  if (metrics_collector_ != 0) metrics::removeCollector(metrics_collector_);  // reads the links
  publisher_.reset();
}

void Diagnostics::start(Store& store) {
  setUpTracing(store);
  setUpMetrics();
  if (membership_.store() && membership_.size() > 1) {
    publisher_ = std::make_unique<ProgressPublisher>(
        membership_.store(),
        membership_.keyPrefix() + "/entered/" + std::to_string(membership_.rank()),
        // A timeout's diagnosis is as fresh as this (seconds at thousands of ranks, against
        // a timeout of tens of seconds).
        publishPeriodFor(membership_.size()));
  }
}

void Diagnostics::stopPublishing() {
  publisher_.reset();
}

void Diagnostics::entered(const transport::MessageTag& tag) {
  if (publisher_) publisher_->entered(tag.sequence, collectiveName(tag));
  collective_start_ = Clock::now();
}

std::string Diagnostics::explainLoss(const transport::MessageTag& tag, const std::string& error) {
  const double seconds = waited();
  auto lost = channels_.mesh().lostPeers();
  // Over shared memory the engine sees a dead peer's pid first; its TCP connection (same
  // process) ends at the same moment, and the mesh says which rank that was.
  for (int i = 0; i < 20 && lost.empty() && channels_.engine() != nullptr; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    lost = channels_.mesh().lostPeers();
  }
  std::string who;
  for (const auto& peer : lost) {
    who += (who.empty() ? "" : ", ") + membership_.describeRank(peer.rank);
    // Early, so that the survivors' shrink() need not wait for this rank to say it.
    if (publisher_) {
      auto [key, value] = membership_.lostMarkFor(peer);
      publisher_->post(std::move(key), std::move(value));
    }
  }
  return "rank " + std::to_string(membership_.rank()) + ": " + describeTag(tag) +
         " failed after waiting " + formatSeconds(seconds) + ": lost " +
         (who.empty() ? "a peer" : who) + ": " + error;
}

std::string Diagnostics::diagnoseMissing(const transport::MessageTag& tag) {
  if (PointToPoint::isPointToPoint(tag)) {
    // Only the two ranks of a pair know about its messages; nothing is published.
    return "the peer has not posted the matching send or recv (messages between two ranks "
           "match in the order they are posted)";
  }
  const std::shared_ptr<Store>& store = membership_.store();
  if (!store || !publisher_) return {};
  const double seconds = waited();
  publisher_->flush();
  std::vector<int> missing;
  std::vector<int> waiting;
  std::string lasts;
  const std::string name(collectiveName(tag));
  for (int r = 0; r < membership_.size(); ++r) {
    if (r == membership_.rank()) {
      waiting.push_back(r);
      continue;
    }
    std::optional<std::string> position;
    try {
      position = peek(*store, membership_.keyPrefix() + "/entered/" + std::to_string(r));
    } catch (const Error& e) {
      return std::string("who is missing is unknown: ") + e.what();
    }
    const uint64_t sequence = position ? std::strtoull(position->c_str(), nullptr, 10) : 0;
    if (position && sequence >= tag.sequence) {
      waiting.push_back(r);
      continue;
    }
    missing.push_back(r);
    if (!lasts.empty()) lasts += "; ";
    lasts += membership_.describeRank(r) + ": ";
    if (position) {
      lasts += "last entered " + position->substr(position->find(' ') + 1) + " #" +
               std::to_string(sequence);
    } else {
      lasts += "entered no collective";
    }
  }
  if (missing.empty()) {
    return "every rank entered " + name + " #" + std::to_string(tag.sequence) +
           ", but data stopped flowing (a stalled network path or a hung process?)";
  }
  return std::string(missing.size() == 1 ? "rank " : "ranks ") + joinRanks(missing) +
         " never entered " + name + " #" + std::to_string(tag.sequence) + " (ranks " +
         joinRanks(waiting) + " waiting " + formatSeconds(seconds) + "; " + lasts + ")";
}

std::string Diagnostics::explainTimeout(const transport::MessageTag& tag,
                                        const std::string& error) {
  const double seconds = waited();
  // The rank that timed out first said who was missing before it told the others; only a
  // rank that timed out without that (an algorithm's own deadline) asks the store itself.
  const bool explained = error.find(" never entered ") != std::string::npos ||
                         error.find("every rank entered") != std::string::npos ||
                         error.find("who is missing is unknown") != std::string::npos;
  const std::string diagnosis = explained ? std::string() : diagnoseMissing(tag);
  return "rank " + std::to_string(membership_.rank()) + ": " + describeTag(tag) +
         " timed out after " + formatSeconds(seconds) +
         (diagnosis.empty() ? "" : ": " + diagnosis) + " -- " + error;
}

}  // namespace railshard
