#include "base/trace.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include "base/error.h"
#include "base/logging.h"
#include "base/types.h"

namespace railshard::trace {

namespace detail {
std::atomic<bool> g_enabled{false};
}

namespace {

struct Counter {
  int64_t at_ns = 0;
  int rank = -1;
  const char* name = "";
  std::vector<double> values;
};

struct Track {
  int rank = -1;
  std::string name;
  std::string rail;
};

struct Provider {
  int rank = -1;
  std::function<std::string()> fn;
};

// One per process. Never destroyed: the exit-time flush and threads still running during
// static destruction may use it.
struct Recorder {
  std::mutex mutex;
  std::string dir;
  size_t capacity = 0;
  std::vector<Event> events;  // ring buffer once full
  size_t next = 0;            // where the next event goes once full
  uint64_t dropped = 0;
  std::vector<Counter> counters;  // bounded like the events, oldest dropped
  size_t counters_next = 0;
  std::vector<Track> tracks;      // id - 1
  std::map<int, RankInfo> ranks;  // every rank that set its info
  std::map<int, Provider> providers;
  std::map<int, std::vector<std::string>> kept_metadata;  // from removed providers, by rank
  int next_provider = 1;
  bool exit_hook = false;
};

Recorder& recorder() {
  static Recorder* instance = new Recorder();
  return *instance;
}

thread_local int t_rank = -1;

constexpr size_t kMaxCounters = 16384;

void flushAtExit() {
  if (enabled()) flush();
}

// Appends printf-formatted text.
template <typename... Args>
void appendf(std::string& out, const char* format, Args... args) {
  char buffer[512];
  const int n = std::snprintf(buffer, sizeof(buffer), format, args...);
  if (n > 0) out.append(buffer, static_cast<size_t>(std::min<int>(n, sizeof(buffer) - 1)));
}

std::string jsonString(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          appendf(out, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

const char* categoryName(Category category) {
  switch (category) {
    case Category::kCollective:
      return "collective";
    case Category::kPhase:
      return "phase";
    case Category::kWait:
      return "wait";
    case Category::kReduce:
      return "reduce";
    case Category::kRail:
      return "rail";
    case Category::kTransfer:
      return "transfer";
    case Category::kCounter:
      return "dispatch";
  }
  return "unknown";
}

std::string localHostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

// The events' args object.
void appendArgs(std::string& out, const Event& e, const std::vector<Track>& tracks) {
  out += "\"args\":{";
  bool first = true;
  auto sep = [&] {
    if (!first) out += ',';
    first = false;
  };
  switch (e.category) {
    case Category::kCollective:
      sep();
      appendf(out, "\"seq\":%llu,\"generation\":%d,\"bytes\":%llu,\"size\":%d",
              static_cast<unsigned long long>(e.seq), e.generation,
              static_cast<unsigned long long>(e.bytes), e.size);
      if (e.dtype != 0xff) {
        const auto dtype = static_cast<DataType>(e.dtype);
        appendf(out, ",\"dtype\":\"%s\",\"count\":%llu", std::string(name(dtype)).c_str(),
                static_cast<unsigned long long>(sizeOf(dtype) ? e.bytes / sizeOf(dtype) : 0));
      }
      if (e.op != 0xff) {
        appendf(out, ",\"op\":\"%s\"", std::string(name(static_cast<ReduceOp>(e.op))).c_str());
      }
      if (e.detail != nullptr) appendf(out, ",\"algorithm\":\"%s\"", e.detail);
      if (e.root >= 0) appendf(out, ",\"root\":%d", e.root);
      if (e.failed) out += ",\"failed\":true";
      break;
    case Category::kPhase:
      sep();
      appendf(out, "\"seq\":%llu", static_cast<unsigned long long>(e.seq));
      // A set-up phase's outcome (shm_read_probe: "cross_read" or "staged") and its bytes.
      if (e.detail != nullptr) appendf(out, ",\"choice\":\"%s\"", e.detail);
      if (e.bytes > 0) {
        appendf(out, ",\"bytes\":%llu", static_cast<unsigned long long>(e.bytes));
      }
      break;
    case Category::kReduce:
      sep();
      appendf(out, "\"bytes\":%llu", static_cast<unsigned long long>(e.bytes));
      if (e.dtype != 0xff) {
        appendf(out, ",\"dtype\":\"%s\"",
                std::string(name(static_cast<DataType>(e.dtype))).c_str());
      }
      if (e.op != 0xff) {
        appendf(out, ",\"op\":\"%s\"", std::string(name(static_cast<ReduceOp>(e.op))).c_str());
      }
      break;
    case Category::kRail: {
      sep();
      appendf(out, "\"peer\":%d,\"bytes\":%llu", e.peer, static_cast<unsigned long long>(e.bytes));
      if (e.track > 0 && static_cast<size_t>(e.track) <= tracks.size()) {
        out += ",\"rail\":" + jsonString(tracks[static_cast<size_t>(e.track) - 1].rail);
      }
      break;
    }
    case Category::kWait:
    case Category::kTransfer:
      sep();
      appendf(out, "\"peer\":%d,\"bytes\":%llu", e.peer, static_cast<unsigned long long>(e.bytes));
      break;
    case Category::kCounter:
      break;
  }
  out += '}';
}

// Microseconds on the job's clock.
double jobMicros(int64_t ns, const RankInfo& info) {
  return static_cast<double>(ns + info.offset_ns - info.epoch_ns) / 1000.0;
}

std::string renderRank(int rank, const RankInfo& info, const std::vector<const Event*>& events,
                       const std::vector<const Counter*>& counters,
                       const std::vector<Track>& tracks, const std::vector<std::string>& metadata,
                       uint64_t dropped) {
  std::string out;
  out.reserve(256 + events.size() * 200);
  out += "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  appendf(out,
          "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":%s}}",
          rank, jsonString("rank " + std::to_string(rank) + " (" + info.host + ")").c_str());
  appendf(out,
          ",\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"tid\":0,"
          "\"args\":{\"sort_index\":%d}}",
          rank, rank);
  appendf(out,
          ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":0,"
          "\"args\":{\"name\":\"collectives\"}}",
          rank);
  for (size_t i = 0; i < tracks.size(); ++i) {
    if (tracks[i].rank != rank) continue;
    appendf(
        out,
        ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%zu,\"args\":{\"name\":%s}}",
        rank, i + 1, jsonString(tracks[i].name).c_str());
  }
  uint64_t transfer_id = 0;
  for (const Event* e : events) {
    const double ts = jobMicros(e->begin_ns, info);
    const double dur = static_cast<double>(e->end_ns - e->begin_ns) / 1000.0;
    if (e->category == Category::kTransfer) {
      // Transfers overlap (many chunks in flight): async begin/end pairs, one id each.
      ++transfer_id;
      appendf(out,
              ",\n{\"ph\":\"b\",\"cat\":\"transfer\",\"name\":\"%s\",\"id\":%llu,\"pid\":%d,"
              "\"tid\":0,\"ts\":%.3f,",
              e->name, static_cast<unsigned long long>(transfer_id), rank, ts);
      appendArgs(out, *e, tracks);
      appendf(out,
              "},\n{\"ph\":\"e\",\"cat\":\"transfer\",\"name\":\"%s\",\"id\":%llu,\"pid\":%d,"
              "\"tid\":0,\"ts\":%.3f}",
              e->name, static_cast<unsigned long long>(transfer_id), rank,
              jobMicros(e->end_ns, info));
      continue;
    }
    appendf(out,
            ",\n{\"ph\":\"X\",\"cat\":\"%s\",\"name\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,"
            "\"dur\":%.3f,",
            categoryName(e->category), e->name, rank, e->track, ts, dur);
    appendArgs(out, *e, tracks);
    out += '}';
  }
  for (const Counter* c : counters) {
    appendf(out,
            ",\n{\"ph\":\"C\",\"cat\":\"dispatch\",\"name\":\"%s\",\"pid\":%d,\"tid\":0,"
            "\"ts\":%.3f,\"args\":{",
            c->name, rank, jobMicros(c->at_ns, info));
    for (size_t i = 0; i < c->values.size(); ++i) {
      appendf(out, "%s\"r%zu\":%.6g", i == 0 ? "" : ",", i, c->values[i]);
    }
    out += "}}";
  }
  out += "\n],\n\"railshard\":{";
  appendf(out, "\"version\":1,\"rank\":%d,\"world_size\":%d,\"host\":%s,\"os_pid\":%d,", rank,
          info.world_size, jsonString(info.host).c_str(), static_cast<int>(::getpid()));
  appendf(out,
          "\"clock\":{\"offset_us\":%.3f,\"uncertainty_us\":%.3f,\"aligned\":%s},"
          "\"events\":%zu,\"dropped_events\":%llu",
          static_cast<double>(info.offset_ns) / 1000.0,
          static_cast<double>(info.uncertainty_ns) / 1000.0, jsonString(info.aligned).c_str(),
          events.size(), static_cast<unsigned long long>(dropped));
  for (const auto& members : metadata) {
    if (!members.empty()) out += ",\n" + members;
  }
  out += "}}\n";
  return out;
}

}  // namespace

