// libnccl-net-railshard.so: NCCL's network-plugin entry points (net_api.h) over railshard's
// rails. Every entry point catches what the layers below throw: an exception never crosses
// into NCCL; it becomes a result code and a line through NCCL's logger.

#include <spdlog/sinks/base_sink.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "base/logging.h"
#include "plugins/nccl/connection_setup.h"
#include "plugins/nccl/net_api.h"
#include "plugins/nccl/net_comm.h"
#include "plugins/nccl/net_devices.h"
#include "plugins/nccl/rdma_rails.h"

namespace railshard::plugins::nccl {
namespace {

// railshard's log lines, through the logger NCCL handed to init (NCCL_DEBUG decides what
// shows, with NCCL's own prefix).
class NcclSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit NcclSink(Logger logger) : logger_(logger) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& message) override {
    const LogLevel level = message.level >= spdlog::level::warn   ? LogLevel::kWarn
                           : message.level >= spdlog::level::info ? LogLevel::kInfo
                                                                  : LogLevel::kTrace;
    const std::string text(message.payload.data(), message.payload.size());
    logger_(level, kLogNet, "railshard", 0, "railshard: %s", text.c_str());
  }
  void flush_() override {}

 private:
  Logger logger_;
};

// What the plugin knows once init ran: the rails and the devices over them.
struct Plugin {
  std::mutex mutex;
  bool ready = false;
  Logger logger = nullptr;
  std::vector<Rail> rails;
  // A deque: makeVDevice appends while other threads hold a device (stable addresses).
  std::deque<NetDevice> devices;
  LinkConfig links;
  RdmaConfig rdma;
  // Where RDMA-only devices take GPU memory (ptrSupport CUDA|DMABUF); null: host memory only.
  const transport::CudaDriver* cuda = nullptr;
  Duration connect_timeout = std::chrono::seconds(60);
};

Plugin& plugin() {
  static Plugin instance;
  return instance;
}

void warn(const std::string& text) {
  Logger logger = plugin().logger;
  if (logger != nullptr)
    logger(LogLevel::kWarn, kLogNet, "railshard", 0, "railshard: %s", text.c_str());
}

// Runs `body`, turning what it throws into NCCL's result: a lost peer or a broken network is
// a system error, bad configuration invalid usage, anything else internal.
template <typename Body>
Result guarded(const char* what, Body&& body) {
  try {
    return body();
  } catch (const ConfigError& e) {
    warn(std::string(what) + ": " + e.what());
    return Result::kInvalidUsage;
  } catch (const InvalidArgument& e) {
    warn(std::string(what) + ": " + e.what());
    return Result::kInternalError;
  } catch (const Error& e) {
    warn(std::string(what) + ": " + e.what());
    return Result::kSystemError;
  } catch (const std::exception& e) {
    warn(std::string(what) + ": " + e.what());
    return Result::kInternalError;
  }
}

const NetDevice* deviceAt(int dev) {
  const auto& devices = plugin().devices;
  if (dev < 0 || dev >= static_cast<int>(devices.size())) return nullptr;
  return &devices[static_cast<size_t>(dev)];
}

