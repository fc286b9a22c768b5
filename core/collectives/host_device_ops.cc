#include "core/collectives/host_device_ops.h"

#include <cstring>
#include <string>

#include "base/error.h"
#include "kernels/reduce.h"

namespace railshard::collectives {

void HostDeviceOps::copyToHost(void* host, const void* device, size_t bytes) {
  if (bytes > 0) std::memcpy(host, device, bytes);
}

void HostDeviceOps::copyToDevice(void* device, const void* host, size_t bytes) {
  if (bytes > 0) std::memcpy(device, host, bytes);
}

void HostDeviceOps::copyOnDevice(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
}

void HostDeviceOps::reduce(void* dst, const void* a, const void* b, size_t count, DataType dtype,
                           ReduceOp op) {
  if (count > 0) kernels::reduce(dst, a, b, count, dtype, op);
}

void HostDeviceOps::divide(void* data, size_t count, DataType dtype, size_t divisor) {
  if (count > 0) kernels::divide(data, count, dtype, divisor);
}

void HostDeviceOps::waitFor(Ticket ticket, Deadline deadline, const char* what) {
  (void)ticket;
  (void)deadline;
  (void)what;
}

void* HostDeviceOps::grow(std::vector<std::vector<uint8_t>>& buffers, size_t slot, size_t bytes) {
  if (buffers.size() <= slot) buffers.resize(slot + 1);
  if (buffers[slot].size() < bytes) buffers[slot].resize(bytes);
  return buffers[slot].data();
}

void* HostDeviceOps::deviceScratch(size_t slot, size_t bytes) {
  return grow(scratch_, slot, bytes);
}

void* HostDeviceOps::pinned(size_t slot, size_t bytes) {
  return grow(pinned_, slot, bytes);
}

void DeferredDeviceOps::copyToHost(void* host, const void* device, size_t bytes) {
  const Range target{static_cast<const uint8_t*>(host), bytes};
  if (bytes > 0 && !touchedByQueued(target)) std::memset(host, kGarbage, bytes);
  enqueue({target, Range{static_cast<const uint8_t*>(device), bytes}},
          [=, this] { HostDeviceOps::copyToHost(host, device, bytes); });
}

void DeferredDeviceOps::copyToDevice(void* device, const void* host, size_t bytes) {
  enqueue({Range{static_cast<const uint8_t*>(device), bytes},
           Range{static_cast<const uint8_t*>(host), bytes}},
          [=, this] { HostDeviceOps::copyToDevice(device, host, bytes); });
}

void DeferredDeviceOps::copyOnDevice(void* dst, const void* src, size_t bytes) {
  enqueue({Range{static_cast<const uint8_t*>(dst), bytes},
           Range{static_cast<const uint8_t*>(src), bytes}},
          [=, this] { HostDeviceOps::copyOnDevice(dst, src, bytes); });
}

void DeferredDeviceOps::reduce(void* dst, const void* a, const void* b, size_t count,
                               DataType dtype, ReduceOp op) {
  const size_t bytes = count * sizeOf(dtype);
  enqueue(
      {Range{static_cast<const uint8_t*>(dst), bytes}, Range{static_cast<const uint8_t*>(a), bytes},
       Range{static_cast<const uint8_t*>(b), bytes}},
      [=, this] { HostDeviceOps::reduce(dst, a, b, count, dtype, op); });
}

void DeferredDeviceOps::divide(void* data, size_t count, DataType dtype, size_t divisor) {
  enqueue({Range{static_cast<const uint8_t*>(data), count * sizeOf(dtype)}},
          [=, this] { HostDeviceOps::divide(data, count, dtype, divisor); });
}

void DeferredDeviceOps::waitFor(Ticket ticket, Deadline deadline, const char* what) {
  (void)deadline;
  if (ticket > enqueued_) {
    throw InvalidArgument(std::string("waitFor(") + what + "): ticket " + std::to_string(ticket) +
                          " was never marked (" + std::to_string(enqueued_) +
                          " operations enqueued)");
  }
  while (done_ < ticket) {
    Work work = std::move(queue_.front());
    queue_.pop_front();
    ++done_;
    work.run();
  }
}

void DeferredDeviceOps::flush() {
  waitFor(enqueued_, Deadline::max(), "flush");
}

void DeferredDeviceOps::enqueue(std::array<Range, 3> touches, std::function<void()> run) {
  queue_.push_back(Work{touches, std::move(run)});
  ++enqueued_;
}

bool DeferredDeviceOps::touchedByQueued(Range range) const {
  // As integers: ordering pointers into different buffers is unspecified in C++.
  const auto begin = reinterpret_cast<uintptr_t>(range.begin);
  const uintptr_t end = begin + range.bytes;
  for (const Work& work : queue_) {
    for (const Range& other : work.touches) {
      const auto other_begin = reinterpret_cast<uintptr_t>(other.begin);
      if (other.bytes > 0 && other_begin < end && begin < other_begin + other.bytes) return true;
    }
  }
  return false;
}

}  // namespace railshard::collectives
