#pragma once

#include <cstddef>
#include <vector>

#include "base/types.h"
#include "core/collectives/context.h"

namespace railshard::collectives {

// Each algorithm runs one collective on ctx.transport. Arguments are already validated by
// the Communicator; every wait uses ctx.timeout.

// Ring reduce-scatter + all-gather, pipelined in chunks; bandwidth-optimal for large counts.
void ringAllreduce(const Context& ctx, const void* send, void* recv, size_t count, DataType dtype,
                   ReduceOp op);
// Recursive doubling (with fold-in for non-power-of-two sizes): ceil(log2 n) message
// latencies; every rank moves the whole buffer each round, so for small messages only.
void recursiveDoublingAllreduce(const Context& ctx, const void* send, void* recv, size_t count,
                                DataType dtype, ReduceOp op);
// send holds size * recv_count elements; rank r receives block r, reduced.
void ringReduceScatter(const Context& ctx, const void* send, void* recv, size_t recv_count,
                       DataType dtype, ReduceOp op);
// recv receives size * send_count elements, block r from rank r.
void ringAllgather(const Context& ctx, const void* send, void* recv, size_t send_count,
                   DataType dtype);
// Bruck's all-gather of chunks of any size (chunk_bytes[m] bytes from rank m; `send` is this
// rank's): ceil(log2 n) rounds at distances 1, 2, 4, ..., each a send to rank - d and a receive
// from rank + d, so a rank talks to at most 2 ceil(log2 n) peers, and moves what the ring does.
// `recv` receives every chunk in rank order.
void bruckAllgatherv(const Context& ctx, const void* send, const std::vector<size_t>& chunk_bytes,
                     void* recv);
// Pipelined chain from the root: (size-1) hops of latency, one message's worth of bandwidth.
void chainBroadcast(const Context& ctx, const void* send, void* recv, size_t count, DataType dtype,
                    int root);
// ceil(log2(size)) rounds of empty messages at distances 1, 2, 4, ...
void disseminationBarrier(const Context& ctx);
// Pairwise exchange: block r of `send` (send_counts[r] elements at send_displs[r]) to rank r,
// block r of `recv` from rank r; counts checked per pair by the message tags.
void allToAll(const Context& ctx, const void* send, const std::vector<size_t>& send_counts,
              const std::vector<size_t>& send_displs, void* recv,
              const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs,
              DataType dtype);

// Elements per ring segment processed at once: bounds workspace memory (two or four
// segments) for any message size, at the cost of a pipeline refill per slice.
size_t sliceSegmentElements(const Context& ctx, size_t element_size);

}  // namespace railshard::collectives
