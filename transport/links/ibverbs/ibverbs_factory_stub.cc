// Built instead of the RDMA transport when infiniband/verbs.h was not found at build time.
#include "base/error.h"
#include "transport/links/ibverbs/ibverbs_factory.h"

namespace railshard::transport::links::ibverbs {

namespace {
constexpr const char* kWhy =
    "this railshard was built without RDMA support (infiniband/verbs.h was not found; "
    "apt-get install libibverbs-dev and rebuild)";
}

bool compiledIn() {
  return false;
}

std::string unavailableReason(const std::string&) {
  return kWhy;
}

std::string describeRdma(const std::string&, int) {
  return std::string("RDMA: unavailable: ") + kWhy + "\n";
}

std::unique_ptr<RdmaPlan> planRdma(bootstrap::Exchange&, const FactoryOptions& options,
                                   messaging::FailureState&) {
  if (options.mode == Mode::kForced && options.size > 1) {
    throw ConfigError(std::string("RAILSHARD_TRANSPORT=ibverbs, but ") + kWhy);
  }
  return nullptr;
}

}  // namespace railshard::transport::links::ibverbs
