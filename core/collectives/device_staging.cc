#include "core/collectives/device_staging.h"

#include <cstdint>

#include "core/collectives/algorithms.h"
#include "core/collectives/device_staging_plan.h"
#include "core/collectives/device_staging_ring.h"
#include "core/collectives/ring.h"

namespace railshard::collectives {

namespace {

// Tag steps of one phase of one slice: room for (size - 1) * 16 chunks, as the host rings.
constexpr uint32_t kPhaseSteps = 1u << 20;

}  // namespace

void deviceRingAllreduce(const Context& ctx, DeviceOps& device, const void* send, void* recv,
                         size_t count, DataType dtype, ReduceOp op) {
  const size_t element_size = sizeOf(dtype);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  if (ctx.size == 1) {
    // Avg over one rank divides by one: nothing to do.
    if (in != out) device.copyOnDevice(out, in, count * element_size);
    waitForDevice(ctx, device, "copy of send to recv");
    return;
  }
  const size_t n = static_cast<size_t>(ctx.size);
  uint32_t step_base = 0;
  for (const Slice& slice : slices(count, sliceSegmentElements(ctx, element_size) * n)) {
    const SegmentLayout layout = SegmentLayout::balanced(slice.length, ctx.size);
    StagedRing ring(ctx, device, layout, element_size, 0);
    const uint8_t* slice_in = in + slice.begin * element_size;
    uint8_t* slice_out = out + slice.begin * element_size;
    const auto owned = static_cast<size_t>(ring.ownedSegment());
    ring.reduceScatter(slice_in, slice_out, slice_out + layout.offset[owned] * element_size, dtype,
                       op, /*stage_owned=*/true, step_base);
    step_base += kPhaseSteps;
    ring.allGather(slice_out, step_base);
    step_base += kPhaseSteps;
  }
}

void deviceRingReduceScatter(const Context& ctx, DeviceOps& device, const void* send, void* recv,
                             size_t recv_count, DataType dtype, ReduceOp op) {
  const size_t element_size = sizeOf(dtype);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  if (ctx.size == 1) {
    if (in != out) device.copyOnDevice(out, in, recv_count * element_size);
    waitForDevice(ctx, device, "copy of send to recv");
    return;
  }
  uint32_t step_base = 0;
  for (const Slice& slice : slices(recv_count, sliceSegmentElements(ctx, element_size))) {
    const SegmentLayout layout =
        SegmentLayout::blockSlice(recv_count, slice.begin, slice.length, ctx.size);
    StagedRing ring(ctx, device, layout, element_size, -1);
    // Intermediate sums live in device scratch: recv holds one block only.
    ring.reduceScatter(in, nullptr, out + slice.begin * element_size, dtype, op,
                       /*stage_owned=*/false, step_base);
    step_base += kPhaseSteps;
  }
}

void deviceAllgather(const Context& ctx, DeviceOps& device, const void* send, void* recv,
                     size_t send_count, DataType dtype) {
  const size_t element_size = sizeOf(dtype);
  const size_t block_bytes = send_count * element_size;
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  uint8_t* mine = out + static_cast<size_t>(ctx.rank) * block_bytes;
  if (in != mine) device.copyOnDevice(mine, in, block_bytes);
  if (ctx.size == 1) {
    waitForDevice(ctx, device, "copy of send to recv");
    return;
  }
  uint32_t step_base = 0;
  for (const Slice& slice : slices(send_count, sliceSegmentElements(ctx, element_size))) {
    const SegmentLayout layout =
        SegmentLayout::blockSlice(send_count, slice.begin, slice.length, ctx.size);
    StagedRing ring(ctx, device, layout, element_size, -1);
    // From send rather than recv: it does not wait for the device copy into recv above.
    ring.stageOwned(in + slice.begin * element_size);
    ring.allGather(out, step_base);
    step_base += kPhaseSteps;
  }
}

}  // namespace railshard::collectives
