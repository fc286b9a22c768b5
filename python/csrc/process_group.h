#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <atomic>

#include <ATen/ATen.h>

#include "base/error.h"
#include "core/communicator.h"
#include "python/csrc/torch_compat.h"
#include "python/csrc/work.h"

namespace railshard::python {

// For the Python module: the same errors, with "railshard <Kind>: " in front of the message.
[[noreturn]] void rethrowWithKind(std::exception_ptr error);

// The torch.distributed backend "railshard": a c10d ProcessGroup (torch 1.13) or Backend
// (torch 2.x) over one railshard Communicator.
//
// Collectives are asynchronous: each call stages its tensors (device or odd-dtype tensors
// through host buffers), queues the collective and returns a Work at once; one worker thread
// runs the queue in call order, which is the order every rank must call in anyway (the
// Communicator is one-thread-at-a-time, and its headers catch ranks that disagree). Errors
// (timeouts, lost peers, mismatches) complete the Work with the railshard exception, whose
// message starts with its kind ("railshard PeerLostError: ...") so it stays readable after
// DDP or autograd rewrap it. After one error the communicator is poisoned: every later
// collective fails with the same kind of error, as on the C++ side.
class ProcessGroupRailshard : public BackendBase {
 public:
  // Forms the communicator through `store` (the c10d store torch rendezvoused with); blocks
  // until every rank arrived. `timeout` bounds each collective unless RAILSHARD_TIMEOUT is
  // set in the environment.
  ProcessGroupRailshard(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                        std::chrono::milliseconds timeout);
  // Over a communicator that exists already (ElasticGroup's: init()'s, or one shrink() or
  // grow() returned). `store` serves monitoredBarrier; null: it raises InvalidArgument.
  ProcessGroupRailshard(std::unique_ptr<Communicator> communicator, std::shared_ptr<Store> store,
                        Communicator::Timeout timeout);
  ~ProcessGroupRailshard() override;

  // Runs `job` on the worker, after everything queued before it, and waits for it: how code
  // outside torch's collectives (ElasticGroup's dispatcher, joinersWaiting()) uses the
  // communicator without a second thread on it. The job's error is rethrown with its kind.
  void runOnWorker(std::function<void(Communicator&)> job);
  // shutdown(), except that the communicator is handed back instead of closed (ElasticGroup
  // re-forms it with shrink() or grow()). Null when it was shut down already.
  std::unique_ptr<Communicator> release();
  Communicator::Timeout timeout() const { return timeout_; }

  const std::string getBackendName() const override { return "railshard"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
  // all_gather_into_tensor / reduce_scatter_tensor of each (output, input) pair in turn, as
  // one Work. torch's functional collectives (_c10d_functional: DTensor's redistribute and
  // full_tensor(), FSDP2 state dicts) reach the backend only through these, even for one
  // tensor; without them they fail with "Backend railshard does not support
  // all_gather_single_coalesced" (reduce_scatter_single_coalesced).
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
#endif
  // One all-gather of the inputs laid end to end, cut back into each rank's list.
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;

  // Point-to-point (process_group_p2p.cc): the worker posts each send or receive in call
  // order, between the collectives, without waiting; a second thread waits for the transfer
  // and completes the Work, so a receive never holds up the queue behind it (batch_isend_irecv
  // posts both directions before it waits on either).
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank,
                                      int tag) override;
  // Waits on the worker until some rank's next message to this one carries `tag`, so later
  // calls of this group wait behind it; the Work's source rank names that rank.
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  // all_to_all_single (even or uneven splits) and all_to_all over lists of tensors.
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;

  // Rank 0 waits (at most the timeout) until every rank has arrived, then releases them; it
  // names the first rank that did not arrive ("Rank 1 failed to pass monitoredBarrier in 100
  // ms"), or every such rank with wait_all_ranks, and tells the ranks that did arrive, which
  // then raise with that text ("Rank 2 successfully reached monitoredBarrier, but received
  // errors while waiting for send/recv from rank 0: rank 0 reports: Rank 1 failed ...").
  // Through the store, not the communicator, so a failure leaves the group usable, as with
  // gloo. Wording as torch's gloo backend has it.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;

