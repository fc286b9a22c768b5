// The backend's life and its queue: forming the communicator (or taking one over), the worker
// that runs collectives in call order, the completer of point-to-point transfers, shutdown and
// release. The collectives themselves are in process_group.cc.
#include "python/csrc/process_group.h"

#include <Python.h>

#include <cstdlib>
#include <set>
#include <utility>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "base/error.h"
#include "launcher/cgroup.h"
#include "launcher/init.h"
#include "launcher/interfaces.h"
#include "python/csrc/c10d_store.h"
#include "python/csrc/shared_allocator.h"
#include "transport/links/tcp/socket.h"

namespace railshard::python {
namespace {

std::string prefixed(const char* kind, const std::exception& e) {
  const std::string message = e.what();
  if (message.rfind("railshard ", 0) == 0) return message;
  return std::string("railshard ") + kind + ": " + message;
}

// The host of the TCPStore under torch's PrefixStores (tcp://, env:// and torchrun all
// rendezvous through one), or "" for other stores (FileStore, HashStore).
std::string rendezvousHost(c10::intrusive_ptr<c10d::Store> store) {
  while (store) {
    if (auto* prefix = dynamic_cast<c10d::PrefixStore*>(store.get())) {
      store = prefix->getUnderlyingStore();
    } else if (auto* tcp = dynamic_cast<c10d::TCPStore*>(store.get())) {
      return tcp->getHost();
    } else {
      break;
    }
  }
  return "";
}

// The address peers reach this rank at, by the same rules as railshard::init(): the
// RAILSHARD_SOCKET_IFNAME interface, else the one that routes to the rendezvous host (the
// TCPStore's, MASTER_ADDR, railshard-launch's store), else the first non-loopback address.
std::string advertiseHost(const Config& config, const c10::intrusive_ptr<c10d::Store>& store) {
  std::string host = config.socket_ifname.empty() ? rendezvousHost(store) : std::string();
  if (host.empty() && config.socket_ifname.empty()) {
    if (const char* master = std::getenv("MASTER_ADDR"); master != nullptr && *master) {
      host = master;
    } else if (const char* addr = std::getenv("RAILSHARD_STORE_ADDR"); addr != nullptr && *addr) {
      host = transport::links::tcp::splitHostPort(addr, "RAILSHARD_STORE_ADDR").first;
    }
  }
  return launcher::advertiseAddress(config.socket_ifname, host);
}
// Every live group, for shutdownAll().
std::mutex& registryMutex() {
  static auto* mutex = new std::mutex;  // never destroyed: used from static destructors
  return *mutex;
}
std::set<ProcessGroupRailshard*>& registry() {
  static auto* groups = new std::set<ProcessGroupRailshard*>;
  return *groups;
}

}  // namespace

[[noreturn]] void rethrowWithKind(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError& e) {
    throw TimeoutError(prefixed("TimeoutError", e));
  } catch (const PeerLostError& e) {
    throw PeerLostError(prefixed("PeerLostError", e));
  } catch (const MismatchError& e) {
    throw MismatchError(prefixed("MismatchError", e));
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(prefixed("InvalidArgument", e));
  } catch (const ConfigError& e) {
    throw ConfigError(prefixed("ConfigError", e));
  } catch (const ProtocolError& e) {
    throw ProtocolError(prefixed("ProtocolError", e));
  } catch (const Error& e) {
    throw Error(prefixed("Error", e));
  }
}

ProcessGroupRailshard::ProcessGroupRailshard(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                             int size, std::chrono::milliseconds timeout)
    : BackendBase(rank, size) {
  guardedCall([&] {
    Config config = Config::fromEnvironment();
    launcher::cgroup::fitWaitsToQuota(config, std::getenv("RAILSHARD_SPIN_US") != nullptr);
    // torch's timeout= is the user's per-collective bound unless RAILSHARD_TIMEOUT says
    // otherwise (it is the more specific knob).
    if (std::getenv("RAILSHARD_TIMEOUT") == nullptr && timeout.count() > 0) {
      config.timeout = timeout;
    }
    timeout_ = std::chrono::duration_cast<Communicator::Timeout>(config.timeout);
    auto railshard_store = std::make_shared<C10dStore>(store);

    store_ = railshard_store;
    communicator_ = launcher::formCommunicator(railshard_store, rank, size, config,
                                               size > 1 ? advertiseHost(config, store) : "");
  });
  start();
}

