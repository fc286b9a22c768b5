// all_reduce of sparse COO tensors (SUM), as gloo has it: what DDP sends for the gradients of
// nn.Embedding(sparse=True). Every rank all-gathers every rank's indices and values and adds
// them up, so each ends with the same coalesced sum, written into the caller's tensor.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "python/csrc/process_group.h"
#include "python/csrc/tensor_staging.h"

namespace railshard::python {

namespace {

// What each rank publishes first: nnz, sparse and dense dims, then the sizes, so every rank
// can check the others' tensors against its own before any index or value is exchanged.
std::vector<int64_t> describeSparse(const at::Tensor& coalesced) {
  std::vector<int64_t> meta{coalesced._nnz(), coalesced.sparse_dim(), coalesced.dense_dim()};
  for (const int64_t size : coalesced.sizes()) meta.push_back(size);
  return meta;
}

std::string sizesOf(const int64_t* meta, size_t width) {
  std::string out = "nnz " + std::to_string(meta[0]) + ", sparse_dim " + std::to_string(meta[1]) +
                    ", dense_dim " + std::to_string(meta[2]) + ", size (";
  for (size_t i = 3; i < width; ++i) out += (i == 3 ? "" : ", ") + std::to_string(meta[i]);
  return out + ")";
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupRailshard::allreduceSparse(
    at::Tensor& tensor, const c10d::AllreduceOptions& opts) {
  if (opts.reduceOp.op_ != c10d::ReduceOp::SUM) {
    throw InvalidArgument("railshard allreduce: sparse tensors are summed only (ReduceOp.SUM), " +
                          describe(tensor) + " was given another op");
  }
  if (!tensor.device().is_cpu()) {
    throw InvalidArgument("railshard allreduce: sparse tensors must be on the CPU, got " +
                          describe(tensor));
  }
  const auto values_type = nativeType(tensor.scalar_type());
  if (!values_type) {
    throw InvalidArgument("railshard allreduce: sparse values of type " +
                          std::string(c10::toString(tensor.scalar_type())) + " are not supported");
  }
  const DataType dtype = *values_type;
  const auto timeout = deadline(opts.timeout);
  at::Tensor target = tensor;
  return enqueue(
      c10d::OpType::ALLREDUCE, {tensor}, timeout,
      [target, dtype, timeout](Communicator& c) mutable {
        const at::Tensor local = target.coalesce();
        const std::vector<int64_t> meta = describeSparse(local);
        const size_t width = meta.size();
        const auto n = static_cast<size_t>(c.size());
        std::vector<int64_t> all(width * n);
        c.allgather(meta.data(), all.data(), width, DataType::kInt64, timeout);
        int64_t most = 0;
        for (size_t r = 0; r < n; ++r) {
          const int64_t* theirs = all.data() + r * width;
          if (!std::equal(meta.begin() + 1, meta.end(), theirs + 1)) {
            throw InvalidArgument("railshard allreduce: sparse tensors differ in shape: rank " +
                                  std::to_string(c.rank()) + " has " + sizesOf(meta.data(), width) +
                                  ", rank " + std::to_string(r) + " has " + sizesOf(theirs, width));
          }
          most = std::max(most, theirs[0]);
        }
        // Every rank's indices and values padded to the largest nnz: one all-gather each.
        const int64_t sparse_dim = meta[1];
        const at::Tensor indices = local._indices().contiguous();
        at::Tensor values = local._values().contiguous();
        std::vector<int64_t> value_shape(values.sizes().begin(), values.sizes().end());
        value_shape[0] = most;
        at::Tensor my_indices = at::zeros({sparse_dim, most}, indices.options());
        at::Tensor my_values = at::zeros(value_shape, values.options());
        my_indices.narrow(1, 0, meta[0]).copy_(indices);
        my_values.narrow(0, 0, meta[0]).copy_(values);
        std::vector<int64_t> all_shape = value_shape;
        all_shape.insert(all_shape.begin(), static_cast<int64_t>(n));
        at::Tensor all_indices =
            at::empty({static_cast<int64_t>(n), sparse_dim, most}, indices.options());
        at::Tensor all_values = at::empty(all_shape, values.options());
        if (most == 0) {  // every rank's tensor is empty: so is the sum (and `target`)
          target.copy_(local);
          return;
        }
        c.allgather(my_indices.data_ptr(), all_indices.data_ptr(),
                    static_cast<size_t>(my_indices.numel()), DataType::kInt64, timeout);
        c.allgather(my_values.data_ptr(), all_values.data_ptr(),
                    static_cast<size_t>(my_values.numel()), dtype, timeout);
        std::vector<at::Tensor> index_parts;
        std::vector<at::Tensor> value_parts;
        for (size_t r = 0; r < n; ++r) {
          const int64_t nnz = all[r * width];
          const auto rank = static_cast<int64_t>(r);
          index_parts.push_back(all_indices[rank].narrow(1, 0, nnz));
          value_parts.push_back(all_values[rank].narrow(0, 0, nnz));
        }
        const at::Tensor sum =
            at::sparse_coo_tensor(at::cat(index_parts, 1), at::cat(value_parts, 0), target.sizes(),
                                  target.options())
                .coalesce();
        target.copy_(sum);
      });
}

}  // namespace railshard::python
