#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace railshard::transport {

// The few CUDA driver API calls GPUDirect RDMA needs, loaded with dlopen("libcuda.so.1") so
// that neither the build nor the run needs CUDA. Types and constants are spelled out here
// (values from cuda.h, stable across CUDA 11-13) instead of including cuda.h.
//
// NEVER RUN ON A GPU: this machine has none; docs/rdma.md.
class CudaDriver {
 public:
  // The driver, or null when libcuda.so.1 cannot be loaded (no NVIDIA driver) or lacks a
  // symbol; unavailableReason() says which.
  static const CudaDriver* get();
  static std::string unavailableReason();

  // Whether `ptr` is CUDA device memory (cuPointerGetAttribute MEMORY_TYPE). Host memory,
  // and any pointer the driver does not know, is not.
  bool isDeviceMemory(const void* ptr) const;
  // A dmabuf file descriptor exporting [ptr, ptr + bytes) (cuMemGetHandleForAddressRange;
  // ptr and bytes must be host-page aligned), or -1 with `why` set.
  int exportDmabuf(const void* ptr, size_t bytes, std::string& why) const;
  // Copies between host and device memory on the pointer's own context (pushed and popped
  // around the copy, so any thread may call). False with `why` on a driver error.
  bool copyToDevice(void* device, const void* host, size_t bytes, std::string& why) const;
  bool copyToHost(void* host, const void* device, size_t bytes, std::string& why) const;

  // The driver's functions, as loaded (public for the table's initialiser).
  using Result = int;  // CUresult; 0 = CUDA_SUCCESS
  Result (*pointer_get_attribute)(void* data, int attribute, uint64_t ptr) = nullptr;
  Result (*mem_get_handle_for_address_range)(void* handle, uint64_t ptr, size_t size, int type,
                                             unsigned long long flags) = nullptr;
  Result (*memcpy_htod)(uint64_t dst, const void* src, size_t bytes) = nullptr;
  Result (*memcpy_dtoh)(void* dst, uint64_t src, size_t bytes) = nullptr;
  Result (*ctx_push_current)(void* context) = nullptr;
  Result (*ctx_pop_current)(void** context) = nullptr;
  Result (*get_error_string)(Result error, const char** text) = nullptr;

 private:
  std::string errorText(Result result) const;
  bool withContextOf(const void* ptr, std::string& why, const auto& body) const;
};

}  // namespace railshard::transport
