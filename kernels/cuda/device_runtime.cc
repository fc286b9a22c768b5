// The CUDA runtime behind device_runtime.h. Compiled only when CMake found nvcc and the
// toolkit; linked against the static runtime (see the top-level CMakeLists.txt), which opens
// libcuda.so.1 at the first call, so every function here must cope with "no driver".
#include "kernels/cuda/device_runtime.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <string>

#include "base/error.h"

namespace railshard::kernels::cuda {
namespace {

std::string describe(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ")";
}

// Throws railshard::Error naming the call. The runtime also records a failed call as the
// thread's "last error"; it is cleared here so that the cudaGetLastError() after a later
// kernel launch reports that launch and not this old failure (sticky errors, which poison
// the context, come back from every later call anyway).
void check(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();
  throw Error(std::string(call) + " failed: " + describe(status));
}

struct Availability {
  int devices = 0;
  std::string reason;  // empty when devices > 0
};

Availability probe() {
  Availability result;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess && count > 0) {
    result.devices = count;
    return result;
  }
  (void)cudaGetLastError();
  if (status == cudaSuccess) {
    result.reason = "no CUDA device: cudaGetDeviceCount found 0 devices";
  } else if (status == cudaErrorInsufficientDriver) {
    // The runtime says "insufficient driver" both when libcuda.so.1 is missing and when it is
    // too old; which one it was decides what the user has to install.
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (driver != nullptr) {
      dlclose(driver);
      int runtime = 0;
      (void)cudaRuntimeGetVersion(&runtime);
      result.reason = "NVIDIA driver too old for CUDA runtime " + std::to_string(runtime / 1000) +
                      "." + std::to_string(runtime % 1000 / 10) + ": " + describe(status);
    } else {
      result.reason = "no NVIDIA driver (libcuda.so.1 could not be loaded): " + describe(status);
    }
  } else if (status == cudaErrorNoDevice) {
    result.reason = "no CUDA device: " + describe(status);
  } else {
    result.reason = "CUDA unavailable: cudaGetDeviceCount failed: " + describe(status);
  }
  return result;
}

const Availability& availability() {
  static const Availability state = probe();  // thread-safe, once per process
  return state;
}

void requireAvailable() {
  if (!available()) throw ConfigError(unavailableReason());
}

void requireDevice(int device, const char* what) {
  requireAvailable();
  if (device < 0 || device >= deviceCount()) {
    throw InvalidArgument(std::string(what) + ": device " + std::to_string(device) +
                          " out of range (" + std::to_string(deviceCount()) + " devices)");
  }
}

// The attributes of a pointer, or false (with the runtime's error state cleared) for a pointer
// CUDA does not know. Never throws.
bool attributesOf(const void* ptr, cudaPointerAttributes& attributes) {
  if (ptr == nullptr || !available()) return false;
  if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

}  // namespace

bool compiledIn() {
  return true;
}

bool available() {
  return availability().devices > 0;
}

std::string unavailableReason() {
  return availability().reason;
}

int deviceCount() {
  return availability().devices;
}

PointerKind pointerKind(const void* ptr) {
  try {
    cudaPointerAttributes attributes{};
    return attributesOf(ptr, attributes) ? PointerKind::kDevice : PointerKind::kHost;
  } catch (...) {
    // Only a failed allocation of the reason string could get here; the contract is
    // "never throws", and an unknown pointer is host memory.
    return PointerKind::kHost;
  }
}

int pointerDevice(const void* ptr) {
  try {
    cudaPointerAttributes attributes{};
    return attributesOf(ptr, attributes) ? attributes.device : -1;
  } catch (...) {
    return -1;
  }
}

int currentDevice() {
  requireAvailable();
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

void setDevice(int device) {
  requireDevice(device, "setDevice");
  check(cudaSetDevice(device), "cudaSetDevice");
}

std::string deviceName(int device) {
  requireDevice(device, "deviceName");
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  char memory[32];
  std::snprintf(memory, sizeof(memory), "%.1f GiB",
                static_cast<double>(properties.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  return std::string(properties.name) + " (sm_" + std::to_string(properties.major) +
         std::to_string(properties.minor) + ", " + memory + ")";
}

std::string pciBusId(int device) {
  requireDevice(device, "pciBusId");
  char id[32] = {};
  check(cudaDeviceGetPCIBusId(id, sizeof(id), device), "cudaDeviceGetPCIBusId");
  return id;
}

Stream createStream() {
  requireAvailable();
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return stream;
}

void destroyStream(Stream stream) {
  if (stream == nullptr) return;  // the legacy default stream is not ours to destroy
  requireAvailable();
  check(cudaStreamDestroy(static_cast<cudaStream_t>(stream)), "cudaStreamDestroy");
}

void synchronizeStream(Stream stream) {
  requireAvailable();
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

Event createEvent() {
  requireAvailable();
  cudaEvent_t event = nullptr;
  check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  return event;
}

void destroyEvent(Event event) {
  if (event == nullptr) return;
  requireAvailable();
  check(cudaEventDestroy(static_cast<cudaEvent_t>(event)), "cudaEventDestroy");
}

void recordEvent(Event event, Stream stream) {
  requireAvailable();
  check(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)),
        "cudaEventRecord");
}

void streamWaitEvent(Stream stream, Event event) {
  requireAvailable();
  check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0),
        "cudaStreamWaitEvent");
}

bool eventDone(Event event) {
  requireAvailable();
  const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is an answer, not a failure to report later
    return false;
  }
  check(status, "cudaEventQuery");
  return true;
}

void* allocateDevice(size_t bytes) {
  requireAvailable();
  if (bytes == 0) return nullptr;
  void* ptr = nullptr;
  const cudaError_t status = cudaMalloc(&ptr, bytes);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error("cudaMalloc failed: " + describe(status) + " allocating " + std::to_string(bytes) +
                " bytes");
  }
  return ptr;
}

void freeDevice(void* ptr) {
  if (ptr == nullptr) return;
  requireAvailable();
  check(cudaFree(ptr), "cudaFree");
}

void* allocatePinned(size_t bytes) {
  requireAvailable();
  if (bytes == 0) return nullptr;
  void* ptr = nullptr;
  const cudaError_t status = cudaMallocHost(&ptr, bytes);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error("cudaMallocHost failed: " + describe(status) + " allocating " +
                std::to_string(bytes) + " bytes");
  }
  return ptr;
}

void freePinned(void* ptr) {
  if (ptr == nullptr) return;
  requireAvailable();
  check(cudaFreeHost(ptr), "cudaFreeHost");
}

void copyAsync(void* dst, const void* src, size_t bytes, Stream stream) {
  requireAvailable();
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
        "cudaMemcpyAsync");
}

void copy(void* dst, const void* src, size_t bytes) {
  requireAvailable();
  if (bytes == 0) return;
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy");
  // From pageable host memory cudaMemcpy returns once the bytes are staged, before the DMA
  // lands; work on a non-blocking stream (createStream) would not wait for it. "Synchronous"
  // here means the data is at dst when this returns.
  check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize");
}

void memsetAsync(void* dst, int value, size_t bytes, Stream stream) {
  requireAvailable();
  if (bytes == 0) return;
  check(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream)), "cudaMemsetAsync");
}

}  // namespace railshard::kernels::cuda
