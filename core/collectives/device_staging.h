#pragma once

// Collectives on device (GPU) buffers for transports that move host memory: data crosses the
// network through pinned host buffers, reductions run on the device. Declared like
// algorithms.h, with the device as a second argument: `send`/`recv` are device pointers the
// DeviceOps can read and write, and the Context is the one the host algorithms get (same
// tags, chunk size, timeout).
//
// Typical use, one collective on a CUDA stream (see cuda_device_ops.h):
//   CudaDeviceOps& ops = ...;  // one per communicator and device, cached across calls
//   ops.begin(stream);
//   deviceRingAllreduce(ctx, ops, send, recv, count, dtype, op);
//   ops.end(stream);
// Every function returns with its device work done and its sends complete (the pinned and
// scratch buffers are then free for the next collective); end() orders the user's stream
// after that work. Transport waits use ctx.wait (deadline ctx.timeout), device waits a
// deadline of ctx.timeout each (TimeoutError naming what was waited for).
//
// Memory (cached in the DeviceOps across calls): the ring collectives work in slices of
// sliceSegmentElements() per segment, at most 16 chunks of ctx.chunk_bytes, through 5 pinned
// buffers of one such segment and 2 device scratch segments; the broadcast streams through
// 32 pinned chunk slots in the first of those buffers (grown to 32 chunks). So at most
// 96 * chunk_bytes of pinned memory (96 MiB at the default 1 MiB chunks) and 32 * chunk_bytes
// of device scratch, whatever the message size.
#include <cstddef>

#include "base/types.h"
#include "core/collectives/context.h"
#include "core/collectives/device_ops.h"

namespace railshard::collectives {

// Ring reduce-scatter then all-gather (as ringAllreduce), per ring step and chunk: receive
// into pinned memory -> copy to device scratch -> reduce into recv on the device -> copy the
// result to pinned memory -> send it once that copy is waited for. A chunk's device work is
// enqueued as soon as it arrives, so the network moves chunk j+1 while the device works on
// chunk j. The all-gather forwards chunks host-side and copies each one into recv. In place
// (send == recv) or not; avg divides the owned segment on the device before the all-gather.
void deviceRingAllreduce(const Context& ctx, DeviceOps& device, const void* send, void* recv,
                         size_t count, DataType dtype, ReduceOp op);

// send holds size * recv_count elements; rank r receives block r, reduced (recv may be
// send's block r).
void deviceRingReduceScatter(const Context& ctx, DeviceOps& device, const void* send, void* recv,
                             size_t recv_count, DataType dtype, ReduceOp op);

// recv receives size * send_count elements, block r from rank r (send may be recv's block r):
// a ring all-gather through pinned memory, each received chunk copied to the device at once.
void deviceAllgather(const Context& ctx, DeviceOps& device, const void* send, void* recv,
                     size_t send_count, DataType dtype);

// Chain from the root (as chainBroadcast) in chunks of ctx.chunk_bytes through pinned memory:
// the root copies chunks out ahead of its sends, the others forward each chunk host-side and
// copy it into recv.
void deviceBroadcast(const Context& ctx, DeviceOps& device, const void* send, void* recv,
                     size_t count, DataType dtype, int root);

}  // namespace railshard::collectives
