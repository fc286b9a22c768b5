#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "transport/cuda_driver.h"
#include "transport/links/ibverbs/registration_cache.h"
#include "transport/links/ibverbs/verbs_api.h"

namespace railshard::transport::links::ibverbs {

// One way of registering memory: returns the MR, or null with `why` set.
using RegistrationStep = std::function<ibv_mr*(std::string& why)>;

// Tries the steps in order; the first MR wins and its name is `method`. When every step fails,
// Error listing each step's reason ("dmabuf: ...; peer memory: ...").
ibv_mr* registerFirstThatWorks(const std::vector<std::pair<std::string, RegistrationStep>>& steps,
                               std::string& method);

// GPUDirect RDMA registration of device memory [start, start + length) with `pd`:
//  1. dmabuf: cuMemGetHandleForAddressRange exports the range, ibv_reg_dmabuf_mr registers it
//     (Linux >= 5.12, rdma-core >= 34, NVIDIA open kernel modules / driver >= 515);
//  2. peer memory: plain ibv_reg_mr of the device address, which the nvidia-peermem module
//     (formerly nv_peer_mem) makes work.
// Error naming both reasons when neither does; the caller then stages through host memory.
// NEVER RUN ON A GPU (docs/rdma.md).
Registration registerDeviceMemory(const VerbsApi& api, const CudaDriver& cuda, ibv_pd* pd,
                                  uintptr_t start, size_t length, std::string& method);

}  // namespace railshard::transport::links::ibverbs
