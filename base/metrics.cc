#include "base/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <thread>

#include <prometheus/check_names.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "base/error.h"
#include "base/logging.h"
#include "base/metrics_collectable.h"

namespace railshard::metrics {
namespace {

enum class Type { kCounter, kGauge };

// The values live in prometheus-cpp's registry (families of counters and gauges); what this
// keeps beside them is what prometheus-cpp does not: a metric's type decided by its first use,
// help text that may come after that use, and the type rules checked with errors that name
// the metric.
struct Metric {
  Type type = Type::kCounter;
  std::string help;
  bool described = false;
  prometheus::Family<prometheus::Counter>* counters = nullptr;
  prometheus::Family<prometheus::Gauge>* gauges = nullptr;
};

// One mutex per concern: the registry's is held only for updates, the collectors' while
// collectors run (so removeCollector can wait for a running one), the exporter's around
// start/stop. A collector takes the registry's inside the collectors' — never the reverse.
struct Registry {
  std::mutex mutex;
  std::shared_ptr<prometheus::Registry> values = std::make_shared<prometheus::Registry>();
  std::map<std::string, Metric, std::less<>> metrics;
};

struct Collectors {
  std::mutex mutex;
  std::map<int, std::function<void()>> callbacks;
  int next_id = 1;
};

struct Exporter {
  std::mutex control;  // serialises start/stop
  std::mutex mutex;    // guards stop and wakes the thread
  std::condition_variable wake;
  bool stop = false;
  std::thread thread;
  pid_t owner = 0;  // the process that started the thread (see stopFileExporter)
};

// Never destroyed: the exit flush and threads still running at exit may use them after
// static destructors have started.
Registry& registry() {
  static auto* instance = new Registry;
  return *instance;
}
Collectors& collectors() {
  static auto* instance = new Collectors;
  return *instance;
}
Exporter& exporter() {
  static auto* instance = new Exporter;
  return *instance;
}

void checkName(std::string_view name) {
  if (!prometheus::CheckMetricName(std::string(name))) {
    throw InvalidArgument("metrics: '" + std::string(name) +
                          "' is not a valid metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)");
  }
}

// prometheus-cpp's label set (a std::map: the same labels in any order are one series).
prometheus::Labels labelsOf(std::string_view name, const Labels& labels) {
  prometheus::Labels out;
  for (const auto& [key, value] : labels) {
    if (!prometheus::CheckLabelName(key)) {
      throw InvalidArgument("metrics: " + std::string(name) + ": '" + key +
                            "' is not a valid label name ([a-zA-Z_][a-zA-Z0-9_]*, no leading __)");
    }
    if (!out.emplace(key, value).second) {
      throw InvalidArgument("metrics: " + std::string(name) + ": label '" + key + "' given twice");
    }
  }
  return out;
}

const char* typeName(Type type) {
  return type == Type::kCounter ? "counter" : "gauge";
}

// The metric `name`, created with `type` on first use.
Metric& metricFor(Registry& r, std::string_view name, Type type) {
  auto it = r.metrics.find(name);
  if (it != r.metrics.end()) return it->second;
  Metric metric;
  metric.type = type;
  // The help given here is replaced at collection (collect()), so a later describe() counts.
  if (type == Type::kCounter) {
    metric.counters = &prometheus::BuildCounter().Name(std::string(name)).Register(*r.values);
  } else {
    metric.gauges = &prometheus::BuildGauge().Name(std::string(name)).Register(*r.values);
  }
  return r.metrics.emplace(std::string(name), std::move(metric)).first->second;
}

void runCollectors() {
  Collectors& c = collectors();
  std::lock_guard<std::mutex> lock(c.mutex);
  for (auto& [id, callback] : c.callbacks) {
    try {
      callback();
    } catch (const std::exception& e) {
      // A broken collector must not cost the other metrics their scrape.
      RS_LOG_WARN("metrics: collector {} failed: {}", id, e.what());
    }
  }
}

bool writeAtomically(const std::string& path, const std::string& text, std::string& error) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      error = "cannot open " + tmp + " for writing: " + std::strerror(errno);
      return false;
    }
    out << text;
    out.flush();
    if (!out) {
      error = "cannot write " + tmp + ": " + std::strerror(errno);
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    error = "cannot rename " + tmp + " to " + path + ": " + std::strerror(errno);
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

// Writes at once (a scraper finds the file soon after start-up), then every interval, then
// once more when stopped: the final snapshot.
void exportLoop(std::string path, std::chrono::milliseconds interval) {
  Exporter& e = exporter();
  bool warned = false;
  for (;;) {
    bool last;
    {
      std::lock_guard<std::mutex> lock(e.mutex);
      last = e.stop;
    }
    try {
      std::string error;
      if (writeAtomically(path, renderPrometheus(), error)) {
        warned = false;
      } else if (!warned) {
        // Once per failing streak: a missing directory would otherwise log every interval.
        RS_LOG_WARN("metrics: {}; retrying every {} ms without further warnings", error,
                    interval.count());
        warned = true;
      }
    } catch (const std::exception& ex) {
      if (!warned) RS_LOG_WARN("metrics: exporting to {} failed: {}", path, ex.what());
      warned = true;
    }
    if (last) return;
    std::unique_lock<std::mutex> lock(e.mutex);
    e.wake.wait_for(lock, interval, [&] { return e.stop; });
  }
}

}  // namespace

void describe(std::string_view name, std::string_view type, std::string_view help) {
  checkName(name);
  Type parsed;
  if (type == "counter") {
    parsed = Type::kCounter;
  } else if (type == "gauge") {
    parsed = Type::kGauge;
  } else {
    throw InvalidArgument("metrics: " + std::string(name) + ": type '" + std::string(type) +
                          "' is not counter or gauge");
  }
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  Metric& metric = metricFor(r, name, parsed);
  if (metric.type != parsed) {
    throw InvalidArgument("metrics: " + std::string(name) + " is already a " +
                          typeName(metric.type) + ", cannot describe it as a " + std::string(type));
  }
  // prometheus-cpp 1.0 writes help text as it is: a newline would end the # HELP line and
  // break the scrape, so the text is kept to one line here.
  metric.help = std::string(help);
  std::replace(metric.help.begin(), metric.help.end(), '\n', ' ');
  metric.described = true;
}

void add(std::string_view name, const Labels& labels, double delta) {
  checkName(name);
  const prometheus::Labels key = labelsOf(name, labels);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  Metric& metric = metricFor(r, name, Type::kCounter);
  if (metric.type == Type::kGauge) {
    metric.gauges->Add(key).Increment(delta);
    return;
  }
  // prometheus-cpp ignores a negative increment without a word; here it is the caller's bug.
  if (!(delta >= 0)) {
    char text[32];
    const auto printed = std::to_chars(text, text + sizeof(text), delta);
    throw InvalidArgument("metrics: " + std::string(name) + " is a counter; delta " +
                          std::string(text, printed.ptr) + " must be >= 0");
  }
  metric.counters->Add(key).Increment(delta);
}

void set(std::string_view name, const Labels& labels, double value) {
  checkName(name);
  const prometheus::Labels key = labelsOf(name, labels);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  Metric& metric = metricFor(r, name, Type::kGauge);
  if (metric.type != Type::kGauge) {
    throw InvalidArgument("metrics: " + std::string(name) +
                          " is a counter; set() is for gauges (use add())");
  }
  metric.gauges->Add(key).Set(value);
}

double value(std::string_view name, const Labels& labels) {
  const prometheus::Labels key = labelsOf(name, labels);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.metrics.find(name);
  if (it == r.metrics.end()) return 0;
  const Metric& metric = it->second;
  if (metric.type == Type::kCounter) {
    return metric.counters->Has(key) ? metric.counters->Add(key).Value() : 0;
  }
  return metric.gauges->Has(key) ? metric.gauges->Add(key).Value() : 0;
}

std::vector<prometheus::MetricFamily> collect() {
  runCollectors();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<prometheus::MetricFamily> families = r.values->Collect();
  std::vector<prometheus::MetricFamily> out;
  out.reserve(families.size());
  for (auto& family : families) {
    if (family.metric.empty()) continue;  // described but never written: nothing to scrape
    const auto it = r.metrics.find(family.name);
    family.help = it != r.metrics.end() && it->second.described
                      ? it->second.help
                      : "railshard metric (not described)";
    // prometheus-cpp keeps series in a hash map: sorted here, so a scrape reads the same way
    // twice (metrics by name, series by their sorted labels).
    std::sort(family.metric.begin(), family.metric.end(),
              [](const auto& a, const auto& b) { return a.label < b.label; });
    out.push_back(std::move(family));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

std::string renderPrometheus() {
  return prometheus::TextSerializer().Serialize(collect());
}

int addCollector(std::function<void()> collector) {
  Collectors& c = collectors();
  std::lock_guard<std::mutex> lock(c.mutex);
  const int id = c.next_id++;
  c.callbacks.emplace(id, std::move(collector));
  return id;
}

void removeCollector(int id) {
  Collectors& c = collectors();
  std::lock_guard<std::mutex> lock(c.mutex);  // waits for a render that is running it
  c.callbacks.erase(id);
}

void reset() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.metrics.clear();
  r.values = std::make_shared<prometheus::Registry>();
}

void startFileExporter(const std::string& path, std::chrono::milliseconds interval) {
  if (path.empty()) throw InvalidArgument("metrics: the exporter's file path is empty");
  if (interval.count() <= 0) {
    throw InvalidArgument("metrics: exporter interval " + std::to_string(interval.count()) +
                          " ms must be > 0");
  }
  // The exit flush may log: make sure the logger exists before the atexit handler is
  // registered, so that it is destroyed after the handler has run.
  (void)log::logger();
  static std::once_flag at_exit;
  std::call_once(at_exit, [] { std::atexit([] { stopFileExporter(); }); });

  stopFileExporter();
  Exporter& e = exporter();
  std::lock_guard<std::mutex> control(e.control);
  {
    std::lock_guard<std::mutex> lock(e.mutex);
    e.stop = false;
  }
  e.thread = std::thread(exportLoop, path, interval);
  e.owner = ::getpid();
}

void stopFileExporter() {
  Exporter& e = exporter();
  std::lock_guard<std::mutex> control(e.control);
  if (!e.thread.joinable()) return;
  if (e.owner != ::getpid()) {
    // A forked child exiting: the thread is its parent's and was not copied; joining its
    // handle would be undefined. Move the handle out of the way without touching it, into
    // static storage that is never destroyed: no allocation (the parent's exporter may have
    // held the allocator's lock at fork) and nothing for LeakSanitizer to call a leak.
    alignas(std::thread) static unsigned char orphan[sizeof(std::thread)];
    ::new (static_cast<void*>(orphan)) std::thread(std::move(e.thread));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(e.mutex);
    e.stop = true;
  }
  e.wake.notify_all();
  if (e.thread.get_id() == std::this_thread::get_id()) {
    e.thread.detach();  // exit() from a collector on the exporter's own thread
    return;
  }
  e.thread.join();
}

}  // namespace railshard::metrics