Result init(Logger logger) {
  Plugin& p = plugin();
  std::lock_guard<std::mutex> lock(p.mutex);
  if (p.ready) return Result::kSuccess;
  p.logger = logger;
  return guarded("init", [&] {
    const Config config = Config::fromEnvironment();
    if (logger != nullptr) {
      auto& l = log::logger();
      l.sinks().clear();
      l.sinks().push_back(std::make_shared<NcclSink>(logger));
      // NCCL_DEBUG decides what shows; RAILSHARD_LOG_LEVEL=debug adds railshard's debug lines
      // (at NCCL's TRACE level).
      const char* level = std::getenv("RAILSHARD_LOG_LEVEL");
      l.set_level(level != nullptr && spdlog::level::from_str(level) < spdlog::level::info
                      ? spdlog::level::from_str(level)
                      : spdlog::level::info);
    }
    p.links = config.links;
    p.rdma = config.rdma;
    // Staged through the lanes' registered rings: NCCL's buffers are not registered with the
    // HCA (ptrSupport HOST; GPUDirect is not built yet, docs/nccl-plugin.md).
    p.rdma.rendezvous_auto = false;
    p.rdma.rendezvous_bytes = 0;
    p.connect_timeout = config.connect_timeout;
    const DeviceOptions options = deviceOptionsFromEnvironment();
    p.rails = findRails(options);
    if (p.rails.empty()) {
      // NCCL then falls back to its own transports; say why.
      warn("no rail: no up IPv4 interface matches RAILSHARD_NCCL_RAILS='" + options.interfaces +
           "'");
      return Result::kSystemError;
    }
    if (static_cast<int>(p.rails.size()) > ListenHandle::kMaxRails)
      p.rails.resize(ListenHandle::kMaxRails);
    if (options.rdma) {
      std::vector<Rail> rdma = findRdmaRails(p.rdma);
      if (static_cast<int>(rdma.size()) > ListenHandle::kMaxRails)
        rdma.resize(ListenHandle::kMaxRails);
      p.rails.insert(p.rails.end(), rdma.begin(), rdma.end());
      if (!rdma.empty()) {
        std::string why;
        p.cuda = gpuDirectDriver(why);
        RS_LOG_INFO("NCCL plugin: GPU memory on the RDMA-only devices: {}",
                    p.cuda != nullptr ? "yes (GPUDirect RDMA where the HCA registers it, "
                                        "else staged; never run on a GPU)"
                                      : "no: " + why);
      }
    }
    const std::vector<NetDevice> made = makeDevices(p.rails, options.set);
    p.devices.assign(made.begin(), made.end());
    std::string names;
    for (const auto& d : p.devices) names += (names.empty() ? "" : ", ") + d.name;
    if (logger != nullptr) {
      logger(LogLevel::kInfo, kLogInit | kLogNet, "railshard", 0, "railshard: devices %s",
             names.c_str());
    }
    p.ready = true;
    return Result::kSuccess;
  });
}

Result devices(int* ndev) {
  *ndev = static_cast<int>(plugin().devices.size());
  return Result::kSuccess;
}

void fillProperties(int dev, const NetDevice& device, PropertiesV10& props) {
  const auto& rails = plugin().rails;
  std::memset(&props, 0, sizeof(props));
  props.name = const_cast<char*>(device.name.c_str());
  const Rail& first = rails[static_cast<size_t>(device.rails.front())];
  props.pci_path = first.pci_path.empty() ? nullptr : const_cast<char*>(first.pci_path.c_str());
  double gbps = 0;
  uint64_t guid = 0;
  for (int r : device.rails) {
    if (!device.tcp_data && !rails[static_cast<size_t>(r)].rdma) continue;  // control only
    gbps += rails[static_cast<size_t>(r)].gbps;
    guid = guid * 31 + rails[static_cast<size_t>(r)].guid;
  }
  props.guid = device.fused ? (guid | (uint64_t{1} << 63)) : guid;
  props.ptr_support = kPtrHost;
  // GPU memory only where every data link is an RDMA lane: a TCP rail would copy each piece
  // to host memory on NCCL's proxy thread, which NCCL's own staging does better.
  if (!device.tcp_data && plugin().cuda != nullptr) props.ptr_support |= kPtrCuda | kPtrDmaBuf;
  props.speed = gbps > 0 ? static_cast<int>(gbps * 1000) : 10000;  // Mbit/s
  props.port = 1;
  props.latency = 0;  // NCCL's default
  props.max_comms = 65536;
  props.max_recvs = NetComm::kMaxRecvs;
  if (device.members.empty()) {
    props.vprops.ndevs = 1;
    props.vprops.devs[0] = dev;
  } else {
    props.vprops.ndevs = static_cast<int>(device.members.size());
    for (size_t i = 0; i < device.members.size(); ++i) props.vprops.devs[i] = device.members[i];
  }
  props.max_p2p_bytes = size_t{1} << 30;
  props.max_coll_bytes = size_t{1} << 30;
}

Result getPropertiesV10(int dev, PropertiesV10* props) {
  const NetDevice* device = deviceAt(dev);
  if (device == nullptr) return Result::kInternalError;
  fillProperties(dev, *device, *props);
  return Result::kSuccess;
}

Result getPropertiesV11(int dev, PropertiesV11* props) {
  const NetDevice* device = deviceAt(dev);
  if (device == nullptr) return Result::kInternalError;
  fillProperties(dev, *device, props->base);
  props->max_multi_request_size = 1;
  return Result::kSuccess;
}