ProcessGroupRailshard::ProcessGroupRailshard(std::unique_ptr<Communicator> communicator,
                                             std::shared_ptr<Store> store,
                                             Communicator::Timeout timeout)
    : BackendBase(communicator->rank(), communicator->size()),
      communicator_(std::move(communicator)),
      store_(std::move(store)),
      timeout_(timeout) {
  start();
}

void ProcessGroupRailshard::start() {
  // Several ranks on this host, every collective through its shared memory: from now on large
  // CPU tensors (DDP's buckets among them, allocated after the group forms) come from regions
  // the peers map, so the one-host all-reduce reads them in place (shared_allocator.h).
  const size_t shared_alloc = communicator_->config().shm.shared_alloc_bytes;
  if (shared_alloc > 0 && communicator_->size() > 1 && communicator_->usesSharedMemory()) {
    installSharedAllocator(shared_alloc);
  }
  worker_ = std::thread([this] { workerLoop(); });
  completer_ = std::thread([this] { completerLoop(); });
  std::lock_guard lock(registryMutex());
  registry().insert(this);
}

ProcessGroupRailshard::~ProcessGroupRailshard() {
  {
    std::lock_guard lock(registryMutex());
    registry().erase(this);
  }
  shutdown();
}

void ProcessGroupRailshard::shutdown() {
  if (stopThreads()) communicator_.reset();
}

std::unique_ptr<Communicator> ProcessGroupRailshard::release() {
  if (!stopThreads()) return nullptr;
  return std::move(communicator_);
}

void ProcessGroupRailshard::runOnWorker(std::function<void(Communicator&)> job) {
  auto work = enqueue(c10d::OpType::UNKNOWN, {}, timeout_, std::move(job));
  // The job's own collectives are bounded by their deadlines; so is what is queued before it.
  work->wait(std::chrono::milliseconds(0));
}

bool ProcessGroupRailshard::stopThreads() {
  {
    std::lock_guard lock(mutex_);
    if (shut_down_) return false;
    shut_down_ = true;
    stopping_ = true;
  }
  queue_cv_.notify_all();
  // Queued collectives still run (each is bounded by its deadline), as with gloo: a Work a
  // caller holds must complete one way or the other. The caller may hold the GIL (torch 1.13
  // destroys the group from destroy_process_group with it held) while the worker needs it to
  // free the last reference to a tensor that owns a Python object: let it go while joining.
  PyThreadState* released =
      (Py_IsInitialized() != 0 && PyGILState_Check() != 0) ? PyEval_SaveThread() : nullptr;
  if (worker_.joinable()) worker_.join();
  // Then the posted point-to-point transfers: each is bounded by its deadline.
  {
    std::lock_guard lock(mutex_);
    completer_stopping_ = true;
  }
  in_flight_cv_.notify_all();
  if (completer_.joinable()) completer_.join();
  if (released != nullptr) PyEval_RestoreThread(released);
  return true;
}

void ProcessGroupRailshard::shutdownAll() {
  std::lock_guard lock(registryMutex());
  for (ProcessGroupRailshard* group : registry()) group->shutdown();
}

