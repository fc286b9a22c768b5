#include "transport/links/ibverbs/device_registration.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace railshard::transport::links::ibverbs {

ibv_mr* registerFirstThatWorks(const std::vector<std::pair<std::string, RegistrationStep>>& steps,
                               std::string& method) {
  std::string reasons;
  for (const auto& [name, step] : steps) {
    std::string why;
    if (ibv_mr* mr = step(why)) {
      method = name;
      return mr;
    }
    reasons += (reasons.empty() ? "" : "; ") + name + ": " + why;
  }
  throw Error("cannot register GPU memory for RDMA (" + reasons + ")");
}

Registration registerDeviceMemory(const VerbsApi& api, const CudaDriver& cuda, ibv_pd* pd,
                                  uintptr_t start, size_t length, std::string& method) {
  // The peer reads nothing and writes nothing here: these MRs are only sources of our writes.
  const int access = IBV_ACCESS_LOCAL_WRITE;
  void* address = reinterpret_cast<void*>(start);
  std::vector<std::pair<std::string, RegistrationStep>> steps;
  steps.emplace_back("dmabuf", [&](std::string& why) -> ibv_mr* {
    if (api.reg_dmabuf_mr == nullptr) {
      why = "libibverbs has no ibv_reg_dmabuf_mr (rdma-core older than 34)";
      return nullptr;
    }
    const int fd = cuda.exportDmabuf(address, length, why);
    if (fd < 0) return nullptr;
    ibv_mr* mr = api.reg_dmabuf_mr(pd, 0, length, start, fd, access);
    const int err = errno;
    ::close(fd);  // the registration holds its own reference to the buffer
    if (mr == nullptr) why = std::string("ibv_reg_dmabuf_mr: ") + std::strerror(err);
    return mr;
  });
  steps.emplace_back("peer memory", [&](std::string& why) -> ibv_mr* {
    ibv_mr* mr = api.reg_mr(pd, address, length, access);
    if (mr == nullptr) {
      why = std::string("ibv_reg_mr of device memory: ") + std::strerror(errno) +
            " (is the nvidia-peermem module loaded?)";
    }
    return mr;
  });
  ibv_mr* mr = registerFirstThatWorks(steps, method);
  Registration registration;
  registration.start = start;
  registration.length = length;
  registration.lkey = mr->lkey;
  registration.rkey = mr->rkey;
  registration.handle = mr;
  return registration;
}

}  // namespace railshard::transport::links::ibverbs