void enable(const std::string& dir, size_t max_events) {
  if (max_events == 0) throw InvalidArgument("trace: RAILSHARD_TRACE_EVENTS must be positive");
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (enabled()) {
    if (dir != r.dir) {
      RS_LOG_WARN("trace: already recording into {}; ignoring {}", r.dir, dir);
    }
    return;
  }
  r.dir = dir;
  r.capacity = max_events;
  r.events.clear();
  r.events.reserve(std::min<size_t>(max_events, 4096));
  r.next = 0;
  r.dropped = 0;
  if (!r.exit_hook) {
    std::atexit(flushAtExit);
    r.exit_hook = true;
  }
  detail::g_enabled.store(true, std::memory_order_relaxed);
}

void disableAndClear() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  detail::g_enabled.store(false, std::memory_order_relaxed);
  r.dir.clear();
  r.events.clear();
  r.events.shrink_to_fit();
  r.next = 0;
  r.dropped = 0;
  r.counters.clear();
  r.counters_next = 0;
  r.tracks.clear();
  r.ranks.clear();
  r.providers.clear();
  r.kept_metadata.clear();
}

const std::string& directory() {
  return recorder().dir;
}

void record(const Event& event) {
  if (!enabled() || event.rank < 0) return;
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.events.size() < r.capacity) {
    r.events.push_back(event);
    return;
  }
  r.events[r.next] = event;
  r.next = (r.next + 1) % r.capacity;
  ++r.dropped;
}

