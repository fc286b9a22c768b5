// The discrete-event run of every rank's program (sim_model.h).
#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <queue>
#include <set>

#include "base/error.h"
#include "benchmarks/sim/sim_model.h"

namespace railshard::sim {

int ClusterModel::worldSize() const {
  int n = 0;
  for (int l : ranks_per_host) n += l;
  return n;
}

collectives::HostLayout ClusterModel::layout() const {
  std::vector<std::string> keys;
  for (size_t h = 0; h < ranks_per_host.size(); ++h) {
    if (ranks_per_host[h] < 1)
      throw InvalidArgument("simulator: host " + std::to_string(h) + " has no rank");
    for (int i = 0; i < ranks_per_host[h]; ++i) keys.push_back("host" + std::to_string(h));
  }
  return collectives::HostLayout::fromKeys(keys);
}

collectives::TunerInput tunerInput(const ClusterModel& model, const collectives::HostLayout& layout,
                                   size_t bytes) {
  collectives::TunerInput input;
  input.bytes = bytes;
  input.world_size = layout.worldSize();
  input.shm = layout.hostCount() == 1 && layout.worldSize() > 1;
  input.hosts = layout.hostCount();
  input.ranks_per_host = layout.maxLocal();
  input.host_shm = layout.twoLevel();
  input.shm_slot_bytes = input.shm || input.host_shm ? model.shm_slot_bytes : 0;
  input.network = model.network;
  input.shm_link = model.shm;
  input.reduce_gbps = model.reduce_gbps;
  const double cores = model.cores > 0 ? model.cores : layout.maxLocal();
  input.ranks_per_core = std::max(1.0, layout.maxLocal() / cores);
  return input;
}

namespace {

// Servers a job queues for, first free first (a host's cores, one NIC direction).
class Pool {
 public:
  explicit Pool(size_t servers) : free_(std::max<size_t>(1, servers), 0.0) {}
  // Ends a job of `us` that may start at `ready`.
  double use(double ready, double us) {
    auto it = std::min_element(free_.begin(), free_.end());
    *it = std::max(ready, *it) + us;
    return *it;
  }

 private:
  std::vector<double> free_;
};

struct Event {
  double at;
  uint64_t order;  // ties: first scheduled first, so runs are repeatable
  int rank;
  bool operator>(const Event& other) const {
    return at != other.at ? at > other.at : order > other.order;
  }
};

class Engine {
 public:
  Engine(const ClusterModel& model, const collectives::HostLayout& layout,
         const std::vector<Program>& programs)
      : model_(model),
        layout_(layout),
        programs_(programs),
        pc_(programs.size(), 0),
        clock_(programs.size(), 0.0),
        slept_(programs.size(), false),
        waiting_for_(programs.size(), -1),
        peers_(programs.size()),
        posts_(programs.size(), 0),
        cursor_(programs.size(), -1),
        wait_since_(programs.size(), -1.0),
        watchers_(programs.size()) {
    const size_t hosts = layout.hosts.size();
    auto cores_of = [&](size_t h) {
      return model.cores > 0 ? static_cast<size_t>(model.cores) : layout.hosts[h].size();
    };
    if (model.cores_shared_by_hosts) {
      cpus_.emplace_back(cores_of(0));
    } else {
      for (size_t h = 0; h < hosts; ++h) cpus_.emplace_back(cores_of(h));
    }
    for (size_t h = 0; h < hosts; ++h) {
      tx_.emplace_back(1);
      rx_.emplace_back(1);
    }
    // Ranks per core of the most crowded machine (the whole job's on a shared one).
    double crowding = 1;
    for (size_t h = 0; h < hosts; ++h) {
      const double ranks = model.cores_shared_by_hosts
                               ? static_cast<double>(programs.size())
                               : static_cast<double>(layout.hosts[h].size());
      crowding = std::max(crowding, ranks / static_cast<double>(cores_of(h)));
    }
    wake_us_ = model.wake_cpu_us + model.wake_per_crowding_us * crowding;
  }

  SimResult run() {
    for (size_t r = 0; r < programs_.size(); ++r) schedule(0, static_cast<int>(r));
    while (!events_.empty()) {
      const Event e = events_.top();
      events_.pop();
      advance(e.rank, e.at);
    }
    SimResult result;
    for (size_t r = 0; r < programs_.size(); ++r) {
      if (pc_[r] != programs_[r].size()) {
        throw Error("simulator: rank " + std::to_string(r) + " never finished (step " +
                    std::to_string(pc_[r]) + " of " + std::to_string(programs_[r].size()) +
                    "): the programs do not match");
      }
      result.micros = std::max(result.micros, clock_[r]);
      result.peers.emplace_back(peers_[r].begin(), peers_[r].end());
    }
    result.messages = messages_;
    return result;
  }

 private:
  void schedule(double at, int rank) { events_.push(Event{at, order_++, rank}); }
  Pool& cpu(int rank) {
    return model_.cores_shared_by_hosts ? cpus_.front() : cpus_[static_cast<size_t>(hostOf(rank))];
  }
  int hostOf(int rank) const { return layout_.host_of[static_cast<size_t>(rank)]; }