Result getPropertiesV8(int dev, PropertiesV8* props) {
  PropertiesV10 v10;
  if (Result r = getPropertiesV10(dev, &v10); r != Result::kSuccess) return r;
  std::memset(props, 0, sizeof(*props));
  props->name = v10.name;
  props->pci_path = v10.pci_path;
  props->guid = v10.guid;
  props->ptr_support = v10.ptr_support;
  props->speed = v10.speed;
  props->port = v10.port;
  props->latency = v10.latency;
  props->max_comms = v10.max_comms;
  props->max_recvs = v10.max_recvs;
  return Result::kSuccess;
}

// A listen comm: the acceptor of the device's rails.
struct ListenComm {
  std::unique_ptr<Acceptor> acceptor;
  int dev = 0;
};

// How a comm on `device` makes its links.
CommOptions commOptions(const NetDevice& device) {
  CommOptions options;
  options.links = plugin().links;
  options.rdma = plugin().rdma;
  options.tcp_data = device.tcp_data;
  options.cuda = device.tcp_data ? nullptr : plugin().cuda;
  for (int r : device.rails) {
    const Rail& rail = plugin().rails[static_cast<size_t>(r)];
    if (rail.rdma) options.rdma_rails.push_back(rail);
  }
  return options;
}

// A connect in progress lives in the handle's local tail between NCCL's retries.
Result listen(int dev, void* handle, void** listen_comm) {
  *listen_comm = nullptr;
  return guarded("listen", [&] {
    const NetDevice* device = deviceAt(dev);
    if (device == nullptr) throw InvalidArgument("listen on device " + std::to_string(dev));
    auto comm = std::make_unique<ListenComm>();
    comm->dev = dev;
    comm->acceptor =
        std::make_unique<Acceptor>(plugin().rails, device->rails, std::chrono::seconds(5));
    std::memcpy(handle, &comm->acceptor->handle(), sizeof(ListenHandle));
    *listen_comm = comm.release();
    return Result::kSuccess;
  });
}

Result connect(int dev, void* handle, void** send_comm, DeviceHandle** /*send_dev_comm*/) {
  *send_comm = nullptr;
  auto* h = static_cast<ListenHandle*>(handle);
  return guarded("connect", [&] {
    const NetDevice* device = deviceAt(dev);
    if (device == nullptr) throw InvalidArgument("connect on device " + std::to_string(dev));
    if (h->pending == nullptr) {
      if (std::string why = checkHandle(*h); !why.empty()) {
        // Stale or corrupt (or another plugin's): refused, nothing dialled.
        warn("connect: the handle cannot be used: " + why);
        return Result::kInvalidUsage;
      }
      std::vector<Rail> rails;
      for (int r : device->rails) rails.push_back(plugin().rails[static_cast<size_t>(r)]);
      h->pending = new PendingConnect(*h, rails, plugin().connect_timeout);
    }
    auto* pending = static_cast<PendingConnect*>(h->pending);
    bool done = false;
    try {
      done = pending->progress();
    } catch (...) {
      delete pending;
      h->pending = nullptr;
      throw;
    }
    if (!done) return Result::kSuccess;  // NULL comm: NCCL calls again
    Established established = pending->take();
    delete pending;
    h->pending = nullptr;
    *send_comm = new NetComm(true, std::move(established), commOptions(*device));
    return Result::kSuccess;
  });
}

Result accept(void* listen_comm, void** recv_comm, DeviceHandle** /*recv_dev_comm*/) {
  *recv_comm = nullptr;
  return guarded("accept", [&] {
    auto* comm = static_cast<ListenComm*>(listen_comm);
    std::optional<Established> established = comm->acceptor->progress();
    if (established) {
      *recv_comm = new NetComm(false, std::move(*established), commOptions(*deviceAt(comm->dev)));
    }
    return Result::kSuccess;
  });
}

