#include "launcher/discovery/nvml_scan.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>

#include "base/logging.h"

#if defined(RAILSHARD_HAVE_CUDA) && __has_include(<nvml.h>)
#include <nvml.h>
#define RAILSHARD_NVML_TYPES 1
#endif

namespace railshard::launcher::discovery {

std::string normalizePciBusId(const std::string& text) {
  unsigned domain = 0, bus = 0, device = 0, function = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%x:%x:%x.%x%c", &domain, &bus, &device, &function, &tail) != 4 ||
      domain > 0xffff || bus > 0xff || device > 0x1f || function > 7) {
    return "";
  }
  char out[16];
  std::snprintf(out, sizeof(out), "%04x:%02x:%02x.%x", domain, bus, device, function);
  return out;
}

std::vector<NvLinkPair> nvlinkPairs(const std::vector<NvmlGpu>& gpus) {
  std::map<std::string, const NvmlGpu*> by_bus;
  for (const auto& gpu : gpus) by_bus[gpu.bus_id] = &gpu;

  std::map<std::pair<std::string, std::string>, int> lanes;
  // switch bus id -> GPU bus id -> links from that GPU into the switch
  std::map<std::string, std::map<std::string, int>> switches;
  for (const auto& gpu : gpus) {
    for (const auto& [remote, count] : gpu.nvlinks) {
      if (remote == gpu.bus_id) continue;
      if (by_bus.count(remote) != 0) {
        // Both ends report the same links; keep the larger view once per pair.
        const auto key = std::minmax(gpu.bus_id, remote);
        int& n = lanes[{key.first, key.second}];
        n = std::max(n, count);
      } else {
        switches[remote][gpu.bus_id] += count;
      }
    }
  }
  std::map<std::pair<std::string, std::string>, int> switched;
  for (const auto& [sw, members] : switches) {
    if (members.size() < 2) continue;  // an end only one GPU reaches is not a switch we use
    for (auto x = members.begin(); x != members.end(); ++x) {
      for (auto y = std::next(x); y != members.end(); ++y) {
        switched[{x->first, y->first}] += std::min(x->second, y->second);
      }
    }
  }
  for (const auto& [key, n] : switched) lanes[key] += n;

  std::vector<NvLinkPair> result;
  for (const auto& [key, n] : lanes) {
    if (n <= 0) continue;
    const double speed_a = by_bus.at(key.first)->nvlink_gbps;
    const double speed_b = by_bus.at(key.second)->nvlink_gbps;
    double speed = kAssumedNvLinkGbps;
    if (speed_a > 0 && speed_b > 0) {
      speed = std::min(speed_a, speed_b);
    } else if (speed_a > 0 || speed_b > 0) {
      speed = std::max(speed_a, speed_b);
    }
    result.push_back({key.first, key.second, n, speed});
  }
  return result;
}

#if defined(RAILSHARD_NVML_TYPES)

// UNTESTED here: the development machines have no NVIDIA driver, so this path has only been
// compiled against nvml.h, never run. Every call is checked; any failure drops that piece of
// information (and is logged), never the whole discovery.
namespace {

// The NVML entry points, looked up by name in a dlopen'ed library.
struct NvmlApi {
  void* library = nullptr;
  decltype(&nvmlInit_v2) init = nullptr;
  decltype(&nvmlShutdown) shutdown = nullptr;
  decltype(&nvmlDeviceGetCount_v2) getCount = nullptr;
  decltype(&nvmlDeviceGetHandleByIndex_v2) getHandle = nullptr;
  decltype(&nvmlDeviceGetName) getName = nullptr;
  decltype(&nvmlDeviceGetPciInfo_v3) getPciInfo = nullptr;
  decltype(&nvmlDeviceGetMemoryInfo) getMemoryInfo = nullptr;
  decltype(&nvmlDeviceGetNvLinkState) getNvLinkState = nullptr;
  decltype(&nvmlDeviceGetNvLinkRemotePciInfo_v2) getNvLinkRemotePciInfo = nullptr;
  decltype(&nvmlDeviceGetFieldValues) getFieldValues = nullptr;  // optional

  ~NvmlApi() {
    if (library != nullptr) ::dlclose(library);
  }

  template <typename F>
  bool bind(F& function, const char* symbol) {
    function = reinterpret_cast<F>(::dlsym(library, symbol));
    if (function == nullptr) RS_LOG_INFO("discovery: NVML lacks {}", symbol);
    return function != nullptr;
  }