void recordCounter(int rank, const char* name, std::vector<double> values) {
  if (!enabled() || rank < 0) return;
  Counter counter{now(), rank, name, std::move(values)};
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.counters.size() < kMaxCounters) {
    r.counters.push_back(std::move(counter));
    return;
  }
  r.counters[r.counters_next] = std::move(counter);
  r.counters_next = (r.counters_next + 1) % kMaxCounters;
}

int32_t track(int rank, const std::string& name, const std::string& rail) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (size_t i = 0; i < r.tracks.size(); ++i) {
    if (r.tracks[i].rank == rank && r.tracks[i].name == name) return static_cast<int32_t>(i + 1);
  }
  r.tracks.push_back(Track{rank, name, rail});
  return static_cast<int32_t>(r.tracks.size());
}

int currentRank() {
  return t_rank;
}

ScopedRank::ScopedRank(int rank) : previous_(t_rank) {
  t_rank = rank;
}
ScopedRank::~ScopedRank() {
  t_rank = previous_;
}

void setRankInfo(int rank, const RankInfo& info) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  RankInfo& kept = r.ranks[rank];
  kept = info;
  if (kept.host.empty()) kept.host = localHostName();
}

int addMetadataProvider(int rank, std::function<std::string()> provider) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  const int id = r.next_provider++;
  r.providers[id] = Provider{rank, std::move(provider)};
  return id;
}

