#pragma once

// The ring phases of the staged collectives (device_staging.h): RingPipeline's schedule, with
// the data crossing the network through pinned host buffers and every reduction on the device.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/collectives/context.h"
#include "core/collectives/device_ops.h"
#include "core/collectives/device_staging_plan.h"
#include "core/collectives/ring.h"

namespace railshard::collectives {

// Waits for all device work enqueued so far (deadline ctx.timeout).
void waitForDevice(const Context& ctx, DeviceOps& device, const char* what);

// One slice of a ring collective on device buffers. Segment indices are rotated by `shift` as
// in RingPipeline: after reduceScatter() rank r holds segment (r + 1 + shift) mod size.
// Each phase returns with its sends complete and its device work done, so the next phase (or
// collective) may reuse every pinned and scratch buffer.
class StagedRing {
 public:
  StagedRing(const Context& ctx, DeviceOps& device, const SegmentLayout& layout,
             size_t element_size, int shift);

  int ownedSegment() const { return segmentAt(1); }

  // `input` (device memory, indexed by element offset) is this rank's contribution. Each
  // step's reduction goes to `accumulate` (same indexing, may equal `input`), or to device
  // scratch when it is null; the owned segment's result (divided by size for avg) goes to
  // `owned_out` (device), and with `stage_owned` also to pinned memory, ready for allGather().
  void reduceScatter(const uint8_t* input, uint8_t* accumulate, uint8_t* owned_out, DataType dtype,
                     ReduceOp op, bool stage_owned, uint32_t step_base);

  // Enqueues the copy of the owned segment (`owned`: its first element, device memory) to
  // pinned memory for allGather() when no reduceScatter() put it there.
  void stageOwned(const uint8_t* owned);

  // Circulates the segments through pinned memory, starting with the staged owned segment:
  // every received chunk is forwarded from pinned memory and copied into `data` (device,
  // indexed by element offset).
  void allGather(uint8_t* data, uint32_t step_base);

 private:
  // DeviceOps slots. The all-gather receives into the reduce-scatter's receive buffers: the
  // reduce-scatter has finished with them by then.
  static constexpr size_t kPinnedReceived = 0;  // RingStaging::kBuffers of them
  static constexpr size_t kPinnedToSend = kPinnedReceived + RingStaging::kBuffers;
  static constexpr size_t kPinnedOwned = kPinnedToSend + RingStaging::kBuffers;
  static constexpr size_t kScratchIncoming = 0;
  static constexpr size_t kScratchPartial = 1;

  int segmentAt(int step_offset) const;  // (rank + step_offset + shift) mod size
  size_t bytesAt(int segment) const {
    return layout_.offset[static_cast<size_t>(segment)] * element_size_;
  }
  transport::MessageTag tagAt(uint32_t step_base, int step, size_t chunk) const {
    return ctx_.tagAt(plan_.tagStep(step_base, step, chunk));
  }
  Deadline deadline() const { return deadlineAfter(ctx_.timeout); }
  // Posts the receives of `step`'s chunks of `segment` from the previous rank into `buffer`
  // (pinned, indexed like the segment's bytes), replacing `requests`.
  void postChunkReceives(std::vector<transport::RequestPtr>& requests, uint8_t* buffer, int segment,
                         uint32_t step_base, int step) const;

  const Context& ctx_;
  DeviceOps& device_;
  const SegmentLayout& layout_;
  size_t element_size_;
  int shift_;
  RingStaging plan_;
  uint8_t* owned_pinned_ = nullptr;
  // Per chunk: the copy that put it into owned_pinned_, waited for before its first send.
  std::vector<DeviceOps::Ticket> owned_copied_;
};

}  // namespace railshard::collectives
