#include "python/csrc/process_group.h"

#include <Python.h>

#include <cstdlib>
#include <set>
#include <utility>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "base/error.h"
#include "launcher/init.h"
#include "launcher/interfaces.h"
#include "python/csrc/c10d_store.h"
#include "python/csrc/tensor_staging.h"
#include "transport/tcp/socket.h"

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
      host = transport::tcp::splitHostPort(addr, "RAILSHARD_STORE_ADDR").first;
    }
  }
  return launcher::advertiseAddress(config.socket_ifname, host);
}

// Same dtype and element count as `reference`, else InvalidArgument naming both.
void checkLike(const at::Tensor& tensor, const at::Tensor& reference, int64_t numel,
               const char* collective, const char* what) {
  if (tensor.scalar_type() != reference.scalar_type() || tensor.numel() != numel) {
    throw InvalidArgument(std::string("railshard ") + collective + ": " + what + " is " +
                          describe(tensor) + ", expected " + std::to_string(numel) +
                          " elements of " + c10::toString(reference.scalar_type()));
  }
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

Communicator::Timeout ProcessGroupRailshard::deadline(std::chrono::milliseconds option) const {
  return option.count() > 0 ? std::chrono::duration_cast<Communicator::Timeout>(option) : timeout_;
}

int ProcessGroupRailshard::checkRoot(int64_t root, const char* collective) const {
  if (root < 0 || root >= getSize()) {
    throw InvalidArgument(std::string("railshard ") + collective + ": root rank " +
                          std::to_string(root) + " is not in the group of " +
                          std::to_string(getSize()));
  }
  return static_cast<int>(root);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRailshard::broadcast(
    std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  return guardedCall([&] {
    checkOne(tensors, "broadcast");
    const int root = checkRoot(opts.rootRank, "broadcast");
    auto buffer = std::make_shared<Staged>(tensors[0], "broadcast", getRank() == root);
    const auto timeout = deadline(opts.timeout);
    return enqueue(c10d::OpType::BROADCAST, tensors, timeout,
                   [buffer, root, timeout](Communicator& c) {
                     buffer->ready(timeout);
                     c.broadcast(buffer->data(), buffer->data(), buffer->count(), buffer->dtype(),
                                 root, buffer->placement(), timeout);
                     buffer->finish(&c, timeout);
                   });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRailshard::allreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  return guardedCall([&] {
    checkOne(tensors, "allreduce");
    if (tensors[0].is_sparse()) return allreduceSparse(tensors[0], opts);
    const ReduceOp op = reduceOpFor(opts.reduceOp, tensors[0].scalar_type(), "allreduce");
    auto buffer = std::make_shared<Staged>(tensors[0], "allreduce");
    const auto timeout = deadline(opts.timeout);
    return enqueue(c10d::OpType::ALLREDUCE, tensors, timeout,
                   [buffer, op, timeout](Communicator& c) {
                     buffer->ready(timeout);
                     c.allreduce(buffer->data(), buffer->data(), buffer->count(), buffer->dtype(),
                                 op, buffer->placement(), timeout);
                     buffer->finish(&c, timeout);
                   });
  });
}

// One all-reduce over the tensors laid end to end: DDP-style buckets in one collective.
c10::intrusive_ptr<c10d::Work> ProcessGroupRailshard::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return guardedCall([&] {
    if (tensors.empty()) throw InvalidArgument("railshard allreduce_coalesced: no tensors");
    for (const auto& t : tensors) {
      if (t.scalar_type() != tensors.front().scalar_type()) {
        throw InvalidArgument("railshard allreduce_coalesced: tensors must share one dtype, got " +
                              describe(tensors.front()) + " and " + describe(t));
      }
    }
    const ReduceOp op = reduceOpFor(opts.reduceOp, tensors[0].scalar_type(), "allreduce_coalesced");
    auto flat = std::make_shared<at::Tensor>(flattenTensors(tensors, "allreduce_coalesced"));
    const DataType dtype = *nativeType(flat->scalar_type());
    const auto timeout = deadline(opts.timeout);
    return enqueue(c10d::OpType::ALLREDUCE_COALESCED, tensors, timeout,
                   [flat, tensors, dtype, op, timeout](Communicator& c) mutable {
                     c.allreduce(flat->data_ptr(), static_cast<size_t>(flat->numel()), dtype, op,
                                 timeout);
                     unflattenTensors(*flat, tensors);
                   });
  });
}

// An all-reduce whose result only the root keeps (non-roots' tensors are left unchanged).
c10::intrusive_ptr<c10d::Work> ProcessGroupRailshard::reduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::ReduceOptions& opts) {
  return guardedCall([&] {
    // Complex tensors as their real views (torch does this itself in Python for most
    // collectives, not for reduce, gather and reduce_scatter).
    if (std::vector<at::Tensor> real; realViews(tensors, real, opts.reduceOp, "reduce")) {
      return reduce(real, opts);
    }
    checkOne(tensors, "reduce");
    const int root = checkRoot(opts.rootRank, "reduce");
    const ReduceOp op = reduceOpFor(opts.reduceOp, tensors[0].scalar_type(), "reduce");
    const at::ScalarType wire = wireType(tensors[0].scalar_type(), "reduce");
    auto scratch = std::make_shared<at::Tensor>(
        tensors[0].to(at::kCPU, wire, /*non_blocking=*/false, /*copy=*/true).contiguous());
    const bool is_root = getRank() == root;
    const auto timeout = deadline(opts.timeout);
    at::Tensor target = tensors[0];
    return enqueue(c10d::OpType::REDUCE, tensors, timeout,
                   [scratch, target, is_root, op, timeout](Communicator& c) mutable {
                     c.allreduce(scratch->data_ptr(), static_cast<size_t>(scratch->numel()),
                                 *nativeType(scratch->scalar_type()), op, timeout);
                     if (is_root) target.copy_(*scratch);
                   });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRailshard::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return guardedCall([&] {
    checkOne(inputs, "allgather");
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != getSize()) {
      throw InvalidArgument("railshard allgather: needs one list of " + std::to_string(getSize()) +
                            " output tensors");
    }
    const at::Tensor& input = inputs[0];
    for (const auto& out : outputs[0])
      checkLike(out, input, input.numel(), "allgather", "an output");
    auto send = std::make_shared<Staged>(input, "allgather", true, /*device_ok=*/false);
    const at::ScalarType wire = wireType(input.scalar_type(), "allgather");
    auto recv = std::make_shared<at::Tensor>(
        at::empty({getSize() * input.numel()}, at::TensorOptions().dtype(wire)));
    std::vector<at::Tensor> targets = outputs[0];
    const auto timeout = deadline(opts.timeout);
    return enqueue(c10d::OpType::ALLGATHER, targets, timeout,
                   [send, recv, targets, timeout](Communicator& c) mutable {
                     c.allgather(send->data(), recv->data_ptr(), send->count(), send->dtype(),
                                 timeout);
                     unflattenTensors(*recv, targets);
                   });
  });
}

// One all-gather of every input end to end; rank r's part is cut back into output_lists[r].
c10::intrusive_ptr<c10d::Work> ProcessGroupRailshard::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return guardedCall([&] {
    if (inputs.empty()) throw InvalidArgument("railshard allgather_coalesced: no input tensors");
    if (static_cast<int>(output_lists.size()) != getSize()) {
      throw InvalidArgument("railshard allgather_coalesced: needs one output list per rank (" +
                            std::to_string(getSize()) + "), got " +
                            std::to_string(output_lists.size()));
    }
    int64_t total = 0;
    for (const auto& input : inputs) {
      checkLike(input, inputs.front(), input.numel(), "allgather_coalesced", "an input");
      total += input.numel();
    }
    for (auto& list : output_lists) {
      if (list.size() != inputs.size()) {
        throw InvalidArgument("railshard allgather_coalesced: an output list has " +
                              std::to_string(list.size()) + " tensors, the inputs " +
                              std::to_string(inputs.size()));
      }
      for (size_t i = 0; i < list.size(); ++i) {
        checkLike(list[i], inputs[i], inputs[i].numel(), "allgather_coalesced", "an output");
      }
    }
    auto send = std::make_shared<at::Tensor>(flattenTensors(inputs, "allgather_coalesced"));
    auto recv = std::make_shared<at::Tensor>(at::empty({getSize() * total}, send->options()));
    const DataType dtype = *nativeType(send->scalar_type());
    const auto timeout = deadline(opts.timeout);
    std::vector<at::Tensor> flat_outputs;
    for (const auto& list : output_lists)
      flat_outputs.insert(flat_outputs.end(), list.begin(), list.end());
    auto lists = output_lists;
    return enqueue(c10d::OpType::ALLGATHER_COALESCED, flat_outputs, timeout,
                   [send, recv, lists, total, dtype, timeout](Communicator& c) mutable {
                     c.allgather(send->data_ptr(), recv->data_ptr(), static_cast<size_t>(total),
                                 dtype, timeout);
                     for (size_t r = 0; r < lists.size(); ++r) {
                       unflattenTensors(recv->narrow(0, static_cast<int64_t>(r) * total, total),
                                        lists[r]);
                     }
                   });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRailshard::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return guardedCall([&] {
    checkLike(output, input, getSize() * input.numel(), "allgather_into_tensor", "the output");
    auto send = std::make_shared<Staged>(input, "allgather_into_tensor", true, /*device_ok=*/false);
    auto recv = std::make_shared<Staged>(output, "allgather_into_tensor", /*copy_in=*/false,
                                         /*device_ok=*/false);
    const auto timeout = deadline(opts.timeout);
    return enqueue(c10d::OpType::_ALLGATHER_BASE, {output}, timeout,
                   [send, recv, timeout](Communicator& c) {
                     c.allgather(send->data(), recv->data(), send->count(), send->dtype(), timeout);
                     recv->finish();
                   });
  });
}

// All-gather into a scratch buffer; the root copies the blocks out.
c10::intrusive_ptr<c10d::Work> ProcessGroupRailshard::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  return guardedCall([&] {
    if (std::vector<at::Tensor> real; realViews(inputs, real, std::nullopt, "gather")) {
      std::vector<std::vector<at::Tensor>> real_outputs(outputs.size());
      for (size_t i = 0; i < outputs.size(); ++i) {
        realViews(outputs[i], real_outputs[i], std::nullopt, "gather");
      }
      return gather(real_outputs, real, opts);
    }
    checkOne(inputs, "gather");
    const int root = checkRoot(opts.rootRank, "gather");
    const bool is_root = getRank() == root;
    const at::Tensor& input = inputs[0];
    std::vector<at::Tensor> targets;
    if (is_root) {
      if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != getSize()) {
        throw InvalidArgument("railshard gather: the root needs one list of " +
                              std::to_string(getSize()) + " output tensors");
      }
      for (const auto& out : outputs[0])
        checkLike(out, input, input.numel(), "gather", "an output");
      targets = outputs[0];
    }
    auto send = std::make_shared<Staged>(input, "gather", true, /*device_ok=*/false);
    const at::ScalarType wire = wireType(input.scalar_type(), "gather");
    auto recv = std::make_shared<at::Tensor>(
        at::empty({getSize() * input.numel()}, at::TensorOptions().dtype(wire)));
    const auto timeout = deadline(opts.timeout);
    return enqueue(c10d::OpType::GATHER, targets, timeout,
                   [send, recv, targets, timeout](Communicator& c) mutable {
                     c.allgather(send->data(), recv->data_ptr(), send->count(), send->dtype(),
                                 timeout);
                     if (!targets.empty()) unflattenTensors(*recv, targets);
                   });
  });
}

// The root broadcasts all blocks; each rank keeps its own. Moves size x the bytes a tree
// scatter would, which is fine for what scatter is used for (setup, not the training loop).
c10::intrusive_ptr<c10d::Work> ProcessGroupRailshard::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  return guardedCall([&] {
    checkOne(outputs, "scatter");
    const int root = checkRoot(opts.rootRank, "scatter");
    const at::Tensor& output = outputs[0];
    const at::ScalarType wire = wireType(output.scalar_type(), "scatter");
    std::shared_ptr<at::Tensor> all;
    if (getRank() == root) {
      if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != getSize()) {
        throw InvalidArgument("railshard scatter: the root needs one list of " +
                              std::to_string(getSize()) + " input tensors");
      }
      for (const auto& in : inputs[0]) checkLike(in, output, output.numel(), "scatter", "an input");
      all = std::make_shared<at::Tensor>(flattenTensors(inputs[0], "scatter"));
    } else {
      all = std::make_shared<at::Tensor>(
          at::empty({getSize() * output.numel()}, at::TensorOptions().dtype(wire)));
    }
    const int rank = getRank();
    const auto timeout = deadline(opts.timeout);
    at::Tensor target = output;
    return enqueue(
        c10d::OpType::SCATTER, outputs, timeout,
        [all, target, root, rank, timeout](Communicator& c) mutable {
          c.broadcast(all->data_ptr(), static_cast<size_t>(all->numel()),
                      *nativeType(all->scalar_type()), root, timeout);
          target.copy_(all->narrow(0, rank * target.numel(), target.numel()).view(target.sizes()));
        });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRailshard::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return guardedCall([&] {
    if (std::vector<at::Tensor> real; realViews(outputs, real, opts.reduceOp, "reduce_scatter")) {
      std::vector<std::vector<at::Tensor>> real_inputs(inputs.size());
      for (size_t i = 0; i < inputs.size(); ++i) {
        realViews(inputs[i], real_inputs[i], opts.reduceOp, "reduce_scatter");
      }
      return reduce_scatter(real, real_inputs, opts);
    }
    checkOne(outputs, "reduce_scatter");
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != getSize()) {
      throw InvalidArgument("railshard reduce_scatter: needs one list of " +
                            std::to_string(getSize()) + " input tensors");
    }
    const at::Tensor& output = outputs[0];
    for (const auto& in : inputs[0]) {
      checkLike(in, output, output.numel(), "reduce_scatter", "an input");
    }
    const ReduceOp op = reduceOpFor(opts.reduceOp, output.scalar_type(), "reduce_scatter");
    auto send = std::make_shared<at::Tensor>(flattenTensors(inputs[0], "reduce_scatter"));
    auto recv = std::make_shared<Staged>(output, "reduce_scatter", /*copy_in=*/false,
                                         /*device_ok=*/false);
    const auto timeout = deadline(opts.timeout);
    return enqueue(c10d::OpType::REDUCE_SCATTER, outputs, timeout,
                   [send, recv, op, timeout](Communicator& c) {
                     c.reduceScatter(send->data_ptr(), recv->data(), recv->count(), recv->dtype(),
                                     op, timeout);
                     recv->finish();
                   });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRailshard::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  return guardedCall([&] {
    if (output.is_complex() || input.is_complex()) {
      std::vector<at::Tensor> real;
      realViews({output, input}, real, opts.reduceOp, "reduce_scatter_tensor");
      return _reduce_scatter_base(real[0], real[1], opts);
    }
    checkLike(input, output, getSize() * output.numel(), "reduce_scatter_tensor", "the input");
    const ReduceOp op = reduceOpFor(opts.reduceOp, output.scalar_type(), "reduce_scatter_tensor");
    auto send = std::make_shared<Staged>(input, "reduce_scatter_tensor", true, /*device_ok=*/false);
    auto recv = std::make_shared<Staged>(output, "reduce_scatter_tensor", /*copy_in=*/false,
                                         /*device_ok=*/false);
    const auto timeout = deadline(opts.timeout);
    return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, timeout,
                   [send, recv, op, timeout](Communicator& c) {
                     c.reduceScatter(send->data(), recv->data(), recv->count(), recv->dtype(), op,
                                     timeout);
                     recv->finish();
                   });
  });
}

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
namespace {

void checkPairs(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                const char* collective) {
  if (outputs.size() != inputs.size()) {
    throw InvalidArgument(std::string("railshard ") + collective + ": " +
                          std::to_string(outputs.size()) + " outputs for " +
                          std::to_string(inputs.size()) + " inputs");
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupRailshard::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return guardedCall([&] {
    const char* name = "allgather_into_tensor_coalesced";
    checkPairs(outputs, inputs, name);
    std::vector<std::pair<std::shared_ptr<Staged>, std::shared_ptr<Staged>>> pairs;
    for (size_t i = 0; i < inputs.size(); ++i) {
      checkLike(outputs[i], inputs[i], getSize() * inputs[i].numel(), name, "an output");
      pairs.emplace_back(std::make_shared<Staged>(inputs[i], name, true, /*device_ok=*/false),
                         std::make_shared<Staged>(outputs[i], name, /*copy_in=*/false,
                                                  /*device_ok=*/false));
    }
    const auto timeout = deadline(opts.timeout);
    return enqueue(c10d::OpType::ALLGATHER_INTO_TENSOR_COALESCED, outputs, timeout,
                   [pairs, timeout](Communicator& c) {
                     for (const auto& [send, recv] : pairs) {
                       c.allgather(send->data(), recv->data(), send->count(), send->dtype(),
                                   timeout);
                       recv->finish();
                     }
                   });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRailshard::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return guardedCall([&] {
    const char* name = "reduce_scatter_tensor_coalesced";
    checkPairs(outputs, inputs, name);
    struct Pair {
      std::shared_ptr<Staged> send, recv;
      ReduceOp op;
    };
    std::vector<Pair> pairs;
    for (size_t i = 0; i < inputs.size(); ++i) {
      checkLike(inputs[i], outputs[i], getSize() * outputs[i].numel(), name, "an input");
      pairs.push_back(
          Pair{std::make_shared<Staged>(inputs[i], name, true, /*device_ok=*/false),
               std::make_shared<Staged>(outputs[i], name, /*copy_in=*/false, /*device_ok=*/false),
               reduceOpFor(opts.reduceOp, outputs[i].scalar_type(), name)});
    }
    const auto timeout = deadline(opts.timeout);
    return enqueue(c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, outputs, timeout,
                   [pairs, timeout](Communicator& c) {
                     for (const auto& p : pairs) {
                       c.reduceScatter(p.send->data(), p.recv->data(), p.recv->count(),
                                       p.recv->dtype(), p.op, timeout);
                       p.recv->finish();
                     }
                   });
  });
}
#endif

c10::intrusive_ptr<c10d::Work> ProcessGroupRailshard::barrier(const c10d::BarrierOptions& opts) {
  return guardedCall([&] {
    const auto timeout = deadline(opts.timeout);
    return enqueue(c10d::OpType::BARRIER, {}, timeout,
                   [timeout](Communicator& c) { c.barrier(timeout); });
  });
}

}  // namespace railshard::python
