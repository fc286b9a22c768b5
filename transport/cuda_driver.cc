#include "transport/cuda_driver.h"

#include <dlfcn.h>

namespace railshard::transport {

namespace {

// From cuda.h.
constexpr int kPointerAttributeContext = 1;     // CU_POINTER_ATTRIBUTE_CONTEXT
constexpr int kPointerAttributeMemoryType = 2;  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr unsigned kMemoryTypeDevice = 2;       // CU_MEMORYTYPE_DEVICE
constexpr int kRangeHandleDmabufFd = 1;         // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD

struct Loaded {
  CudaDriver driver;
  bool ok = false;
  std::string reason;
};

template <typename Fn>
bool resolve(void* handle, const char* name, Fn& slot, std::string& reason) {
  slot = reinterpret_cast<Fn>(::dlsym(handle, name));
  if (slot == nullptr) reason = std::string("libcuda.so.1 has no ") + name;
  return slot != nullptr;
}

Loaded load() {
  Loaded l;
  void* handle = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    l.reason = std::string("no CUDA driver: ") + (why != nullptr ? why : "libcuda.so.1");
    return l;
  }
  CudaDriver& d = l.driver;
  // The _v2 entry points are the ones cuda.h's macros name.
  l.ok = resolve(handle, "cuPointerGetAttribute", d.pointer_get_attribute, l.reason) &&
         resolve(handle, "cuMemGetHandleForAddressRange", d.mem_get_handle_for_address_range,
                 l.reason) &&
         resolve(handle, "cuMemcpyHtoD_v2", d.memcpy_htod, l.reason) &&
         resolve(handle, "cuMemcpyDtoH_v2", d.memcpy_dtoh, l.reason) &&
         resolve(handle, "cuCtxPushCurrent_v2", d.ctx_push_current, l.reason) &&
         resolve(handle, "cuCtxPopCurrent_v2", d.ctx_pop_current, l.reason) &&
         resolve(handle, "cuGetErrorString", d.get_error_string, l.reason);
  return l;
}

const Loaded& loaded() {
  static const Loaded instance = load();
  return instance;
}

}  // namespace

const CudaDriver* CudaDriver::get() {
  return loaded().ok ? &loaded().driver : nullptr;
}

std::string CudaDriver::unavailableReason() {
  return loaded().reason;
}

std::string CudaDriver::errorText(Result result) const {
  const char* text = nullptr;
  if (get_error_string != nullptr) get_error_string(result, &text);
  return std::string(text != nullptr ? text : "CUDA error") + " (" + std::to_string(result) + ")";
}

bool CudaDriver::isDeviceMemory(const void* ptr) const {
  unsigned type = 0;
  const Result r =
      pointer_get_attribute(&type, kPointerAttributeMemoryType, reinterpret_cast<uint64_t>(ptr));
  return r == 0 && type == kMemoryTypeDevice;
}

int CudaDriver::exportDmabuf(const void* ptr, size_t bytes, std::string& why) const {
  int fd = -1;
  const Result r = mem_get_handle_for_address_range(&fd, reinterpret_cast<uint64_t>(ptr), bytes,
                                                    kRangeHandleDmabufFd, 0);
  if (r != 0) {
    why = "cuMemGetHandleForAddressRange(DMA_BUF_FD): " + errorText(r);
    return -1;
  }
  return fd;
}

bool CudaDriver::withContextOf(const void* ptr, std::string& why, const auto& body) const {
  void* context = nullptr;
  Result r =
      pointer_get_attribute(&context, kPointerAttributeContext, reinterpret_cast<uint64_t>(ptr));
  if (r != 0 || (r = ctx_push_current(context)) != 0) {
    why = "cannot make the buffer's CUDA context current: " + errorText(r);
    return false;
  }
  r = body();
  void* popped = nullptr;
  ctx_pop_current(&popped);
  if (r != 0) {
    why = errorText(r);
    return false;
  }
  return true;
}

bool CudaDriver::copyToDevice(void* device, const void* host, size_t bytes,
                              std::string& why) const {
  return withContextOf(
      device, why, [&] { return memcpy_htod(reinterpret_cast<uint64_t>(device), host, bytes); });
}

bool CudaDriver::copyToHost(void* host, const void* device, size_t bytes, std::string& why) const {
  return withContextOf(
      device, why, [&] { return memcpy_dtoh(host, reinterpret_cast<uint64_t>(device), bytes); });
}

}  // namespace railshard::transport
