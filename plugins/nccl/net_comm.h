#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "base/config.h"
#include "plugins/nccl/connection_setup.h"
#include "plugins/nccl/net_api.h"
#include "plugins/nccl/net_devices.h"
#include "transport/messaging/mesh.h"

namespace railshard::plugins::nccl {

// One end of an NCCL connection (NCCL's connections go one way: a send comm on one host, a
// recv comm on the other): the two ends are ranks 1 and 0 of a group of two, with one
// messenger between them over a TCP link per rail — the same messenger the communicator
// uses, plus an RDMA lane per HCA port the two share, so NCCL's traffic is striped by measured
// rate, re-sent exactly on the rails left when one fails, and the rail taken back when it returns.
// Requests are NCCL's: a send of one buffer, a receive of up to maxRecvs buffers told apart by tag,
// each buffer possibly larger than what arrives. How a comm's links are made: the device's RDMA
// rails beside its TCP connections.
struct CommOptions {
  LinkConfig links;
  RdmaConfig rdma;
  std::vector<Rail> rdma_rails;  // the device's, in order (a lane each the peer shares)
  bool tcp_data = true;          // false: its TCP connections carry control only
  // GPU memory may be sent and received (an RDMA-only device where libcuda loads): sends go
  // GPUDirect on the lanes (or staged), receives are copied in from host memory.
  const transport::CudaDriver* cuda = nullptr;
};

class NetComm {
 public:
  // The largest grouped receive (properties.maxRecvs).
  static constexpr int kMaxRecvs = 8;

  NetComm(bool sender, Established established, const CommOptions& options);
  ~NetComm();  // says goodbye behind what is queued; bounded (the mesh's linger)
  NetComm(const NetComm&) = delete;
  NetComm& operator=(const NetComm&) = delete;

  bool sender() const { return sender_; }
  // NCCL's isend/irecv; throw railshard::Error (the plugin's entry points turn it into a
  // result and a log line).
  void* isend(const void* data, size_t size, int tag);
  // `device`: the buffers are GPU memory (NCCL registered them as NCCL_PTR_CUDA).
  void* irecv(int n, void* const* data, const size_t* sizes, const int* tags, bool device);
  // Whether NCCL may hand it GPU memory (CommOptions::cuda).
  bool takesDeviceMemory() const { return takes_device_memory_; }
  // NCCL deregisters [addr, addr + bytes): the lanes forget their GPU registrations of it.
  void forgetDeviceMemory(const void* addr, size_t bytes);
  const std::string& peer() const { return peer_; }
  transport::messaging::Mesh& mesh() { return *mesh_; }

 private:
  bool sender_;
  std::string peer_;
  std::unique_ptr<transport::messaging::Mesh> mesh_;
  bool takes_device_memory_ = false;
  transport::links::Driver* rdma_ = nullptr;  // the mesh's RDMA driver, if any
};

// test(): whether the request is done, and (done) the bytes of each of its buffers; the
// request is gone once done. Throws the comm's failure (a lost peer: every rail gone).
bool testRequest(void* request, int* sizes);

// The tag an NCCL message travels with (the messenger checks it before a byte lands).
transport::MessageTag ncclTag(int tag);

}  // namespace railshard::plugins::nccl
