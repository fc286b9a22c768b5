#include "plugins/nccl/rdma_rails.h"

#include <cstdlib>
#include <mutex>

#include "base/error.h"
#include "base/logging.h"
#include "launcher/discovery/sysfs_files.h"
#include "transport/links/ibverbs/hca_discovery.h"
#include "transport/links/ibverbs/rdma_driver.h"
#include "transport/links/ibverbs/rdma_lane.h"
#include "transport/links/ibverbs/verbs_api.h"

namespace railshard::plugins::nccl {
namespace {

namespace ibverbs = transport::links::ibverbs;
namespace discovery = launcher::discovery;

// The ports findRdmaRails() found, by Rail::rdma_port (found once per process, at init).
std::mutex& portsMutex() {
  static std::mutex mutex;
  return mutex;
}
std::vector<ibverbs::HcaPort>& ports() {
  static std::vector<ibverbs::HcaPort> found;
  return found;
}

// "0002:c903:00fa:1234" (sysfs node_guid) -> its 64 bits; 0 when unreadable.
uint64_t nodeGuid(const std::string& device) {
  const auto text = discovery::readLine("/sys/class/infiniband/" + device + "/node_guid");
  if (!text) return 0;
  uint64_t guid = 0;
  for (char c : *text) {
    if (c == ':') continue;
    const std::string digit(1, c);
    guid = (guid << 4) | (std::strtoull(digit.c_str(), nullptr, 16) & 0xf);
  }
  return guid;
}

}  // namespace

std::vector<Rail> findRdmaRails(const RdmaConfig& config) {
  std::vector<Rail> rails;
  const ibverbs::VerbsApi* api = ibverbs::VerbsApi::get();
  if (api == nullptr) {
    RS_LOG_INFO("NCCL plugin: no RDMA rail: {}", ibverbs::VerbsApi::unavailableReason());
    return rails;
  }
  const ibverbs::HcaScan found = ibverbs::scanHcas(*api, config.hca, config.gid_index);
  for (const auto& skipped : found.skipped) RS_LOG_INFO("NCCL plugin: RDMA: skipped {}", skipped);
  if (found.ports.empty()) {
    RS_LOG_INFO("NCCL plugin: no RDMA rail: {}", found.why_none);
    return rails;
  }
  std::lock_guard<std::mutex> lock(portsMutex());
  for (const auto& port : found.ports) {
    Rail rail;
    rail.name = port.device + ":" + std::to_string(port.port);
    rail.gbps = port.gbps;
    rail.rdma = true;
    rail.layer = port.infiniband ? 'I' : 'E';
    const std::string dir = "/sys/class/infiniband/" + port.device + "/device";
    if (discovery::pathExists(dir)) rail.pci_path = discovery::resolvePath(dir);
    rail.guid = nodeGuid(port.device);
    rail.rdma_port = static_cast<int>(ports().size());
    ports().push_back(port);
    rails.push_back(std::move(rail));
  }
  return rails;
}

const transport::CudaDriver* gpuDirectDriver(std::string& why) {
  const transport::CudaDriver* cuda = transport::CudaDriver::get();
  if (cuda == nullptr) why = transport::CudaDriver::unavailableReason();
  return cuda;
}

void forgetDeviceMemory(transport::links::Driver& rdma, const void* addr, size_t bytes) {
  // addRdmaLanes made it: an RDMA driver.
  static_cast<ibverbs::RdmaDriver&>(rdma).forgetDeviceMemory(addr, bytes);
}

std::unique_ptr<transport::links::Driver> addRdmaLanes(
    transport::messaging::Messenger& messenger, const std::vector<Rail>& rails,
    const std::string& their_layers, const RdmaConfig& config, int rank,
    transport::messaging::FailureState& failure) {
  std::vector<ibverbs::HcaPort> mine;
  {
    std::lock_guard<std::mutex> lock(portsMutex());
    for (const Rail& rail : rails) {
      if (rail.rdma) mine.push_back(ports().at(static_cast<size_t>(rail.rdma_port)));
    }
  }
  if (mine.empty() || their_layers.empty()) return nullptr;
  ibverbs::RdmaDriver::Options options;
  options.rank = rank;
  options.rdma = config;
  options.failure = &failure;
  auto driver = std::make_unique<ibverbs::RdmaDriver>(*ibverbs::VerbsApi::get(), options, mine);
  std::vector<std::unique_ptr<ibverbs::RdmaLane>> lanes;
  try {
    lanes = driver->makeLanes(1 - rank, their_layers);
  } catch (const ConfigError& e) {
    // Rails of different link layers (InfiniBand here, RoCE there): TCP alone, said once.
    RS_LOG_WARN("NCCL plugin: no RDMA lane with the peer: {}", e.what());
    return nullptr;
  }
  for (auto& lane : lanes) messenger.addLink(std::move(lane), true, false);
  return driver;
}

}  // namespace railshard::plugins::nccl
