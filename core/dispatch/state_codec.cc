#include "core/dispatch/state_codec.h"

#include <cstring>
#include <string>

#include "base/error.h"

namespace railshard::dispatch {

namespace {

class Writer {
 public:
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void f64(double v) {
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(bits));
    u64(bits);
  }
  void f64s(const std::vector<double>& v) {
    u64(v.size());
    for (const double x : v) f64(x);
  }
  void bools(const std::vector<bool>& v) {
    u64(v.size());
    for (const bool b : v) u64(b ? 1 : 0);
  }
  std::vector<uint8_t> take() { return std::move(out_); }

 private:
  std::vector<uint8_t> out_;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  uint64_t u64(const char* what) {
    if (bytes_.size() - at_ < 8) {
      throw ProtocolError(std::string("dispatcher state: truncated at ") + what + " (byte " +
                          std::to_string(at_) + " of " + std::to_string(bytes_.size()) + ")");
    }
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{bytes_[at_ + static_cast<size_t>(i)]} << (8 * i);
    at_ += 8;
    return v;
  }
  double f64(const char* what) {
    const uint64_t bits = u64(what);
    double v = 0;
    std::memcpy(&v, &bits, sizeof(v));
    return v;
  }
  // A count of 8-byte items: never more than the bytes left can hold, so a corrupt count
  // cannot make the decoder allocate.
  size_t count(const char* what) {
    const uint64_t n = u64(what);
    if (n > (bytes_.size() - at_) / 8) {
      throw ProtocolError(std::string("dispatcher state: ") + what + " count " + std::to_string(n) +
                          " exceeds the " + std::to_string(bytes_.size() - at_) + " bytes left");
    }
    return static_cast<size_t>(n);
  }
  std::vector<double> f64s(const char* what) {
    std::vector<double> v(count(what));
    for (double& x : v) x = f64(what);
    return v;
  }
  std::vector<bool> bools(const char* what) {
    std::vector<bool> v(count(what));
    for (size_t i = 0; i < v.size(); ++i) v[i] = u64(what) != 0;
    return v;
  }
  void finish() const {
    if (at_ != bytes_.size()) {
      throw ProtocolError("dispatcher state: " + std::to_string(bytes_.size() - at_) +
                          " bytes left over after the last field");
    }
  }

 private:
  std::span<const uint8_t> bytes_;
  size_t at_ = 0;
};

void writeOptions(Writer& w, const DispatchOptions& o) {
  w.u64(static_cast<uint64_t>(o.policy));
  w.u64(o.micro_batch);
  w.u64(o.min_micro_batches);
  w.f64s(o.weights);
  w.f64(o.energy_budget);
  w.f64(o.estimator.half_life_steps);
  w.f64(o.estimator.jump_ratio);
}

DispatchOptions readOptions(Reader& r) {
  DispatchOptions o;
  const uint64_t policy = r.u64("policy");
  if (policy > static_cast<uint64_t>(Policy::kEnergy)) {
    throw ProtocolError("dispatcher state: policy " + std::to_string(policy) + " is not one");
  }
  o.policy = static_cast<Policy>(policy);
  o.micro_batch = static_cast<size_t>(r.u64("micro_batch"));
  o.min_micro_batches = static_cast<size_t>(r.u64("min_micro_batches"));
  o.weights = r.f64s("weights");
  o.energy_budget = r.f64("energy_budget");
  o.estimator.half_life_steps = r.f64("half_life_steps");
  o.estimator.jump_ratio = r.f64("jump_ratio");
  return o;
}

void writePlan(Writer& w, const StepPlan& p) {
  w.u64(p.step);
  w.u64(p.samples.size());
  for (const size_t s : p.samples) w.u64(s);
  w.u64(p.ranges.size());
  for (const auto& ranges : p.ranges) {
    w.u64(ranges.size());
    for (const Range& range : ranges) {
      w.u64(range.begin);
      w.u64(range.end);
    }
  }
}

StepPlan readPlan(Reader& r) {
  StepPlan p;
  p.step = r.u64("plan step");
  p.samples.resize(r.count("plan samples"));
  for (size_t& s : p.samples) s = static_cast<size_t>(r.u64("plan samples"));
  p.ranges.resize(r.count("plan ranks"));
  for (auto& ranges : p.ranges) {
    ranges.resize(r.count("plan ranges"));
    for (Range& range : ranges) {
      range.begin = r.u64("range begin");
      range.end = r.u64("range end");
    }
  }
  return p;
}

}  // namespace

