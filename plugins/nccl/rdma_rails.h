#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/config.h"
#include "plugins/nccl/net_devices.h"
#include "transport/cuda_driver.h"
#include "transport/links/driver.h"
#include "transport/messaging/failure_state.h"
#include "transport/messaging/messenger.h"

namespace railshard::plugins::nccl {

// The plugin's RDMA rails: the HCA ports the RDMA transport's own discovery finds
// (RAILSHARD_IB_HCA selects them, RAILSHARD_IB_GID_INDEX their GID), offered beside the TCP
// rails. Built without infiniband/verbs.h, or where libibverbs does not load, there are none
// (the reason goes to the log). NEVER RUN ON RDMA HARDWARE: run over the libibverbs
// emulation (tests/nccl_plugin_rdma_test.cc) and Soft-RoCE in the guest (docs/nccl-plugin.md).
std::vector<Rail> findRdmaRails(const RdmaConfig& config);

// Adds to `messenger` a lane per RDMA rail of `rails` the peer shares (`their_layers`), and
// returns the driver that owns them (its thread polls their completions: start it before the
// TCP driver, which delivers the lanes' connection records). Null when the two ends share no
// RDMA rail. The lanes connect by records over the messenger's TCP links, on first use.
std::unique_ptr<transport::links::Driver> addRdmaLanes(transport::messaging::Messenger& messenger,
                                                       const std::vector<Rail>& rails,
                                                       const std::string& their_layers,
                                                       const RdmaConfig& config, int rank,
                                                       transport::messaging::FailureState& failure);

// The CUDA driver, where NCCL may hand an RDMA-only device GPU memory (ptrSupport CUDA|DMABUF:
// the lanes register it with the HCA, ibv_reg_dmabuf_mr or nvidia-peermem, else stage it
// through host memory, docs/rdma.md): libcuda.so.1 loads. Null otherwise, `why` saying why.
// NEVER RUN ON A GPU.
const transport::CudaDriver* gpuDirectDriver(std::string& why);

// Forgets the GPU memory registrations of [addr, addr + bytes) on `rdma` (addRdmaLanes'
// driver), with the lock of the messenger its lanes are in held.
void forgetDeviceMemory(transport::links::Driver& rdma, const void* addr, size_t bytes);

}  // namespace railshard::plugins::nccl