  // Runs `rank` from `now` until it waits or ends; each op that takes time ends in an event.
  void advance(int rank, double now) {
    const auto r = static_cast<size_t>(rank);
    double t = std::max(now, clock_[r]);
    if (slept_[r]) {
      slept_[r] = false;
      t = cpu(rank).use(t, wake_us_);
    }
    while (pc_[r] < programs_[r].size()) {
      const Op& op = programs_[r][pc_[r]];
      if (t > now) {  // the op starts later: let everything before it happen first
        clock_[r] = t;
        schedule(t, rank);
        return;
      }
      switch (op.kind) {
        case OpKind::kCompute:
          t = cpu(rank).use(t, op.cpu_us);
          break;
        case OpKind::kSend:
          t = cpu(rank).use(t, model_.message_cpu_us);
          deliver(rank, op.peer, op.bytes, t);
          break;
        case OpKind::kRecv: {
          auto& box = mail_[{op.peer, rank}];
          if ((box.empty() || box.front() > t) && yieldPoll(rank, t)) return;
          if (box.empty()) {
            waiting_for_[r] = op.peer;
            slept_[r] = true;
            clock_[r] = t;
            return;
          }
          const double arrived = box.front();
          if (arrived > t) {
            clock_[r] = t;
            slept_[r] = true;
            schedule(arrived, rank);
            return;
          }
          box.pop_front();
          wait_since_[r] = -1;
          // Its progress thread was woken to take the message in, whether or not the rank
          // itself slept.
          t = cpu(rank).use(t, model_.message_cpu_us + wake_us_);
          break;
        }
        case OpKind::kHostSync: {
          // ShmEngine's meeting: post this rank's flag, then look at every rank's of the host
          // in rank order, waiting on the first that has not posted (polling, then asleep)
          // until it does. With ranks crowding the cores that order decides how often a rank
          // polls, sleeps and is woken: what makes a one-host step grow faster than the ranks do.
          if (cursor_[r] < 0) {
            ++posts_[r];
            cursor_[r] = 0;
            wakeWaitersOn(rank, t);
          }
          const auto& members = layout_.hosts[static_cast<size_t>(hostOf(rank))];
          while (cursor_[r] < static_cast<int>(members.size())) {
            const int peer = members[static_cast<size_t>(cursor_[r])];
            if (posts_[static_cast<size_t>(peer)] < posts_[r]) {
              if (yieldPoll(rank, t)) return;
              watchers_[static_cast<size_t>(peer)].push_back(rank);
              slept_[r] = true;
              clock_[r] = t;
              return;
            }
            wait_since_[r] = -1;
            ++cursor_[r];
            if (peer != rank && model_.shm_peer_us > 0) {
              t = cpu(rank).use(t, model_.shm_peer_us);
              if (t > now && cursor_[r] < static_cast<int>(members.size())) {
                clock_[r] = t;
                schedule(t, rank);
                return;
              }
            }
          }
          cursor_[r] = -1;
          break;
        }
      }
      ++pc_[r];
    }
    clock_[r] = t;
  }

  // A wait that cannot end at `t`: polling that yields the core (what the wait policy does
  // with more ranks than cores) while the spin budget lasts; false once it is spent (sleep).
  bool yieldPoll(int rank, double t) {
    const auto r = static_cast<size_t>(rank);
    if (wait_since_[r] < 0) wait_since_[r] = t;
    if (model_.yield_us <= 0 || t - wait_since_[r] >= model_.spin_us) return false;
    clock_[r] = cpu(rank).use(t, model_.yield_us);
    schedule(clock_[r], rank);
    return true;
  }

  // `poster` posted at `t`: the ranks asleep on its flag wake a hand-off later.
  void wakeWaitersOn(int poster, double t) {
    auto& watchers = watchers_[static_cast<size_t>(poster)];
    for (int w : watchers) schedule(t + model_.shm.alpha_us, w);
    watchers.clear();
  }

  void deliver(int from, int to, double bytes, double sent) {
    ++messages_;
    const int a = hostOf(from);
    const int b = hostOf(to);
    double arrives;
    if (a == b) {
      arrives = sent + model_.loopback.alpha_us + bytes / (model_.loopback.beta_gbps * 1e3);
    } else {
      peers_[static_cast<size_t>(from)].insert(to);
      peers_[static_cast<size_t>(to)].insert(from);
      const double wire = bytes / (model_.network.beta_gbps * 1e3);
      const double left = tx_[static_cast<size_t>(a)].use(sent, wire);
      arrives = rx_[static_cast<size_t>(b)].use(left - wire + model_.network.alpha_us, wire);
    }
    mail_[{from, to}].push_back(arrives);
    if (waiting_for_[static_cast<size_t>(to)] == from) {
      waiting_for_[static_cast<size_t>(to)] = -1;
      schedule(arrives, to);
    }
  }

  const ClusterModel& model_;
  const collectives::HostLayout& layout_;
  const std::vector<Program>& programs_;
  std::vector<size_t> pc_;
  std::vector<double> clock_;
  std::vector<bool> slept_;
  std::vector<int> waiting_for_;
  std::vector<std::set<int>> peers_;
  std::vector<uint64_t> posts_;             // meetings each rank has posted
  std::vector<int> cursor_;                 // the host rank it looks at next; -1 outside one
  std::vector<double> wait_since_;          // when its present wait began; -1: not waiting
  std::vector<std::vector<int>> watchers_;  // asleep on each rank's flag
  std::vector<Pool> cpus_;
  std::vector<Pool> tx_;
  std::vector<Pool> rx_;
  std::map<std::pair<int, int>, std::deque<double>> mail_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  uint64_t order_ = 0;
  size_t messages_ = 0;
  double wake_us_ = 0;
};

}  // namespace

SimResult simulate(const ClusterModel& model, const collectives::HostLayout& layout,
                   const std::vector<Program>& programs) {
  if (programs.size() != static_cast<size_t>(layout.worldSize())) {
    throw InvalidArgument("simulator: " + std::to_string(programs.size()) + " programs for " +
                          std::to_string(layout.worldSize()) + " ranks");
  }
  return Engine(model, layout, programs).run();
}

}  // namespace railshard::sim