// NCCL merging devices (NCCL_NET_MERGE_LEVEL, v9 on): one device over the union of their
// rails, striped by measured rate as the fused device is (not NCCL's even split). Its TCP
// rails carry data when any member's did.
Result makeVDevice(int* dev, VirtualDeviceProps* props) {
  return guarded("makeVDevice", [&] {
    Plugin& p = plugin();
    std::lock_guard<std::mutex> lock(p.mutex);
    if (props == nullptr || props->ndevs < 1 || props->ndevs > kMaxDevsPerNic) {
      throw InvalidArgument("a virtual device of " +
                            std::to_string(props == nullptr ? 0 : props->ndevs) +
                            " devices (1 to " + std::to_string(kMaxDevsPerNic) + ")");
    }
    NetDevice merged;
    merged.fused = true;
    merged.tcp_data = false;
    std::set<int> rails;
    std::string names;
    for (int i = 0; i < props->ndevs; ++i) {
      const NetDevice* member = deviceAt(props->devs[i]);
      if (member == nullptr || !member->members.empty()) {
        throw InvalidArgument("a virtual device over device " + std::to_string(props->devs[i]) +
                              " (not a device of this plugin, or virtual itself)");
      }
      rails.insert(member->rails.begin(), member->rails.end());
      merged.tcp_data = merged.tcp_data || member->tcp_data;
      merged.members.push_back(props->devs[i]);
      if (!names.empty()) names += '+';
      names += member->name.substr(member->name.find('-') + 1);  // "railshard-lo": "lo"
    }
    merged.rails.assign(rails.begin(), rails.end());
    merged.name = "railshard-vdev(" + names + ")";
    p.devices.push_back(std::move(merged));
    *dev = static_cast<int>(p.devices.size()) - 1;
    RS_LOG_INFO("NCCL plugin: device {} is {}", *dev, p.devices.back().name);
    return Result::kSuccess;
  });
}

// What regMr hands NCCL: the memory's kind and range. Host memory needs no registration (the
// links copy it, or register it themselves); GPU memory is registered by the lanes on first
// use (RegistrationCache), and deregMr makes them forget it: NCCL frees it after.
struct MemoryHandle {
  int type = kPtrHost;
  const void* data = nullptr;
  size_t size = 0;
};

Result registerMemory(void* comm, void* data, size_t size, int type, void** mhandle) {
  *mhandle = nullptr;
  return guarded("regMr", [&] {
    auto* c = static_cast<NetComm*>(comm);
    if (type == kPtrCuda && !c->takesDeviceMemory()) {
      throw InvalidArgument(
          "GPU memory (NCCL_PTR_CUDA) on a device with TCP rails or without libcuda: its "
          "ptrSupport is NCCL_PTR_HOST");
    }
    if (type != kPtrHost && type != kPtrCuda) {
      throw InvalidArgument("memory of type " + std::to_string(type) +
                            " (NCCL_PTR_HOST or NCCL_PTR_CUDA)");
    }
    *mhandle = new MemoryHandle{type, data, size};
    return Result::kSuccess;
  });
}

Result regMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  return registerMemory(comm, data, size, type, mhandle);
}

// NCCL's dmabuf of the range is not kept: the lanes export their own of what they register
// (cuMemGetHandleForAddressRange, docs/rdma.md).
Result regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t, int, void** mhandle) {
  return registerMemory(comm, data, size, type, mhandle);
}

Result deregMr(void* comm, void* mhandle) {
  return guarded("deregMr", [&] {
    std::unique_ptr<MemoryHandle> handle(static_cast<MemoryHandle*>(mhandle));
    if (handle && handle->type == kPtrCuda) {
      static_cast<NetComm*>(comm)->forgetDeviceMemory(handle->data, handle->size);
    }
    return Result::kSuccess;
  });
}

// Whether a receive's buffers are GPU memory, by their handles.
bool deviceBuffers(void** mhandles) {
  return mhandles != nullptr && mhandles[0] != nullptr &&
         static_cast<const MemoryHandle*>(mhandles[0])->type == kPtrCuda;
}

Result isendSized(void* send_comm, void* data, size_t size, int tag, void** request) {
  *request = nullptr;
  return guarded("isend", [&] {
    *request = static_cast<NetComm*>(send_comm)->isend(data, size, tag);
    return Result::kSuccess;
  });
}

Result irecvSized(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                  void** request) {
  *request = nullptr;
  return guarded("irecv", [&] {
    *request =
        static_cast<NetComm*>(recv_comm)->irecv(n, data, sizes, tags, deviceBuffers(mhandles));
    return Result::kSuccess;
  });
}

// Nothing to flush: a receive into GPU memory is copied in from host memory (cuMemcpyHtoD,
// which returns once the copy is done) before test() reports it done; none lands by RDMA.
Result iflush(void*, int, void**, int*, void**, void** request) {
  *request = nullptr;
  return Result::kSuccess;
}

Result test(void* request, int* done, int* sizes) {
  *done = 0;
  return guarded("test", [&] {
    *done = testRequest(request, sizes) ? 1 : 0;
    return Result::kSuccess;
  });
}

Result closeComm(void* comm) {
  return guarded("close", [&] {
    delete static_cast<NetComm*>(comm);
    return Result::kSuccess;
  });
}