void removeMetadataProvider(int id) {
  Recorder& r = recorder();
  Provider provider;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.providers.find(id);
    if (it == r.providers.end()) return;
    provider = std::move(it->second);
    r.providers.erase(it);
  }
  std::string last;
  try {
    last = provider.fn();
  } catch (const std::exception& e) {
    RS_LOG_WARN("trace: rank {} metadata: {}", provider.rank, e.what());
  }
  std::lock_guard<std::mutex> lock(r.mutex);
  // The newest communicator of a rank describes it (a shrink replaces the old one).
  r.kept_metadata[provider.rank] = {std::move(last)};
}

std::string rankFile(const std::string& dir, int rank) {
  return dir + "/railshard-trace-rank" + std::to_string(rank) + ".json";
}

std::vector<std::string> flush() {
  Recorder& r = recorder();
  // Providers run without the lock: they read transport state that takes its own locks, and
  // a transport thread may be recording an event meanwhile.
  std::vector<std::pair<int, std::function<std::string()>>> providers;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    for (const auto& [id, p] : r.providers) providers.emplace_back(p.rank, p.fn);
  }
  std::map<int, std::vector<std::string>> live;
  for (const auto& [rank, fn] : providers) {
    try {
      live[rank] = {fn()};
    } catch (const std::exception& e) {
      RS_LOG_WARN("trace: rank {} metadata: {}", rank, e.what());
    }
  }
  std::vector<std::string> written;
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.dir.empty()) return written;
  std::error_code ec;
  std::filesystem::create_directories(r.dir, ec);
  // Every rank with events or info.
  std::set<int> ranks;
  for (const auto& [rank, info] : r.ranks) ranks.insert(rank);
  for (const Event& e : r.events) ranks.insert(e.rank);
  for (const int rank : ranks) {
    // Oldest first: after wrapping, the ring starts at `next`.
    std::vector<const Event*> events;
    const size_t n = r.events.size();
    const size_t start = n < r.capacity ? 0 : r.next;
    for (size_t i = 0; i < n; ++i) {
      const Event& e = r.events[(start + i) % n];
      if (e.rank == rank) events.push_back(&e);
    }
    std::vector<const Counter*> counters;
    const size_t m = r.counters.size();
    const size_t counter_start = m < kMaxCounters ? 0 : r.counters_next;
    for (size_t i = 0; i < m; ++i) {
      const Counter& c = r.counters[(counter_start + i) % m];
      if (c.rank == rank) counters.push_back(&c);
    }
    RankInfo info;
    if (auto it = r.ranks.find(rank); it != r.ranks.end()) info = it->second;
    if (info.host.empty()) info.host = localHostName();
    std::vector<std::string> metadata;
    if (auto it = live.find(rank); it != live.end()) {
      metadata = it->second;
    } else if (auto kept = r.kept_metadata.find(rank); kept != r.kept_metadata.end()) {
      metadata = kept->second;
    }
    const std::string text =
        renderRank(rank, info, events, counters, r.tracks, metadata, r.dropped);
    const std::string path = rankFile(r.dir, rank);
    const std::string temp = path + ".tmp";
    FILE* file = std::fopen(temp.c_str(), "w");
    if (file == nullptr) {
      RS_LOG_WARN("trace: cannot write {}: {}", temp, std::strerror(errno));
      continue;
    }
    const bool ok = std::fwrite(text.data(), 1, text.size(), file) == text.size();
    if (std::fclose(file) != 0 || !ok) {
      RS_LOG_WARN("trace: writing {} failed", temp);
      continue;
    }
    std::filesystem::rename(temp, path, ec);
    if (ec) {
      RS_LOG_WARN("trace: cannot rename {} to {}: {}", temp, path, ec.message());
      continue;
    }
    written.push_back(path);
  }
  return written;
}

}  // namespace railshard::trace
