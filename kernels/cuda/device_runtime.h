#pragma once

// The CUDA runtime calls railshard needs (devices, streams, events, memory, copies), behind a
// header without CUDA types so that every layer above compiles the same with or without CUDA.
// With CUDA compiled in (RAILSHARD_HAVE_CUDA) the functions call the CUDA runtime, linked
// statically (cudart_static: it opens libcuda.so.1 itself, so librailshard.so loads on a
// machine without an NVIDIA driver and reports "no device" there). Without CUDA, available()
// is false and every other call raises ConfigError naming the reason.
//
// Errors from the runtime raise railshard::Error with the call, the CUDA error name and text
// ("cudaMemcpyAsync failed: cudaErrorInvalidValue (invalid argument)").
#include <cstddef>
#include <string>

namespace railshard::kernels::cuda {

using Stream = void*;  // cudaStream_t; nullptr = the legacy default stream
using Event = void*;   // cudaEvent_t

// True when this build has the CUDA code (nvcc was found at configure time).
bool compiledIn();
// True when CUDA is compiled in and at least one device is usable (checked once).
bool available();
// Why available() is false ("built without CUDA: ...", "no CUDA device: cudaErrorNoDevice
// (no CUDA-capable device is detected)", "no NVIDIA driver: ..."); empty when available.
std::string unavailableReason();
// Number of usable devices; 0 when unavailable.
int deviceCount();

// Where a pointer's memory lives. Never throws: any pointer CUDA does not know (or every
// pointer when unavailable) is kHost. Managed memory is kDevice (kernels can touch it).
enum class PointerKind { kHost, kDevice };
PointerKind pointerKind(const void* ptr);
// The device a device pointer belongs to; -1 for host memory.
int pointerDevice(const void* ptr);

int currentDevice();
void setDevice(int device);
// "NVIDIA H200 (sm_90, 139.8 GiB)"
std::string deviceName(int device);
// "0000:19:00.0": the same GPU in every process, whatever CUDA_VISIBLE_DEVICES numbers it.
std::string pciBusId(int device);

Stream createStream();  // non-blocking w.r.t. the legacy default stream
void destroyStream(Stream stream);
void synchronizeStream(Stream stream);

Event createEvent();  // timing disabled
void destroyEvent(Event event);
void recordEvent(Event event, Stream stream);
// Later work on `stream` waits for `event` (no host wait).
void streamWaitEvent(Stream stream, Event event);
// True once the work before the event's last record is done (cudaEventQuery).
bool eventDone(Event event);

void* allocateDevice(size_t bytes);  // cudaMalloc; nullptr for 0 bytes
void freeDevice(void* ptr);
void* allocatePinned(size_t bytes);  // cudaMallocHost (page-locked host memory)
void freePinned(void* ptr);

// Copies in any direction (cudaMemcpyDefault: unified addressing tells host from device).
void copyAsync(void* dst, const void* src, size_t bytes, Stream stream);
// Synchronous copy (the bytes are at dst on return, also from pageable host memory, so work
// on any stream may use them), for tests, benchmarks and set-up.
void copy(void* dst, const void* src, size_t bytes);
void memsetAsync(void* dst, int value, size_t bytes, Stream stream);

}  // namespace railshard::kernels::cuda