  // Collectives called on this group so far (point-to-point excluded: only two ranks take
  // part), the same on every rank in step; numbering starts at 0 on every rank, so there is
  // nothing to agree on at creation.
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override {
    return collectives_called_.load();
  }

  // Runs what is queued, stops the worker and closes the communicator; later collectives
  // raise InvalidArgument. Idempotent. torch 2.x calls it from destroy_process_group().
#if TORCH_VERSION_MAJOR >= 2
  void shutdown() override;
#else
  void shutdown();
#endif

  // shutdown() of every live group of this process: the package calls it at interpreter
  // exit, because objects that still hold a group (a DDP model, torch's own registry) may
  // outlive Python's finalization, and a communicator whose threads run on into C++ static
  // destruction crashes the exiting process.
  static void shutdownAll();

 private:
  using Job = std::function<void(Communicator&)>;
  // `timeout` is the job's deadline, named in its TimeoutError the way torch's own backends
  // word it ("Timed out waiting 1000ms"), which torch's tests and handlers look for.
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, std::vector<at::Tensor> outputs,
                                         Communicator::Timeout timeout, Job job);
  void workerLoop();
  // Starts the worker and completer and registers the group (both constructors).
  void start();
  // Stops the worker and completer after what is queued (shutdown() and release()); false
  // when that happened already.
  bool stopThreads();
  // all_reduce (SUM) of a sparse COO tensor on the CPU (process_group_sparse.cc).
  c10::intrusive_ptr<c10d::Work> allreduceSparse(at::Tensor& tensor,
                                                 const c10d::AllreduceOptions& opts);
  // Posts on the calling thread when the worker is idle with nothing queued (else through the
  // worker, in order with the collectives); the completer waits (bounded by `timeout`), runs
  // `finish` (copy the received data out) and completes the Work -- unless a thread in
  // Work.wait() claimed it first and did that itself (one thread hand-off less each way:
  // latency of small messages).
  using Post = std::function<Communicator::P2PRequest(Communicator&, Work&)>;
  c10::intrusive_ptr<c10d::Work> enqueuePointToPoint(c10d::OpType type,
                                                     std::vector<at::Tensor> outputs, Post post,
                                                     std::function<void()> finish,
                                                     Communicator::Timeout timeout);
  void completerLoop();
  // The per-call deadline: the option's when set, else the group's.
  Communicator::Timeout deadline(std::chrono::milliseconds option) const;
  int checkRoot(int64_t root, const char* collective) const;

  std::unique_ptr<Communicator> communicator_;
  std::shared_ptr<Store> store_;  // the c10d store torch rendezvoused with
  uint64_t monitored_barriers_ = 0;
  Communicator::Timeout timeout_;

  std::mutex mutex_;
  std::condition_variable queue_cv_;
  struct Queued {
    c10::intrusive_ptr<Work> work;
    Job job;
    Communicator::Timeout timeout;
    bool completes_later = false;  // point-to-point: the completer completes the Work
  };
  std::deque<Queued> queue_;
  bool running_ = false;  // a job runs (on the worker, or a post on its caller's thread)
  // Runs a job as the worker does (fails the Work on error, completes it unless it completes
  // later).
  void runJob(Queued& item);
  bool stopping_ = false;
  bool shut_down_ = false;
  std::thread worker_;
  std::atomic<uint64_t> collectives_called_{0};

  struct InFlight {
    c10::intrusive_ptr<Work> work;
    Communicator::P2PRequest request;
    std::function<void()> finish;
    Communicator::Timeout timeout;
    // Whoever sets it first (the completer, or a caller in Work.wait()) completes the Work.
    std::shared_ptr<std::atomic<bool>> claimed;
  };
  std::condition_variable in_flight_cv_;
  std::deque<InFlight> in_flight_;  // posted, not yet completed; guarded by mutex_
  bool completer_stopping_ = false;
  std::thread completer_;
};

// Runs `fn`; railshard errors leave it with their kind in front (rethrowWithKind).
template <typename Fn>
auto guardedCall(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error&) {
    rethrowWithKind(std::current_exception());
  }
}

}  // namespace railshard::python
