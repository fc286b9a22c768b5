// The backend's collectives: each checks its tensors, stages them and queues its job
// (process_group_queue.cc runs the queue).
#include "python/csrc/process_group.h"

#include <utility>

#include "base/error.h"
#include "python/csrc/tensor_staging.h"

namespace railshard::python {
namespace {

// Same dtype and element count as `reference`, else InvalidArgument naming both.
void checkLike(const at::Tensor& tensor, const at::Tensor& reference, int64_t numel,
               const char* collective, const char* what) {
  if (tensor.scalar_type() != reference.scalar_type() || tensor.numel() != numel) {
    throw InvalidArgument(std::string("railshard ") + collective + ": " + what + " is " +
                          describe(tensor) + ", expected " + std::to_string(numel) +
                          " elements of " + c10::toString(reference.scalar_type()));
  }
}

}  // namespace

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
