#pragma once

// NCCL's network-plugin ABI, declared here from NCCL's documentation (plugins/net/README.md)
// and the layout of its versioned structs as NCCL 2.20 to 2.29 read them — our own
// declarations, so that the plugin builds without NCCL's headers (a CUDA install ships none
// of them). NCCL dlopen()s libnccl-net-<name>.so and looks up the data symbols
// ncclNetPlugin_v11, _v10, _v9, _v8 newest first (2.28/2.29 start at v11, 2.24-2.27 at v9/v10,
// 2.20-2.23 at v8); each is a struct of a name and function pointers in a fixed order. The
// static_asserts below pin every size and offset NCCL depends on (x86-64 / aarch64 LP64).

#include <cstddef>
#include <cstdint>

namespace railshard::plugins::nccl {

// ncclResult_t: a C enum, int-sized.
enum class Result : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,    // a network or OS failure
  kInternalError = 3,  // NCCL misused the API
  kInvalidArgument = 4,
  kInvalidUsage = 5,  // a user or configuration error
  kRemoteError = 6,
  kInProgress = 7,
};

constexpr size_t kHandleBytes = 128;  // NCCL_NET_HANDLE_MAXSIZE
constexpr int kPtrHost = 0x1;         // NCCL_PTR_HOST
constexpr int kPtrCuda = 0x2;         // NCCL_PTR_CUDA
constexpr int kPtrDmaBuf = 0x4;       // NCCL_PTR_DMABUF
constexpr int kMaxRequests = 32;      // NCCL_NET_MAX_REQUESTS: in flight per comm
constexpr int kMaxDevsPerNic = 4;     // NCCL_NET_MAX_DEVS_PER_NIC (vProps)
// irecv may find this in *request on entry (LL protocols, v9 on): it may complete early.
constexpr uintptr_t kOptionalRecvCompletion = 0x1;
constexpr uint64_t kMaxNetSizeBytes = uint64_t{1} << 40;  // the most maxP2pBytes may say

// The logger NCCL hands to init: level (NONE 0, VERSION 1, WARN 2, INFO 3, ABORT 4, TRACE 5),
// subsystem flags (NET = 0x10), file, line, printf format.
enum class LogLevel : int { kNone = 0, kVersion = 1, kWarn = 2, kInfo = 3, kAbort = 4, kTrace = 5 };
constexpr unsigned long kLogNet = 0x10;
constexpr unsigned long kLogInit = 0x1;
using Logger = void (*)(LogLevel level, unsigned long flags, const char* file, int line,
                        const char* format, ...);
// The profiler callback of v10 and v11 (ignored: the plugin records its own trace).
using ProfilerCallback = Result (*)(void** event, int type, void* op, int64_t plugin_id,
                                    void* data);

// ncclNetDeviceHandle: device offload; a host plugin never makes one (type 0 = host).
struct DeviceHandle {
  int type;
  int version;
  void* handle;
  size_t size;
  int needs_proxy_progress;
};

struct VirtualDeviceProps {
  int ndevs;
  int devs[kMaxDevsPerNic];
};

// ncclNetProperties_v8_t.
struct PropertiesV8 {
  char* name;
  char* pci_path;
  uint64_t guid;
  int ptr_support;
  int reg_is_global;
  int speed;  // Mbit/s
  int port;
  float latency;  // microseconds
  int max_comms;
  int max_recvs;
  int net_device_type;
  int net_device_version;
};

// ncclNetProperties_v9_t and _v10_t (one layout): forceFlush between regIsGlobal and speed,
// then the virtual-device list and the largest transfers NCCL may hand over at once.
struct PropertiesV10 {
  char* name;
  char* pci_path;
  uint64_t guid;
  int ptr_support;
  int reg_is_global;
  int force_flush;
  int speed;
  int port;
  float latency;
  int max_comms;
  int max_recvs;
  int net_device_type;
  int net_device_version;
  VirtualDeviceProps vprops;
  size_t max_p2p_bytes;
  size_t max_coll_bytes;
};

// ncclNetProperties_v11_t: v10 and maxMultiRequestSize.
struct PropertiesV11 {
  PropertiesV10 base;
  int max_multi_request_size;
};

// ncclNetCommConfig (v10, v11).
struct CommConfig {
  int traffic_class;
};

// ncclNetAttr_v11_t: hints about the traffic to come (ignored).
struct NetAttr {
  int32_t send[4];
  int32_t recv[4];
  uint32_t op;
  uint32_t algo;
  uint32_t proto;
};

// ncclNet_v8_t.
struct NetV8 {
  const char* name;
  Result (*init)(Logger logger);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, PropertiesV8* props);
  Result (*listen)(int dev, void* handle, void** listen_comm);
  Result (*connect)(int dev, void* handle, void** send_comm, DeviceHandle** send_dev_comm);
  Result (*accept)(void* listen_comm, void** recv_comm, DeviceHandle** recv_dev_comm);
  Result (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  Result (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                        void** mhandle);
  Result (*deregMr)(void* comm, void* mhandle);
  Result (*isend)(void* send_comm, void* data, int size, int tag, void* mhandle, void** request);
  Result (*irecv)(void* recv_comm, int n, void** data, int* sizes, int* tags, void** mhandles,
                  void** request);
  Result (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                   void** request);
  Result (*test)(void* request, int* done, int* sizes);
  Result (*closeSend)(void* send_comm);
  Result (*closeRecv)(void* recv_comm);
  Result (*closeListen)(void* listen_comm);
  Result (*getDeviceMr)(void* comm, void* mhandle, void** device_mhandle);
  Result (*irecvConsumed)(void* recv_comm, int n, void* request);
};