Result closeListen(void* listen_comm) {
  delete static_cast<ListenComm*>(listen_comm);
  return Result::kSuccess;
}

// --- the versions NCCL looks for ---

Result isendV8(void* c, void* data, int size, int tag, void*, void** request) {
  return isendSized(c, data, static_cast<size_t>(size), tag, request);
}
Result irecvV8(void* c, int n, void** data, int* sizes, int* tags, void** mhandles,
               void** request) {
  if (n < 1 || n > NetComm::kMaxRecvs) return Result::kInternalError;
  size_t wide[NetComm::kMaxRecvs];
  for (int i = 0; i < n; ++i) wide[i] = static_cast<size_t>(sizes[i]);
  return irecvSized(c, n, data, wide, tags, mhandles, request);
}
Result isendV9(void* c, void* data, size_t size, int tag, void*, void** request) {
  return isendSized(c, data, size, tag, request);
}
Result irecvV9(void* c, int n, void** data, size_t* sizes, int* tags, void** mhandles,
               void** request) {
  return irecvSized(c, n, data, sizes, tags, mhandles, request);
}
Result isendV10(void* c, void* data, size_t size, int tag, void*, void*, void** request) {
  return isendSized(c, data, size, tag, request);
}
Result irecvV10(void* c, int n, void** data, size_t* sizes, int* tags, void** mhandles, void**,
                void** request) {
  return irecvSized(c, n, data, sizes, tags, mhandles, request);
}
Result initV10(Logger logger, ProfilerCallback) {
  return init(logger);
}
Result connectV10(int dev, CommConfig*, void* handle, void** send_comm, DeviceHandle** d) {
  return connect(dev, handle, send_comm, d);
}
Result initV11(void** ctx, uint64_t, CommConfig*, Logger logger, ProfilerCallback) {
  *ctx = &plugin();  // one plugin state for every NCCL communicator of the process
  return init(logger);
}
Result listenV11(void*, int dev, void* handle, void** listen_comm) {
  return listen(dev, handle, listen_comm);
}
Result connectV11(void*, int dev, void* handle, void** send_comm, DeviceHandle** d) {
  return connect(dev, handle, send_comm, d);
}
Result finalizeV11(void*) {
  return Result::kSuccess;
}

}  // namespace
}  // namespace railshard::plugins::nccl

namespace rn = railshard::plugins::nccl;

extern "C" {

__attribute__((visibility("default"))) rn::NetV8 ncclNetPlugin_v8 = {
    "railshard", rn::init,  rn::devices,     rn::getPropertiesV8, rn::listen,      rn::connect,
    rn::accept,  rn::regMr, rn::regMrDmaBuf, rn::deregMr,         rn::isendV8,     rn::irecvV8,
    rn::iflush,  rn::test,  rn::closeComm,   rn::closeComm,       rn::closeListen, nullptr,
    nullptr};

__attribute__((visibility("default")))
rn::NetV9 ncclNetPlugin_v9 = {"railshard",     rn::init,    rn::devices,   rn::getPropertiesV10,
                              rn::listen,      rn::connect, rn::accept,    rn::regMr,
                              rn::regMrDmaBuf, rn::deregMr, rn::isendV9,   rn::irecvV9,
                              rn::iflush,      rn::test,    rn::closeComm, rn::closeComm,
                              rn::closeListen, nullptr,     nullptr,       rn::makeVDevice};

__attribute__((visibility("default"))) rn::NetV10 ncclNetPlugin_v10 = {
    "railshard",     rn::initV10,    rn::devices,   rn::getPropertiesV10,
    rn::listen,      rn::connectV10, rn::accept,    rn::regMr,
    rn::regMrDmaBuf, rn::deregMr,    rn::isendV10,  rn::irecvV10,
    rn::iflush,      rn::test,       rn::closeComm, rn::closeComm,
    rn::closeListen, nullptr,        nullptr,       rn::makeVDevice};

__attribute__((visibility("default"))) rn::NetV11 ncclNetPlugin_v11 = {
    "railshard",     rn::initV11,    rn::devices,   rn::getPropertiesV11,
    rn::listenV11,   rn::connectV11, rn::accept,    rn::regMr,
    rn::regMrDmaBuf, rn::deregMr,    rn::isendV10,  rn::irecvV10,
    rn::iflush,      rn::test,       rn::closeComm, rn::closeComm,
    rn::closeListen, nullptr,        nullptr,       rn::makeVDevice,
    rn::finalizeV11, nullptr};

}  // extern "C"