namespace {

// The error a Work fails with: railshard errors with their kind in front; a timeout also says
// "Timed out waiting <deadline>ms", as torch's backends word it.
std::exception_ptr currentWithKind(Communicator::Timeout timeout) {
  try {
    throw;
  } catch (const TimeoutError& e) {
    const std::string text = e.what();
    const std::string kind = "railshard TimeoutError: ";
    const std::string rest = text.rfind(kind, 0) == 0 ? text.substr(kind.size()) : text;
    return std::make_exception_ptr(TimeoutError(
        kind + "Timed out waiting " +
        std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count()) +
        "ms: " + rest));
  } catch (const Error&) {
    try {
      rethrowWithKind(std::current_exception());
    } catch (...) {
      return std::current_exception();
    }
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace

void ProcessGroupRailshard::runJob(Queued& item) {
  std::exception_ptr error;
  try {
    item.job(*communicator_);
  } catch (...) {
    error = currentWithKind(item.timeout);
  }
  if (error) {
    item.work->fail(error);
  } else if (!item.completes_later) {
    item.work->complete();
  }
}

void ProcessGroupRailshard::workerLoop() {
  for (;;) {
    Queued item;
    {
      std::unique_lock lock(mutex_);
      queue_cv_.wait(lock, [&] {
        return (stopping_ && queue_.empty() && !running_) || (!queue_.empty() && !running_);
      });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    runJob(item);
    {
      std::lock_guard lock(mutex_);
      running_ = false;
    }
  }
}

namespace {
constexpr auto kCompleterPoll = std::chrono::milliseconds(5);
}  // namespace

void ProcessGroupRailshard::completerLoop() {
  for (;;) {
    InFlight item;
    {
      std::unique_lock lock(mutex_);
      // Posts do not wake this thread (a wake-up per message would put a third runnable
      // thread beside the two of a ping-pong on a 2-core host): it looks every few
      // milliseconds, which is how late a transfer nobody waits for completes at worst.
      while (!completer_stopping_ && in_flight_.empty()) {
        in_flight_cv_.wait_for(lock, kCompleterPoll);
      }
      if (in_flight_.empty()) return;
      item = std::move(in_flight_.front());
      in_flight_.pop_front();
    }
    // Usually the caller waits on the Work right away (dist.send/recv do) and completes it on
    // its own thread: give it a moment before polling the transfer here too, which would only
    // compete with it for the cores.
    if (!item.claimed->load()) item.work->waitDone(std::chrono::microseconds(500));
    if (item.claimed->load()) continue;  // a caller in Work.wait() completes it
    try {
      communicator_->wait(item.request, item.timeout);
      if (!item.claimed->exchange(true)) {
        item.finish();
        item.work->complete();
      }
    } catch (...) {
      if (!item.claimed->exchange(true)) item.work->fail(currentWithKind(item.timeout));
    }
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRailshard::enqueuePointToPoint(
    c10d::OpType type, std::vector<at::Tensor> outputs, Post post, std::function<void()> finish,
    Communicator::Timeout timeout) {
  auto work = c10::make_intrusive<Work>(getRank(), type, std::move(outputs));
  Job job = [this, work, post = std::move(post), finish = std::move(finish),
             timeout](Communicator& c) {
    Communicator::P2PRequest request = post(c, *work);
    auto claimed = std::make_shared<std::atomic<bool>>(false);
    // A caller waiting on the Work waits for the transfer on its own thread. The raw pointer:
    // the Work owns this function (no reference cycle), and runs it only from its own wait().
    Work* raw = work.get();
    work->setDriver([this, raw, request, finish, timeout, claimed] {
      if (claimed->exchange(true)) return;
      try {
        communicator_->wait(request, timeout);
        finish();
        raw->complete();
      } catch (...) {
        raw->fail(currentWithKind(timeout));
      }
    });
    std::lock_guard lock(mutex_);
    in_flight_.push_back(InFlight{work, std::move(request), finish, timeout, claimed});
  };
  Queued item{work, std::move(job), timeout, /*completes_later=*/true};
  bool here = false;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      throw InvalidArgument(std::string("railshard ") + c10d::opTypeToString(type) +
                            ": the process group was shut down (destroy_process_group or "
                            "interpreter exit)");
    }
    // Not a receive from any source: it waits for a message to arrive before it posts, which
    // must not hold up the caller (it holds up only the group's later calls, on the worker).
    here = queue_.empty() && !running_ && type != c10d::OpType::RECVANYSOURCE;
    if (here) {
      running_ = true;  // the worker waits until this post is done
    } else {
      queue_.push_back(std::move(item));
    }
  }
  bool queued = !here;
  if (here) {
    runJob(item);
    std::lock_guard lock(mutex_);
    running_ = false;
    queued = !queue_.empty();  // jobs that came in meanwhile wait for the worker
  }
  if (queued) queue_cv_.notify_one();
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRailshard::enqueue(c10d::OpType type,
                                                              std::vector<at::Tensor> outputs,
                                                              Communicator::Timeout timeout,
                                                              Job job) {
  auto work = c10::make_intrusive<Work>(getRank(), type, std::move(outputs));
  {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      throw InvalidArgument(std::string("railshard ") + c10d::opTypeToString(type) +
                            ": the process group was shut down (destroy_process_group or "
                            "interpreter exit)");
    }
    queue_.push_back(Queued{work, std::move(job), timeout});
    collectives_called_.fetch_add(1);
  }
  queue_cv_.notify_one();
  return work;
}

}  // namespace railshard::python
