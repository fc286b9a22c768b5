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
#include <mutex>
#include <new>
#include <thread>

#include "base/error.h"
#include "base/logging.h"

namespace railshard::metrics {
namespace {

enum class Type { kCounter, kGauge };

struct Metric {
  Type type = Type::kCounter;
  std::string help;
  bool described = false;
  std::map<Labels, double> series;  // sorted labels -> value; map order is the render order
};

// One mutex per concern: the registry's is held only for map updates, the collectors' while
// collectors run (so removeCollector can wait for a running one), the exporter's around
// start/stop. A collector takes the registry's inside the collectors' — never the reverse.
struct Registry {
  std::mutex mutex;
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

bool validName(std::string_view name, bool colons) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colons && c == ':');
    const bool digit = c >= '0' && c <= '9';
    if (!alpha && !(digit && i > 0)) return false;
  }
  return true;
}

void checkName(std::string_view name) {
  if (!validName(name, true)) {
    throw InvalidArgument("metrics: '" + std::string(name) +
                          "' is not a valid metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)");
  }
}

// Sorted by key, so the same label set in any order is the same series.
Labels normalised(std::string_view name, const Labels& labels) {
  Labels sorted = labels;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    const std::string& key = sorted[i].first;
    if (!validName(key, false) || key.rfind("__", 0) == 0) {
      throw InvalidArgument("metrics: " + std::string(name) + ": '" + key +
                            "' is not a valid label name ([a-zA-Z_][a-zA-Z0-9_]*, no leading __)");
    }
    if (i > 0 && sorted[i - 1].first == key) {
      throw InvalidArgument("metrics: " + std::string(name) + ": label '" + key + "' given twice");
    }
  }
  return sorted;
}

const char* typeName(Type type) {
  return type == Type::kCounter ? "counter" : "gauge";
}

// The metric `name`, created with `type` on first use.
Metric& metricFor(Registry& r, std::string_view name, Type type) {
  auto it = r.metrics.find(name);
  if (it == r.metrics.end()) {
    it = r.metrics.emplace(std::string(name), Metric{}).first;
    it->second.type = type;
  }
  return it->second;
}

std::string escaped(std::string_view text, bool quotes) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quotes) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

// Shortest text that reads back as the same double; the format's spellings for the rest.
std::string number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char text[64];
  const auto result = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, result.ptr);
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
  metric.help = std::string(help);
  metric.described = true;
}

void add(std::string_view name, const Labels& labels, double delta) {
  checkName(name);
  Labels key = normalised(name, labels);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  Metric& metric = metricFor(r, name, Type::kCounter);
  if (metric.type == Type::kCounter && !(delta >= 0)) {
    throw InvalidArgument("metrics: " + std::string(name) + " is a counter; delta " +
                          number(delta) + " must be >= 0");
  }
  metric.series[std::move(key)] += delta;
}

void set(std::string_view name, const Labels& labels, double value) {
  checkName(name);
  Labels key = normalised(name, labels);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  Metric& metric = metricFor(r, name, Type::kGauge);
  if (metric.type != Type::kGauge) {
    throw InvalidArgument("metrics: " + std::string(name) +
                          " is a counter; set() is for gauges (use add())");
  }
  metric.series[std::move(key)] = value;
}

double value(std::string_view name, const Labels& labels) {
  const Labels key = normalised(name, labels);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto metric = r.metrics.find(name);
  if (metric == r.metrics.end()) return 0;
  const auto series = metric->second.series.find(key);
  return series == metric->second.series.end() ? 0 : series->second;
}

std::string renderPrometheus() {
  runCollectors();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::string out;
  for (const auto& [name, metric] : r.metrics) {
    if (metric.series.empty()) continue;  // described but never written: nothing to scrape
    out += "# HELP " + name + " " +
           escaped(metric.described ? metric.help : "railshard metric (not described)", false) +
           "\n";
    out += "# TYPE " + name + " " + typeName(metric.type) + "\n";
    for (const auto& [labels, v] : metric.series) {
      out += name;
      if (!labels.empty()) {
        out += "{";
        for (size_t i = 0; i < labels.size(); ++i) {
          if (i > 0) out += ",";
          out += labels[i].first + "=\"" + escaped(labels[i].second, true) + "\"";
        }
        out += "}";
      }
      // Appended piecewise: GCC 12 warns falsely (-Warray-bounds) on " " + std::string.
      out += ' ';
      out += number(v);
      out += '\n';
    }
  }
  return out;
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