  bool load() {
    library = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      RS_LOG_INFO("discovery: NVML not loadable ({}); GPUs from the PCI scan only", ::dlerror());
      return false;
    }
    bool ok = bind(init, "nvmlInit_v2") && bind(shutdown, "nvmlShutdown") &&
              bind(getCount, "nvmlDeviceGetCount_v2") &&
              bind(getHandle, "nvmlDeviceGetHandleByIndex_v2") &&
              bind(getName, "nvmlDeviceGetName") && bind(getPciInfo, "nvmlDeviceGetPciInfo_v3") &&
              bind(getMemoryInfo, "nvmlDeviceGetMemoryInfo") &&
              bind(getNvLinkState, "nvmlDeviceGetNvLinkState") &&
              bind(getNvLinkRemotePciInfo, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
    getFieldValues =
        reinterpret_cast<decltype(getFieldValues)>(::dlsym(library, "nvmlDeviceGetFieldValues"));
    return ok;
  }
};

#if defined(NVML_DEVICE_NAME_V2_BUFFER_SIZE)
constexpr unsigned kNameLength = NVML_DEVICE_NAME_V2_BUFFER_SIZE;
#else
constexpr unsigned kNameLength = 96;
#endif

// Per-link NVLink speed, converted from NVML's MB/s to Gbit/s; 0 when not reported.
double nvlinkSpeed(const NvmlApi& api, nvmlDevice_t device) {
#if defined(NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON)
  if (api.getFieldValues == nullptr) return 0;
  nvmlFieldValue_t value{};
  value.fieldId = NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON;
  if (api.getFieldValues(device, 1, &value) != NVML_SUCCESS || value.nvmlReturn != NVML_SUCCESS) {
    return 0;
  }
  const double mbytes = value.valueType == NVML_VALUE_TYPE_UNSIGNED_INT
                            ? static_cast<double>(value.value.uiVal)
                            : static_cast<double>(value.value.ullVal);
  // Anything outside 1-1000 GB/s per link is not a speed we believe.
  return mbytes >= 1000 && mbytes <= 1e6 ? mbytes * 8 / 1000 : 0;
#else
  (void)api;
  (void)device;
  return 0;
#endif
}

NvmlGpu readGpu(const NvmlApi& api, nvmlDevice_t device) {
  NvmlGpu gpu;
  nvmlPciInfo_t pci{};
  if (api.getPciInfo(device, &pci) == NVML_SUCCESS) gpu.bus_id = normalizePciBusId(pci.busId);
  char name[kNameLength] = {0};
  if (api.getName(device, name, kNameLength) == NVML_SUCCESS) gpu.name = name;
  nvmlMemory_t memory{};
  if (api.getMemoryInfo(device, &memory) == NVML_SUCCESS) gpu.memory_bytes = memory.total;
  for (unsigned link = 0; link < NVML_NVLINK_MAX_LINKS; ++link) {
    nvmlEnableState_t active = NVML_FEATURE_DISABLED;
    // NOT_SUPPORTED / INVALID_ARGUMENT for links this GPU does not have: just skip them.
    if (api.getNvLinkState(device, link, &active) != NVML_SUCCESS) continue;
    if (active != NVML_FEATURE_ENABLED) continue;
    nvmlPciInfo_t remote{};
    if (api.getNvLinkRemotePciInfo(device, link, &remote) != NVML_SUCCESS) continue;
    const std::string remote_bus = normalizePciBusId(remote.busId);
    if (!remote_bus.empty()) ++gpu.nvlinks[remote_bus];
  }
  if (!gpu.nvlinks.empty()) gpu.nvlink_gbps = nvlinkSpeed(api, device);
  return gpu;
}

}  // namespace

std::vector<NvmlGpu> scanNvml() {
  std::vector<NvmlGpu> gpus;
  NvmlApi api;
  if (!api.load()) return gpus;
  const nvmlReturn_t status = api.init();
  if (status != NVML_SUCCESS) {
    RS_LOG_INFO("discovery: nvmlInit_v2 failed (error {}); GPUs from the PCI scan only",
                static_cast<int>(status));
    return gpus;
  }
  unsigned count = 0;
  if (api.getCount(&count) != NVML_SUCCESS) count = 0;
  for (unsigned i = 0; i < count; ++i) {
    nvmlDevice_t device{};
    if (api.getHandle(i, &device) != NVML_SUCCESS) {
      RS_LOG_INFO("discovery: NVML cannot open GPU {} (no permission?); skipped", i);
      continue;
    }
    NvmlGpu gpu = readGpu(api, device);
    if (!gpu.bus_id.empty()) gpus.push_back(std::move(gpu));
  }
  api.shutdown();
  RS_LOG_DEBUG("discovery: NVML reports {} GPU(s)", gpus.size());
  return gpus;
}

#else

std::vector<NvmlGpu> scanNvml() {
  RS_LOG_INFO("discovery: built without nvml.h; GPUs from the PCI scan only, no NVLinks");
  return {};
}

#endif

}  // namespace railshard::launcher::discovery
