#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "plugins/nccl/net_api.h"

namespace railshard::plugins::nccl {

// One listening socket of a listen comm: a rail's IPv4 address and port.
struct HandleRail {
  uint32_t ipv4 = 0;  // network byte order
  uint16_t port = 0;  // host byte order
  uint16_t reserved = 0;
};

// What listen() writes into NCCL's 128-byte handle and NCCL carries to the connecting rank:
// where the receiver listens on each of the device's TCP rails, the link layer of each of its
// RDMA rails (their lanes connect by records over the TCP rails), and a nonce that the connecting
// rank's hellos must repeat (a stranger, or a hello meant for a listen comm since closed, is
// refused). The tail is the connecting side's own: NCCL passes the same buffer to every retry
// of a non-blocking connect, so its progress is kept there (a local pointer; the receiver
// never reads it).
struct ListenHandle {
  static constexpr uint32_t kMagic = 0x52534e48;  // "RSNH"
  static constexpr uint16_t kVersion = 2;         // 2: RDMA rails
  static constexpr int kMaxRails = 8;

  uint32_t magic = kMagic;
  uint16_t version = kVersion;
  uint8_t rails = 0;
  uint8_t fused = 0;  // the listening device stripes over all its rails
  uint64_t nonce = 0;
  HandleRail rail[kMaxRails];
  char layers[kMaxRails] = {};  // 'I' or 'E' per RDMA rail, in order; 0 after the last
  void* pending = nullptr;      // the connecting side's connect in progress
  uint8_t spare[kHandleBytes - 16 - kMaxRails * (sizeof(HandleRail) + 1) - sizeof(void*)];
};
static_assert(sizeof(ListenHandle) == kHandleBytes, "the handle is NCCL's 128 bytes");

// Checks a handle NCCL handed to connect(): magic, version, rail count, addresses. Returns
// the reason it cannot be used, or "" (a stale or corrupt handle is refused, never followed).
std::string checkHandle(const ListenHandle& handle);

// The receiver's RDMA layers as the handle carries them ("" when it has none).
std::string handleLayers(const ListenHandle& handle);

// "10.200.0.2:41234"
std::string railAddress(const HandleRail& rail);

}  // namespace railshard::plugins::nccl
