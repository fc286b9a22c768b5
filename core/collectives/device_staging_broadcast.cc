// deviceBroadcast (device_staging.h): chainBroadcast's chain, staged through a ring of pinned
// chunk slots (ChunkStream).
#include <vector>

#include "core/collectives/device_staging.h"
#include "core/collectives/device_staging_plan.h"
#include "core/collectives/device_staging_ring.h"

namespace railshard::collectives {

namespace {

// DeviceOps pinned slot of the chunk ring; the ring collectives' slots are free meanwhile.
constexpr size_t kPinnedChunks = 0;

}  // namespace

void deviceBroadcast(const Context& ctx, DeviceOps& device, const void* send, void* recv,
                     size_t count, DataType dtype, int root) {
  const trace::Span phase(trace::Category::kPhase, "chain", ctx.tag.sequence);
  const size_t total = count * sizeOf(dtype);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  if (ctx.rank == root && in != out) device.copyOnDevice(out, in, total);
  if (ctx.size == 1) {
    waitForDevice(ctx, device, "copy of send to recv");
    return;
  }
  const int n = ctx.size;
  const int position = (ctx.rank - root + n) % n;  // 0 = root, n-1 = end of the chain
  const bool receives = position > 0;
  const bool forwards = position < n - 1;
  const ChunkStream stream(total, ctx.chunk_bytes);
  const size_t chunks = stream.chunks();
  auto* staging = static_cast<uint8_t*>(device.pinned(kPinnedChunks, stream.pinnedBytes()));
  auto deadline = [&] { return deadlineAfter(ctx.timeout); };

  std::vector<transport::RequestPtr> recvs(chunks);
  std::vector<transport::RequestPtr> sends(chunks);
  // Per chunk: the root's copy into its slot, or another rank's copy out of it.
  std::vector<DeviceOps::Ticket> copied(chunks, 0);
  // Fills (or starts filling) chunk c's slot once the chunk that used it before is gone.
  auto start = [&](size_t c) {
    const long previous = ChunkStream::reuses(c);
    if (previous >= 0) {
      const auto p = static_cast<size_t>(previous);
      if (sends[p]) ctx.wait(sends[p]);
      sends[p].reset();
      device.waitFor(copied[p], deadline(), "broadcast chunk copied out of pinned memory");
    }
    uint8_t* slot = staging + stream.slotOffset(c);
    if (receives) {
      recvs[c] = ctx.transport.irecv(ctx.prev(), slot, stream.bytes(c),
                                     ctx.tagAt(static_cast<uint32_t>(c)));
    } else {
      device.copyToHost(slot, in + stream.offset(c), stream.bytes(c));
      copied[c] = device.mark();
    }
  };

  for (size_t c = 0; c < chunks && c < ChunkStream::kLookahead; ++c) start(c);
  for (size_t c = 0; c < chunks; ++c) {
    uint8_t* slot = staging + stream.slotOffset(c);
    if (receives) {
      ctx.wait(recvs[c]);
    } else {
      device.waitFor(copied[c], deadline(), "broadcast chunk copied to pinned memory");
    }
    if (forwards) {
      sends[c] = ctx.transport.isend(ctx.next(), slot, stream.bytes(c),
                                     ctx.tagAt(static_cast<uint32_t>(c)));
    }
    if (receives) {
      device.copyToDevice(out + stream.offset(c), slot, stream.bytes(c));
      copied[c] = device.mark();
    }
    if (c + ChunkStream::kLookahead < chunks) start(c + ChunkStream::kLookahead);
  }
  // The end of the chain confirms to the root, as in chainBroadcast: otherwise two ranks that
  // both believe they are the root would both "succeed".
  const auto ack_step = static_cast<uint32_t>(chunks);
  const int last = (root + n - 1) % n;
  if (position == n - 1) {
    sends.push_back(ctx.transport.isend(root, nullptr, 0, ctx.tagAt(ack_step)));
  }
  if (position == 0) ctx.wait(ctx.transport.irecv(last, nullptr, 0, ctx.tagAt(ack_step)));
  for (auto& request : sends) {
    if (request) ctx.wait(request);
  }
  waitForDevice(ctx, device, "broadcast's copies to the device");
}

}  // namespace railshard::collectives
