// device_runtime.h for a build without CUDA: nothing is available, every pointer is host
// memory, and every call that would need the runtime raises ConfigError saying why, so a
// caller that asks for device memory learns it from the error rather than from a crash.
#include <string>

#include "base/error.h"
#include "kernels/cuda/device_runtime.h"

namespace railshard::kernels::cuda {
namespace {

#ifdef RAILSHARD_CUDA_SWITCHED_OFF
constexpr const char* kReason =
    "built without CUDA (RAILSHARD_WITH_CUDA=OFF when railshard was configured; see docs/gpu.md)";
#else
constexpr const char* kReason =
    "built without CUDA (nvcc was not found when railshard was configured; see docs/gpu.md)";
#endif

[[noreturn]] void unavailable() {
  throw ConfigError(kReason);
}

}  // namespace

bool compiledIn() {
  return false;
}
bool available() {
  return false;
}
std::string unavailableReason() {
  return kReason;
}
int deviceCount() {
  return 0;
}

PointerKind pointerKind(const void*) {
  return PointerKind::kHost;
}
int pointerDevice(const void*) {
  return -1;
}

int currentDevice() {
  unavailable();
}
void setDevice(int) {
  unavailable();
}
std::string deviceName(int) {
  unavailable();
}

std::string pciBusId(int) {
  unavailable();
}

Stream createStream() {
  unavailable();
}
// Destroying or freeing nothing is fine everywhere, so RAII wrappers need no special case.
void destroyStream(Stream stream) {
  if (stream != nullptr) unavailable();
}
void synchronizeStream(Stream) {
  unavailable();
}

Event createEvent() {
  unavailable();
}
void destroyEvent(Event event) {
  if (event != nullptr) unavailable();
}
void recordEvent(Event, Stream) {
  unavailable();
}
void streamWaitEvent(Stream, Event) {
  unavailable();
}
bool eventDone(Event) {
  unavailable();
}

void* allocateDevice(size_t) {
  unavailable();
}
void freeDevice(void* ptr) {
  if (ptr != nullptr) unavailable();
}
void* allocatePinned(size_t) {
  unavailable();
}
void freePinned(void* ptr) {
  if (ptr != nullptr) unavailable();
}

void copyAsync(void*, const void*, size_t, Stream) {
  unavailable();
}
void copy(void*, const void*, size_t) {
  unavailable();
}
void memsetAsync(void*, int, size_t, Stream) {
  unavailable();
}

}  // namespace railshard::kernels::cuda
