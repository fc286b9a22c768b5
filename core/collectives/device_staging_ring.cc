#include "core/collectives/device_staging_ring.h"

#include <deque>
#include <limits>
#include <utility>

namespace railshard::collectives {

namespace {

constexpr int kBuffers = RingStaging::kBuffers;

// Sends in posting order, each with the ring step it belongs to.
class SendQueue {
 public:
  explicit SendQueue(const Context& ctx) : ctx_(ctx) {}
  void push(int step, transport::RequestPtr request) {
    sends_.emplace_back(step, std::move(request));
  }
  void waitUpTo(int step) {
    while (!sends_.empty() && sends_.front().first <= step) {
      ctx_.wait(sends_.front().second);
      sends_.pop_front();
    }
  }
  void waitAll() { waitUpTo(std::numeric_limits<int>::max()); }

 private:
  const Context& ctx_;
  std::deque<std::pair<int, transport::RequestPtr>> sends_;
};

}  // namespace

void waitForDevice(const Context& ctx, DeviceOps& device, const char* what) {
  device.waitFor(device.mark(), deadlineAfter(ctx.timeout), what);
}

StagedRing::StagedRing(const Context& ctx, DeviceOps& device, const SegmentLayout& layout,
                       size_t element_size, int shift)
    : ctx_(ctx),
      device_(device),
      layout_(layout),
      element_size_(element_size),
      shift_(shift),
      plan_(layout, element_size, ctx.chunk_bytes) {}

int StagedRing::segmentAt(int step_offset) const {
  const int n = ctx_.size;
  return (((ctx_.rank + step_offset + shift_) % n) + n) % n;
}

void StagedRing::postChunkReceives(std::vector<transport::RequestPtr>& requests, uint8_t* buffer,
                                   int segment, uint32_t step_base, int step) const {
  requests.clear();
  for (size_t c = 0; c < plan_.chunks(); ++c) {
    requests.push_back(ctx_.transport.irecv(ctx_.prev(), buffer + plan_.chunkOffset(segment, c),
                                            plan_.chunkBytes(segment, c),
                                            tagAt(step_base, step, c)));
  }
}

void StagedRing::reduceScatter(const uint8_t* input, uint8_t* accumulate, uint8_t* owned_out,
                               DataType dtype, ReduceOp op, bool stage_owned, uint32_t step_base) {
  const trace::Span phase(trace::Category::kPhase, "reduce_scatter", ctx_.tag.sequence);
  const int n = ctx_.size;
  const size_t k = plan_.chunks();
  const size_t segment_bytes = plan_.segmentBytes();
  uint8_t* received[kBuffers];
  uint8_t* to_send[kBuffers];
  for (int b = 0; b < kBuffers; ++b) {
    received[b] = static_cast<uint8_t*>(device_.pinned(kPinnedReceived + b, segment_bytes));
    to_send[b] = static_cast<uint8_t*>(device_.pinned(kPinnedToSend + b, segment_bytes));
  }
  auto* incoming = static_cast<uint8_t*>(device_.deviceScratch(kScratchIncoming, segment_bytes));
  uint8_t* partial = nullptr;
  if (accumulate == nullptr) {
    partial = static_cast<uint8_t*>(device_.deviceScratch(kScratchPartial, segment_bytes));
  }
  if (stage_owned) {
    owned_pinned_ = static_cast<uint8_t*>(device_.pinned(kPinnedOwned, segment_bytes));
  }

  std::vector<transport::RequestPtr> recvs[kBuffers];
  auto postRecvs = [&](int step) {
    const int b = RingStaging::buffer(step);
    postChunkReceives(recvs[b], received[b], segmentAt(-step - 1), step_base, step);
  };
  SendQueue sends(ctx_);

  postRecvs(0);
  {
    // Step 0 sends this rank's own contribution, copied out chunk by chunk so that the first
    // send waits for one chunk's copy only.
    const int segment = segmentAt(0);
    uint8_t* staging = to_send[RingStaging::buffer(0)];
    std::vector<DeviceOps::Ticket> copied(k);
    for (size_t c = 0; c < k; ++c) {
      const size_t offset = plan_.chunkOffset(segment, c);
      device_.copyToHost(staging + offset, input + bytesAt(segment) + offset,
                         plan_.chunkBytes(segment, c));
      copied[c] = device_.mark();
    }
    for (size_t c = 0; c < k; ++c) {
      device_.waitFor(copied[c], deadline(), "copy of this rank's chunk to pinned memory");
      sends.push(0, ctx_.transport.isend(ctx_.next(), staging + plan_.chunkOffset(segment, c),
                                         plan_.chunkBytes(segment, c), tagAt(step_base, 0, c)));
    }
  }

  for (int step = 0; step <= n - 2; ++step) {
    const bool last = step == n - 2;
    if (!last) {
      // received[buffer(step + 1)] last held the chunks of step reuses(step + 1), whose copies
      // to the device were all waited for before that step's sends.
      postRecvs(step + 1);
      // The device is about to write to_send[buffer(step + 1)]: the sends from it must be done.
      sends.waitUpTo(RingStaging::reuses(step + 1));
    }
    const int segment = segmentAt(-step - 1);
    const uint8_t* from = received[RingStaging::buffer(step)];
    const uint8_t* own = input + bytesAt(segment);
    uint8_t* out = last                    ? owned_out
                   : accumulate != nullptr ? accumulate + bytesAt(segment)
                                           : partial;
    uint8_t* forward =
        last ? (stage_owned ? owned_pinned_ : nullptr) : to_send[RingStaging::buffer(step + 1)];
    const auto& arrivals = recvs[RingStaging::buffer(step)];
    std::vector<DeviceOps::Ticket> reduced(k);
    size_t enqueued = 0;
    auto enqueueChunk = [&](size_t c) {
      ctx_.wait(arrivals[c]);
      const size_t offset = plan_.chunkOffset(segment, c);
      const size_t bytes = plan_.chunkBytes(segment, c);
      const size_t count = plan_.chunkElements(segment, c);
      device_.copyToDevice(incoming + offset, from + offset, bytes);
      device_.reduce(out + offset, own + offset, incoming + offset, count, dtype, op);
      if (last && op == ReduceOp::kAvg) {
        device_.divide(out + offset, count, dtype, static_cast<size_t>(n));
      }
      if (forward != nullptr) device_.copyToHost(forward + offset, out + offset, bytes);
      reduced[c] = device_.mark();
    };
    for (size_t c = 0; c < k; ++c) {
      if (enqueued == c) enqueueChunk(enqueued++);
      // Chunks that have already arrived go to the device now, so that it has work queued
      // while the host waits below.
      while (enqueued < k && arrivals[enqueued]->done()) enqueueChunk(enqueued++);
      if (!last) {
        device_.waitFor(reduced[c], deadline(), "reduced chunk copied to pinned memory");
        sends.push(step + 1, ctx_.transport.isend(
                                 ctx_.next(), forward + plan_.chunkOffset(segment, c),
                                 plan_.chunkBytes(segment, c), tagAt(step_base, step + 1, c)));
      }
    }
    if (last && stage_owned) owned_copied_ = std::move(reduced);
  }
  waitForDevice(ctx_, device_, "reduce-scatter's last reductions");
  sends.waitAll();
}

void StagedRing::stageOwned(const uint8_t* owned) {
  const int segment = ownedSegment();
  const size_t k = plan_.chunks();
  owned_pinned_ = static_cast<uint8_t*>(device_.pinned(kPinnedOwned, plan_.segmentBytes()));
  owned_copied_.assign(k, 0);
  for (size_t c = 0; c < k; ++c) {
    const size_t offset = plan_.chunkOffset(segment, c);
    device_.copyToHost(owned_pinned_ + offset, owned + offset, plan_.chunkBytes(segment, c));
    owned_copied_[c] = device_.mark();
  }
}

void StagedRing::allGather(uint8_t* data, uint32_t step_base) {
  const trace::Span phase(trace::Category::kPhase, "all_gather", ctx_.tag.sequence);
  const int n = ctx_.size;
  const size_t k = plan_.chunks();
  uint8_t* received[kBuffers];
  for (int b = 0; b < kBuffers; ++b) {
    received[b] = static_cast<uint8_t*>(device_.pinned(kPinnedReceived + b, plan_.segmentBytes()));
  }
  std::vector<transport::RequestPtr> recvs[kBuffers];
  auto postRecvs = [&](int step) {
    const int b = RingStaging::buffer(step);
    postChunkReceives(recvs[b], received[b], segmentAt(-step), step_base, step);
  };
  SendQueue sends(ctx_);
  // Per step: its chunks' copies from pinned memory to `data`.
  std::vector<DeviceOps::Ticket> copied(static_cast<size_t>(n), 0);

  postRecvs(0);
  {
    const int segment = ownedSegment();
    for (size_t c = 0; c < k; ++c) {
      device_.waitFor(owned_copied_.at(c), deadline(), "owned chunk copied to pinned memory");
      sends.push(0, ctx_.transport.isend(ctx_.next(), owned_pinned_ + plan_.chunkOffset(segment, c),
                                         plan_.chunkBytes(segment, c), tagAt(step_base, 0, c)));
    }
  }
  for (int step = 0; step <= n - 2; ++step) {
    const bool last = step == n - 2;
    if (!last) {
      // received[buffer(step + 1)] last held the chunks of step `previous`: they must have been
      // forwarded (sent in step previous + 1) and copied to the device.
      const int previous = RingStaging::reuses(step + 1);
      if (previous >= 0) {
        sends.waitUpTo(previous + 1);
        device_.waitFor(copied[static_cast<size_t>(previous)], deadline(),
                        "received chunks copied to the device");
      }
      postRecvs(step + 1);
    }
    const int segment = segmentAt(-step);
    const uint8_t* from = received[RingStaging::buffer(step)];
    const auto& arrivals = recvs[RingStaging::buffer(step)];
    for (size_t c = 0; c < k; ++c) {
      ctx_.wait(arrivals[c]);
      const size_t offset = plan_.chunkOffset(segment, c);
      const size_t bytes = plan_.chunkBytes(segment, c);
      if (!last) {
        sends.push(step + 1, ctx_.transport.isend(ctx_.next(), from + offset, bytes,
                                                  tagAt(step_base, step + 1, c)));
      }
      device_.copyToDevice(data + bytesAt(segment) + offset, from + offset, bytes);
    }
    copied[static_cast<size_t>(step)] = device_.mark();
  }
  waitForDevice(ctx_, device_, "all-gather's copies to the device");
  sends.waitAll();
}

}  // namespace railshard::collectives