// ncclNet_v9_t: sizes of isend/irecv in size_t (iflush and test keep int), makeVDevice.
struct NetV9 {
  const char* name;
  Result (*init)(Logger logger);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, PropertiesV10* props);
  Result (*listen)(int dev, void* handle, void** listen_comm);
  Result (*connect)(int dev, void* handle, void** send_comm, DeviceHandle** send_dev_comm);
  Result (*accept)(void* listen_comm, void** recv_comm, DeviceHandle** recv_dev_comm);
  Result (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  Result (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                        void** mhandle);
  Result (*deregMr)(void* comm, void* mhandle);
  Result (*isend)(void* send_comm, void* data, size_t size, int tag, void* mhandle, void** request);
  Result (*irecv)(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                  void** request);
  Result (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                   void** request);
  Result (*test)(void* request, int* done, int* sizes);
  Result (*closeSend)(void* send_comm);
  Result (*closeRecv)(void* recv_comm);
  Result (*closeListen)(void* listen_comm);
  Result (*getDeviceMr)(void* comm, void* mhandle, void** device_mhandle);
  Result (*irecvConsumed)(void* recv_comm, int n, void* request);
  Result (*makeVDevice)(int* dev, VirtualDeviceProps* props);
};

// ncclNet_v10_t: init takes the profiler, connect the comm config, isend/irecv profiler
// handles.
struct NetV10 {
  const char* name;
  Result (*init)(Logger logger, ProfilerCallback profiler);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, PropertiesV10* props);
  Result (*listen)(int dev, void* handle, void** listen_comm);
  Result (*connect)(int dev, CommConfig* config, void* handle, void** send_comm,
                    DeviceHandle** send_dev_comm);
  Result (*accept)(void* listen_comm, void** recv_comm, DeviceHandle** recv_dev_comm);
  Result (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  Result (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                        void** mhandle);
  Result (*deregMr)(void* comm, void* mhandle);
  Result (*isend)(void* send_comm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                  void** request);
  Result (*irecv)(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                  void** phandles, void** request);
  Result (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                   void** request);
  Result (*test)(void* request, int* done, int* sizes);
  Result (*closeSend)(void* send_comm);
  Result (*closeRecv)(void* recv_comm);
  Result (*closeListen)(void* listen_comm);
  Result (*getDeviceMr)(void* comm, void* mhandle, void** device_mhandle);
  Result (*irecvConsumed)(void* recv_comm, int n, void* request);
  Result (*makeVDevice)(int* dev, VirtualDeviceProps* props);
};

// ncclNet_v11_t: init once per NCCL communicator with a context of its own (listen and
// connect take it), finalize(ctx) when that communicator ends (always called), setNetAttr.
struct NetV11 {
  const char* name;
  Result (*init)(void** ctx, uint64_t comm_id, CommConfig* config, Logger logger,
                 ProfilerCallback profiler);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, PropertiesV11* props);
  Result (*listen)(void* ctx, int dev, void* handle, void** listen_comm);
  Result (*connect)(void* ctx, int dev, void* handle, void** send_comm,
                    DeviceHandle** send_dev_comm);
  Result (*accept)(void* listen_comm, void** recv_comm, DeviceHandle** recv_dev_comm);
  Result (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  Result (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                        void** mhandle);
  Result (*deregMr)(void* comm, void* mhandle);
  Result (*isend)(void* send_comm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                  void** request);
  Result (*irecv)(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                  void** phandles, void** request);
  Result (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                   void** request);
  Result (*test)(void* request, int* done, int* sizes);
  Result (*closeSend)(void* send_comm);
  Result (*closeRecv)(void* recv_comm);
  Result (*closeListen)(void* listen_comm);
  Result (*getDeviceMr)(void* comm, void* mhandle, void** device_mhandle);
  Result (*irecvConsumed)(void* recv_comm, int n, void* request);
  Result (*makeVDevice)(int* dev, VirtualDeviceProps* props);
  Result (*finalize)(void* ctx);
  Result (*setNetAttr)(void* ctx, NetAttr* attr);
};

// What NCCL reads at fixed offsets (LP64): a wrong field order would be silent corruption.
static_assert(sizeof(Result) == 4);
static_assert(sizeof(PropertiesV8) == 64 && offsetof(PropertiesV8, speed) == 32 &&
              offsetof(PropertiesV8, latency) == 40 &&
              offsetof(PropertiesV8, net_device_version) == 56);
static_assert(sizeof(PropertiesV10) == 104 && offsetof(PropertiesV10, force_flush) == 32 &&
              offsetof(PropertiesV10, speed) == 36 && offsetof(PropertiesV10, vprops) == 64 &&
              offsetof(PropertiesV10, max_p2p_bytes) == 88 &&
              offsetof(PropertiesV10, max_coll_bytes) == 96);
static_assert(sizeof(PropertiesV11) == 112 &&
              offsetof(PropertiesV11, max_multi_request_size) == 104);
static_assert(sizeof(DeviceHandle) == 32 && sizeof(VirtualDeviceProps) == 20);
static_assert(sizeof(NetAttr) == 44);
static_assert(sizeof(NetV8) == 19 * sizeof(void*) && sizeof(NetV9) == 20 * sizeof(void*) &&
              sizeof(NetV10) == 20 * sizeof(void*) && sizeof(NetV11) == 22 * sizeof(void*));

}  // namespace railshard::plugins::nccl
