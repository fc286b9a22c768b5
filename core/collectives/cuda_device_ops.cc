#include "core/collectives/cuda_device_ops.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "base/error.h"
#include "kernels/cuda/reduce.h"

namespace railshard::collectives {

namespace cuda = kernels::cuda;

void pollUntilDone(const std::function<bool()>& done, Deadline deadline, const char* what) {
  const Clock::time_point start = Clock::now();
  // A copy or kernel of one chunk takes microseconds: yield first, then sleep, so that ranks
  // sharing cores with this one still run, without adding much latency to a short wait.
  constexpr int kYields = 64;
  constexpr auto kMaxSleep = std::chrono::microseconds(100);
  auto sleep = std::chrono::microseconds(1);
  for (int polls = 0; !done(); ++polls) {
    if (Clock::now() >= deadline) {
      char waited[32];
      std::snprintf(waited, sizeof(waited), "%.3f", secondsSince(start));
      throw TimeoutError(std::string("device work did not finish: ") + what + " (waited " + waited +
                         " s)");
    }
    if (polls < kYields) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(sleep);
      sleep = std::min<std::chrono::microseconds>(sleep * 2, kMaxSleep);
    }
  }
}

CudaDeviceOps::CudaDeviceOps(int device) : device_(device) {
  cuda::setDevice(device_);
  try {
    stream_ = cuda::createStream();
    begin_event_ = cuda::createEvent();
    end_event_ = cuda::createEvent();
  } catch (...) {
    releaseAll();
    throw;
  }
}

CudaDeviceOps::~CudaDeviceOps() {
  releaseAll();
}

void CudaDeviceOps::releaseAll() noexcept {
  // Destructors must not throw; a failing runtime at teardown has nothing left to tell.
  auto quietly = [](auto&& fn) {
    try {
      fn();
    } catch (...) {
    }
  };
  quietly([&] { cuda::setDevice(device_); });
  // Nothing may still use the buffers when they are freed.
  if (stream_ != nullptr) quietly([&] { cuda::synchronizeStream(stream_); });
  for (Buffer& buffer : scratch_) {
    if (buffer.data != nullptr) quietly([&] { cuda::freeDevice(buffer.data); });
  }
  for (Buffer& buffer : pinned_) {
    if (buffer.data != nullptr) quietly([&] { cuda::freePinned(buffer.data); });
  }
  scratch_.clear();
  pinned_.clear();
  for (auto& [ticket, event] : marked_) free_events_.push_back(event);
  marked_.clear();
  for (cuda::Event event : free_events_) quietly([&] { cuda::destroyEvent(event); });
  free_events_.clear();
  if (begin_event_ != nullptr) quietly([&] { cuda::destroyEvent(begin_event_); });
  if (end_event_ != nullptr) quietly([&] { cuda::destroyEvent(end_event_); });
  if (stream_ != nullptr) quietly([&] { cuda::destroyStream(stream_); });
  begin_event_ = end_event_ = stream_ = nullptr;
}

void CudaDeviceOps::begin(cuda::Stream user_stream) {
  cuda::setDevice(device_);
  cuda::recordEvent(begin_event_, user_stream);
  cuda::streamWaitEvent(stream_, begin_event_);
}

void CudaDeviceOps::end(cuda::Stream user_stream) {
  cuda::recordEvent(end_event_, stream_);
  cuda::streamWaitEvent(user_stream, end_event_);
}

void CudaDeviceOps::copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) cuda::copyAsync(dst, src, bytes, stream_);
}

void CudaDeviceOps::copyToHost(void* host, const void* device, size_t bytes) {
  copy(host, device, bytes);
}

void CudaDeviceOps::copyToDevice(void* device, const void* host, size_t bytes) {
  copy(device, host, bytes);
}

void CudaDeviceOps::copyOnDevice(void* dst, const void* src, size_t bytes) {
  copy(dst, src, bytes);
}

void CudaDeviceOps::reduce(void* dst, const void* a, const void* b, size_t count, DataType dtype,
                           ReduceOp op) {
  if (count > 0) cuda::reduce(dst, a, b, count, dtype, op, stream_);
}

void CudaDeviceOps::divide(void* data, size_t count, DataType dtype, size_t divisor) {
  if (count > 0) cuda::divide(data, count, dtype, divisor, stream_);
}

DeviceOps::Ticket CudaDeviceOps::mark() {
  // Events of tickets already passed go back to the pool, so it stays as small as the number
  // of marks in flight.
  while (!marked_.empty() && cuda::eventDone(marked_.front().second)) {
    retire(marked_.front().first);
  }
  cuda::Event event;
  if (free_events_.empty()) {
    event = cuda::createEvent();
  } else {
    event = free_events_.back();
    free_events_.pop_back();
  }
  try {
    cuda::recordEvent(event, stream_);
  } catch (...) {
    free_events_.push_back(event);
    throw;
  }
  marked_.emplace_back(++last_ticket_, event);
  return last_ticket_;
}

void CudaDeviceOps::waitFor(Ticket ticket, Deadline deadline, const char* what) {
  if (ticket <= done_ticket_) return;
  if (ticket > last_ticket_) {
    throw InvalidArgument(std::string("waitFor(") + what + "): ticket " + std::to_string(ticket) +
                          " was never marked");
  }
  // The stream runs in order, so the event of `ticket` done means every earlier one is too.
  const auto found = std::find_if(marked_.begin(), marked_.end(),
                                  [&](const auto& entry) { return entry.first >= ticket; });
  const cuda::Event event = found->second;
  pollUntilDone([&] { return cuda::eventDone(event); }, deadline, what);
  retire(found->first);
}

void CudaDeviceOps::retire(Ticket ticket) {
  while (!marked_.empty() && marked_.front().first <= ticket) {
    free_events_.push_back(marked_.front().second);
    marked_.pop_front();
  }
  done_ticket_ = std::max(done_ticket_, ticket);
}

void* CudaDeviceOps::deviceScratch(size_t slot, size_t bytes) {
  if (scratch_.size() <= slot) scratch_.resize(slot + 1);
  Buffer& buffer = scratch_[slot];
  if (buffer.bytes < bytes) {
    // cudaFree waits for the device, so work still using the old buffer finishes first.
    if (buffer.data != nullptr) cuda::freeDevice(buffer.data);
    buffer = Buffer{};
    buffer.data = cuda::allocateDevice(bytes);
    buffer.bytes = bytes;
  }
  return buffer.data;
}

void* CudaDeviceOps::pinned(size_t slot, size_t bytes) {
  if (pinned_.size() <= slot) pinned_.resize(slot + 1);
  Buffer& buffer = pinned_[slot];
  if (buffer.bytes < bytes) {
    if (buffer.data != nullptr) cuda::freePinned(buffer.data);
    buffer = Buffer{};
    buffer.data = cuda::allocatePinned(bytes);
    buffer.bytes = bytes;
  }
  return buffer.data;
}

}  // namespace railshard::collectives
