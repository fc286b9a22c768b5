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

#include <ATen/ATen.h>

#include "core/communicator.h"
#include "python/csrc/torch_compat.h"
#include "python/csrc/work.h"

namespace railshard::python {

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
  ~ProcessGroupRailshard() override;

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
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, std::vector<at::Tensor> outputs,
                                         Job job);
  void workerLoop();
  // The per-call deadline: the option's when set, else the group's.
  Communicator::Timeout deadline(std::chrono::milliseconds option) const;
  int checkRoot(int64_t root, const char* collective) const;

  std::unique_ptr<Communicator> communicator_;
  Communicator::Timeout timeout_;

  std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::deque<std::pair<c10::intrusive_ptr<Work>, Job>> queue_;
  bool stopping_ = false;
  bool shut_down_ = false;
  std::thread worker_;
};

// For the Python module: the same errors, with "railshard <Kind>: " in front of the message.
[[noreturn]] void rethrowWithKind(std::exception_ptr error);

}  // namespace railshard::python
