// Built instead of rdma_rails.cc when infiniband/verbs.h was not found at build time: the
// plugin then offers TCP rails only, and says why once.
#include "base/logging.h"
#include "plugins/nccl/rdma_rails.h"

namespace railshard::plugins::nccl {

std::vector<Rail> findRdmaRails(const RdmaConfig&) {
  RS_LOG_INFO(
      "NCCL plugin: no RDMA rail: built without infiniband/verbs.h (apt-get install "
      "libibverbs-dev and rebuild)");
  return {};
}

std::unique_ptr<transport::links::Driver> addRdmaLanes(transport::messaging::Messenger&,
                                                       const std::vector<Rail>&, const std::string&,
                                                       const RdmaConfig&, int,
                                                       transport::messaging::FailureState&) {
  return nullptr;
}

const transport::CudaDriver* gpuDirectDriver(std::string& why) {
  why = "built without infiniband/verbs.h: no RDMA rail to take GPU memory";
  return nullptr;
}

void forgetDeviceMemory(transport::links::Driver&, const void*, size_t) {}

}  // namespace railshard::plugins::nccl
