#pragma once

// The metrics registry (base/metrics.h) served over HTTP, for a Prometheus server to scrape
// (RAILSHARD_METRICS_PORT): GET /metrics -- or / -- answers 200 with renderPrometheus() as
// "text/plain; version=0.0.4", HEAD the same headers, anything else 404 or 405. One thread
// serves one request at a time, each bounded (a client that does not send its request within
// 5 s is dropped), so a stuck scraper cannot grow memory or hold a rank up.
#include <string>

namespace railshard::metrics {

// Binds `host`:`port` (port 0: any free one) and starts serving; returns the port bound.
// A second start replaces the first. Error naming the address and errno when it cannot bind.
int startHttpExporter(const std::string& host, int port);
// Stops serving and closes the socket; no-op when none is running.
void stopHttpExporter();

}  // namespace railshard::metrics
