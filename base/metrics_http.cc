#include "base/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>

#include "base/error.h"
#include "base/metrics_collectable.h"

namespace railshard::metrics {

namespace {

// A scraper that connects and sends nothing holds one of the server's threads for this long
// at most (civetweb's request timeout); the other thread serves the rest meanwhile.
constexpr const char* kRequestTimeoutMs = "5000";
constexpr const char* kThreads = "2";

// prometheus-cpp's Exposer asks this for the registry's families on every scrape.
class Registry final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override { return collect(); }
};

struct Server {
  std::mutex control;
  std::unique_ptr<prometheus::Exposer> exposer;
  std::shared_ptr<Registry> registry = std::make_shared<Registry>();
  pid_t owner = 0;  // a forked child (a DataLoader worker) has none of the server's threads
};

Server& server() {
  static auto* s = new Server;  // never destroyed (see startHttpExporter)
  return *s;
}

}  // namespace

int startHttpExporter(const std::string& host, int port) {
  in_addr parsed{};
  if (::inet_pton(AF_INET, host.c_str(), &parsed) != 1) {
    throw InvalidArgument("metrics HTTP: '" + host + "' is not an IPv4 address");
  }
  if (port < 0 || port > 65535) {
    throw InvalidArgument("metrics HTTP: port " + std::to_string(port) + " is not in 0..65535");
  }
  const std::string address = host + ":" + std::to_string(port);
  // The new server binds before the old one stops: a second start on a port that is in use
  // fails and leaves the running one alone.
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{"listening_ports", address, "num_threads", kThreads,
                                 "request_timeout_ms", kRequestTimeoutMs});
  } catch (const std::exception& e) {
    throw Error("metrics HTTP: cannot listen on " + address + ": " + e.what() +
                " (RAILSHARD_METRICS_PORT)");
  }
  stopHttpExporter();
  Server& s = server();
  std::lock_guard<std::mutex> lock(s.control);
  s.exposer = std::move(exposer);
  s.exposer->RegisterCollectable(s.registry, "/metrics");
  s.owner = ::getpid();
  // Not stopped at exit: civetweb's stop waits out its 2 s poll quantum, which every rank
  // would add to its exit; the server's threads end with the process (the registry they read
  // is never destroyed).
  const std::vector<int> ports = s.exposer->GetListeningPorts();
  return ports.empty() ? port : ports.front();
}

void stopHttpExporter() {
  Server& s = server();
  std::lock_guard<std::mutex> lock(s.control);
  if (!s.exposer) return;
  if (s.owner != ::getpid()) {
    // A forked child: the server's threads are its parent's; stopping would wait for them
    // forever. The copy is left alone (and the parent's socket with it).
    (void)s.exposer.release();
    return;
  }
  s.exposer.reset();
}

}  // namespace railshard::metrics
