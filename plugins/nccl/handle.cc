#include "plugins/nccl/handle.h"

#include <arpa/inet.h>

namespace railshard::plugins::nccl {

std::string checkHandle(const ListenHandle& handle) {
  if (handle.magic != ListenHandle::kMagic) return "not a railshard handle (bad magic)";
  if (handle.version != ListenHandle::kVersion) {
    return "handle version " + std::to_string(handle.version) + ", this plugin speaks " +
           std::to_string(ListenHandle::kVersion);
  }
  if (handle.rails == 0 || handle.rails > ListenHandle::kMaxRails) {
    return "handle names " + std::to_string(handle.rails) + " rails (1 to " +
           std::to_string(ListenHandle::kMaxRails) + ")";
  }
  for (int i = 0; i < handle.rails; ++i) {
    if (handle.rail[i].ipv4 == 0 || handle.rail[i].port == 0) {
      return "handle rail " + std::to_string(i) + " has no address";
    }
  }
  for (int i = 0; i < ListenHandle::kMaxRails && handle.layers[i] != 0; ++i) {
    if (handle.layers[i] != 'I' && handle.layers[i] != 'E') {
      return "handle RDMA rail " + std::to_string(i) + " has no link layer";
    }
  }
  return "";
}

std::string handleLayers(const ListenHandle& handle) {
  std::string layers;
  for (int i = 0; i < ListenHandle::kMaxRails && handle.layers[i] != 0; ++i) {
    layers += handle.layers[i];
  }
  return layers;
}

std::string railAddress(const HandleRail& rail) {
  char text[INET_ADDRSTRLEN] = {};
  in_addr address{};
  address.s_addr = rail.ipv4;
  ::inet_ntop(AF_INET, &address, text, sizeof(text));
  return std::string(text) + ":" + std::to_string(rail.port);
}

}  // namespace railshard::plugins::nccl
