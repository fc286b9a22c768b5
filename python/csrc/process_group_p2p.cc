// Point-to-point and all-to-all of the torch.distributed backend (docs/pytorch.md).
#include <numeric>

#include "base/error.h"
#include "python/csrc/process_group.h"
#include "python/csrc/tensor_staging.h"

namespace railshard::python {
namespace {

// torch's tags are ints; railshard's travel as 32 bits in the message header.
uint32_t wireTag(int tag) {
  return static_cast<uint32_t>(tag);
}

// A tensor's row counts (split sizes, torch's units) as element counts; equal splits when
// `splits` is empty. InvalidArgument naming what is wrong otherwise.
std::vector<size_t> elementCounts(const at::Tensor& tensor, const std::vector<int64_t>& splits,
                                  int size, const char* what) {
  const int64_t rows = tensor.dim() == 0 ? 1 : tensor.size(0);
  const int64_t row = rows == 0 ? 0 : tensor.numel() / rows;
  std::vector<size_t> counts(static_cast<size_t>(size));
  if (splits.empty()) {
    if (rows % size != 0) {
      throw InvalidArgument(std::string("railshard all_to_all_single: ") + what + " has " +
                            std::to_string(rows) + " rows, not divisible by the group size " +
                            std::to_string(size) + " (pass split sizes)");
    }
    for (auto& c : counts) c = static_cast<size_t>(rows / size * row);
    return counts;
  }
  if (splits.size() != static_cast<size_t>(size)) {
    throw InvalidArgument(std::string("railshard all_to_all_single: ") + what + " split sizes " +
                          "have " + std::to_string(splits.size()) + " entries, the group has " +
                          std::to_string(size) + " ranks");
  }
  int64_t total = 0;
  for (size_t r = 0; r < splits.size(); ++r) {
    if (splits[r] < 0) {
      throw InvalidArgument(std::string("railshard all_to_all_single: ") + what +
                            " split size of rank " + std::to_string(r) + " is " +
                            std::to_string(splits[r]));
    }
    total += splits[r];
    counts[r] = static_cast<size_t>(splits[r] * row);
  }
  if (total != rows) {
    throw InvalidArgument(std::string("railshard all_to_all_single: ") + what +
                          " split sizes add up to " + std::to_string(total) + " rows, the " + what +
                          " tensor has " + std::to_string(rows));
  }
  return counts;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupRailshard::send(std::vector<at::Tensor>& tensors,
                                                           int dst_rank, int tag) {
  return guardedCall([&] {
    checkOne(tensors, "send");
    auto buffer = std::make_shared<Staged>(tensors[0], "send", true, /*device_ok=*/false);
    const auto timeout = timeout_;
    return enqueuePointToPoint(
        c10d::OpType::SEND, tensors,
        [buffer, dst_rank, tag](Communicator& c, Work&) {
          return c.isend(buffer->data(), buffer->count(), buffer->dtype(), dst_rank, wireTag(tag));
        },
        [buffer] {}, timeout);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRailshard::recv(std::vector<at::Tensor>& tensors,
                                                           int src_rank, int tag) {
  return guardedCall([&] {
    checkOne(tensors, "recv");
    auto buffer = std::make_shared<Staged>(tensors[0], "recv", false, /*device_ok=*/false);
    const auto timeout = timeout_;
    return enqueuePointToPoint(
        c10d::OpType::RECV, tensors,
        [buffer, src_rank, tag](Communicator& c, Work& work) {
          work.setSourceRank(src_rank);
          return c.irecv(buffer->data(), buffer->count(), buffer->dtype(), src_rank, wireTag(tag));
        },
        [buffer] { buffer->finish(); }, timeout);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRailshard::recvAnysource(
    std::vector<at::Tensor>& tensors, int tag) {
  return guardedCall([&] {
    checkOne(tensors, "recv");
    auto buffer = std::make_shared<Staged>(tensors[0], "recv", false, /*device_ok=*/false);
    const auto timeout = timeout_;
    return enqueuePointToPoint(
        c10d::OpType::RECVANYSOURCE, tensors,
        [buffer, tag, timeout](Communicator& c, Work& work) {
          auto [peer, request] =
              c.irecvAny(buffer->data(), buffer->count(), buffer->dtype(), wireTag(tag), timeout);
          work.setSourceRank(peer);
          return request;
        },
        [buffer] { buffer->finish(); }, timeout);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRailshard::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) {
  return guardedCall([&] {
    if (output.scalar_type() != input.scalar_type()) {
      throw InvalidArgument("railshard all_to_all_single: output is " + describe(output) +
                            ", input is " + describe(input) + " (one dtype)");
    }
    const auto send_counts = elementCounts(input, input_splits, getSize(), "input");
    const auto recv_counts = elementCounts(output, output_splits, getSize(), "output");
    auto in = std::make_shared<Staged>(input, "all_to_all_single", true, /*device_ok=*/false);
    auto out = std::make_shared<Staged>(output, "all_to_all_single", false, /*device_ok=*/false);
    const auto timeout = deadline(opts.timeout);
    return enqueue(c10d::OpType::ALLTOALL_BASE, {output}, timeout,
                   [in, out, send_counts, recv_counts, timeout](Communicator& c) {
                     c.allToAll(in->data(), send_counts, out->data(), recv_counts, in->dtype(),
                                timeout);
                     out->finish();
                   });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRailshard::alltoall(std::vector<at::Tensor>& outputs,
                                                               std::vector<at::Tensor>& inputs,
                                                               const c10d::AllToAllOptions& opts) {
  return guardedCall([&] {
    const auto n = static_cast<size_t>(getSize());
    if (outputs.size() != n || inputs.size() != n) {
      throw InvalidArgument(
          "railshard all_to_all: needs one input and one output tensor per "
          "rank (" +
          std::to_string(n) + "), got " + std::to_string(inputs.size()) + " inputs and " +
          std::to_string(outputs.size()) + " outputs");
    }
    std::vector<size_t> send_counts(n);
    std::vector<size_t> recv_counts(n);
    for (size_t r = 0; r < n; ++r) {
      for (const at::Tensor* t : {&inputs[r], &outputs[r]}) {
        if (t->scalar_type() != inputs[0].scalar_type()) {
          throw InvalidArgument("railshard all_to_all: tensors must share one dtype, got " +
                                describe(inputs[0]) + " and " + describe(*t));
        }
      }
      send_counts[r] = static_cast<size_t>(inputs[r].numel());
      recv_counts[r] = static_cast<size_t>(outputs[r].numel());
    }
    auto flat_in = std::make_shared<at::Tensor>(flattenTensors(inputs, "all_to_all"));
    auto flat_out = std::make_shared<at::Tensor>(at::empty(
        {static_cast<int64_t>(std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0}))},
        flat_in->options()));
    const DataType dtype = *nativeType(flat_in->scalar_type());
    const auto timeout = deadline(opts.timeout);
    return enqueue(c10d::OpType::ALLTOALL, outputs, timeout,
                   [flat_in, flat_out, outputs, send_counts, recv_counts, dtype,
                    timeout](Communicator& c) mutable {
                     c.allToAll(flat_in->data_ptr(), send_counts, flat_out->data_ptr(), recv_counts,
                                dtype, timeout);
                     unflattenTensors(*flat_out, outputs);
                   });
  });
}

}  // namespace railshard::python