struct StateCodecAccess {
  static void write(Writer& w, const ThroughputEstimator& e) {
    w.u64(e.states_.size());
    for (const auto& s : e.states_) {
      w.f64(s.rate);
      w.u64(static_cast<uint64_t>(s.reports));
      w.f64(s.suspect);
      w.f64(s.capacity);
      w.u64(s.straddles ? 1 : 0);
    }
  }
  static void read(Reader& r, ThroughputEstimator& e) {
    e.states_.resize(r.count("estimator ranks"));
    for (auto& s : e.states_) {
      s.rate = r.f64("rate");
      s.reports = static_cast<int>(r.u64("reports"));
      s.suspect = r.f64("suspect");
      s.capacity = r.f64("capacity");
      s.straddles = r.u64("straddles") != 0;
    }
  }
  static void write(Writer& w, const Dispatcher& d) {
    writeOptions(w, d.options_);
    w.u64(d.epoch_size_);
    w.u64(d.epoch_);
    w.u64(d.cursor_);
    w.u64(d.done_);
    w.u64(d.next_step_);
    w.u64(d.step_open_ ? 1 : 0);
    w.bools(d.alive_);
    for (const auto* list : {&d.returned_, &d.taken_returned_}) {
      w.u64(list->size());
      for (const Range& range : *list) {
        w.u64(range.begin);
        w.u64(range.end);
      }
    }
    w.u64(d.load_.size());
    for (const LoadSignals& l : d.load_) {
      for (const double v : {l.queued_samples, l.memory_bytes, l.memory_limit_bytes,
                             l.gpu_utilization, l.gpu_memory_bytes, l.gpu_memory_total_bytes,
                             l.cpu_quota_cores, l.cpu_throttled, l.power_watts, l.cap_samples}) {
        w.f64(v);
      }
    }
    w.f64s(d.joules_per_sample_);
    w.f64s(d.static_weights_);
    write(w, d.estimator_);
    writePlan(w, d.plan_);
  }
  static Dispatcher readDispatcher(Reader& r) {
    DispatchOptions options = readOptions(r);
    const uint64_t epoch_size = r.u64("epoch_size");
    // Constructed for one rank without weights (the checks of a fresh dispatcher do not
    // apply to a grown one), then every field overwritten.
    DispatchOptions plain = options;
    plain.weights.clear();
    Dispatcher d(1, epoch_size, plain);
    d.options_ = std::move(options);
    d.epoch_ = r.u64("epoch");
    d.cursor_ = r.u64("cursor");
    d.done_ = r.u64("done");
    d.next_step_ = r.u64("next_step");
    d.step_open_ = r.u64("step_open") != 0;
    d.alive_ = r.bools("alive");
    for (auto* list : {&d.returned_, &d.taken_returned_}) {
      list->resize(r.count("returned ranges"));
      for (Range& range : *list) {
        range.begin = r.u64("range begin");
        range.end = r.u64("range end");
      }
    }
    d.load_.resize(r.count("load signals"));
    for (LoadSignals& l : d.load_) {
      for (double* v : {&l.queued_samples, &l.memory_bytes, &l.memory_limit_bytes,
                        &l.gpu_utilization, &l.gpu_memory_bytes, &l.gpu_memory_total_bytes,
                        &l.cpu_quota_cores, &l.cpu_throttled, &l.power_watts, &l.cap_samples}) {
        *v = r.f64("load signal");
      }
    }
    d.joules_per_sample_ = r.f64s("joules per sample");
    d.static_weights_ = r.f64s("static_weights");
    d.estimator_ = ThroughputEstimator(0, d.options_.estimator);
    read(r, d.estimator_);
    d.plan_ = readPlan(r);
    const size_t n = d.alive_.size();
    if (n == 0 || d.load_.size() != n || d.joules_per_sample_.size() != n ||
        d.static_weights_.size() != n || static_cast<size_t>(d.estimator_.ranks()) != n ||
        (d.step_open_ && (d.plan_.samples.size() != n || d.plan_.ranges.size() != n)) ||
        d.cursor_ > epoch_size || d.done_ > d.cursor_) {
      throw ProtocolError("dispatcher state: inconsistent sizes (" + std::to_string(n) +
                          " ranks, " + std::to_string(d.load_.size()) + " loads, " +
                          std::to_string(d.static_weights_.size()) + " weights, " +
                          std::to_string(d.estimator_.ranks()) + " estimates, " +
                          std::to_string(d.plan_.ranges.size()) + " planned; cursor " +
                          std::to_string(d.cursor_) + " of " + std::to_string(epoch_size) + ")");
    }
    return d;
  }
  static void write(Writer& w, const ElasticState& s) {
    write(w, s.dispatcher_);
    w.u64(s.previous_ ? 1 : 0);
    if (s.previous_) write(w, *s.previous_);
    w.u64(s.committed_);
    w.u64(s.redo_ ? 1 : 0);
  }
  static ElasticState readElastic(Reader& r) {
    Dispatcher current = readDispatcher(r);
    ElasticState s(1, current.epochSize(), DispatchOptions{});
    s.dispatcher_ = std::move(current);
    if (r.u64("has_previous") != 0) s.previous_ = readDispatcher(r);
    s.committed_ = r.u64("committed");
    s.redo_ = r.u64("redo") != 0;
    return s;
  }
};

std::vector<uint8_t> StateCodec::encode(const ElasticState& state,
                                        const std::vector<int>& launch_ranks) {
  Writer w;
  StateCodecAccess::write(w, state);
  w.u64(launch_ranks.size());
  for (const int r : launch_ranks) w.u64(static_cast<uint64_t>(r));
  return w.take();
}

StateCodec::Decoded StateCodec::decode(std::span<const uint8_t> bytes) {
  Reader r(bytes);
  Decoded out{StateCodecAccess::readElastic(r), {}};
  out.launch_ranks.resize(r.count("launch ranks"));
  for (int& rank : out.launch_ranks) rank = static_cast<int>(r.u64("launch ranks"));
  r.finish();
  return out;
}

}  // namespace railshard::dispatch
