// Built instead of the RDMA transport when infiniband/verbs.h was not found at build time.
#include "base/error.h"
#include "transport/ibverbs/ibverbs_factory.h"

namespace railshard::transport::ibverbs {

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

std::unique_ptr<Transport> wrapWithIbverbs(Store&, const FactoryOptions& options,
                                           std::unique_ptr<Transport> control) {
  if (options.mode == Mode::kForced && options.size > 1) {
    throw ConfigError(std::string("RAILSHARD_TRANSPORT=ibverbs, but ") + kWhy);
  }
  return control;
}

}  // namespace railshard::transport::ibverbs
