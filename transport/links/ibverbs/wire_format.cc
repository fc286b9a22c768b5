#include "transport/links/ibverbs/wire_format.h"

#include "base/error.h"

namespace railshard::transport::links::ibverbs {

namespace {

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>& out) : out_(out) {}
  void put(uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<uint8_t>(value >> (8 * i)));
  }

 private:
  std::vector<uint8_t>& out_;
};

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& in) : in_(in) {}
  uint64_t get(int bytes) {
    uint64_t value = 0;
    for (int i = 0; i < bytes; ++i) value |= uint64_t{in_[pos_++]} << (8 * i);
    return value;
  }

 private:
  const std::vector<uint8_t>& in_;
  size_t pos_ = 0;
};

[[noreturn]] void bad(const std::string& field, uint64_t value, const std::string& expected) {
  throw ProtocolError("ibverbs connection record: " + field + " = " + std::to_string(value) +
                      " (expected " + expected + ")");
}

}  // namespace

std::vector<uint8_t> LaneInfo::encode() const {
  std::vector<uint8_t> out;
  out.reserve(kEncodedBytes);
  Writer w(out);
  w.put(kMagic, 4);
  w.put(kVersion, 2);
  w.put(rail, 2);
  w.put(rank, 4);
  w.put(port, 1);
  w.put(mtu, 1);
  w.put(link_layer, 1);
  w.put(gid_index, 1);
  w.put(lid, 2);
  w.put(rd_atomic, 1);
  w.put(0, 1);
  w.put(qpn, 4);
  w.put(psn, 4);
  for (uint8_t b : gid) w.put(b, 1);
  w.put(ring_addr, 8);
  w.put(ring_rkey, 4);
  w.put(slots, 4);
  w.put(slot_bytes, 4);
  out.resize(kEncodedBytes, 0);  // room to grow within the version
  return out;
}

LaneInfo LaneInfo::decode(const std::vector<uint8_t>& bytes) {
  if (bytes.size() != kEncodedBytes) {
    bad("size", bytes.size(), std::to_string(kEncodedBytes) + " bytes");
  }
  Reader r(bytes);
  const uint64_t magic = r.get(4);
  if (magic != kMagic) bad("magic", magic, std::to_string(kMagic) + " (\"RSIB\")");
  const uint64_t version = r.get(2);
  if (version != kVersion) bad("version", version, std::to_string(kVersion));
  LaneInfo info;
  info.rail = static_cast<uint16_t>(r.get(2));
  info.rank = static_cast<uint32_t>(r.get(4));
  info.port = static_cast<uint8_t>(r.get(1));
  info.mtu = static_cast<uint8_t>(r.get(1));
  info.link_layer = static_cast<uint8_t>(r.get(1));
  info.gid_index = static_cast<uint8_t>(r.get(1));
  info.lid = static_cast<uint16_t>(r.get(2));
  info.rd_atomic = static_cast<uint8_t>(r.get(1));
  r.get(1);
  info.qpn = static_cast<uint32_t>(r.get(4));
  info.psn = static_cast<uint32_t>(r.get(4));
  for (auto& b : info.gid) b = static_cast<uint8_t>(r.get(1));
  info.ring_addr = r.get(8);
  info.ring_rkey = static_cast<uint32_t>(r.get(4));
  info.slots = static_cast<uint32_t>(r.get(4));
  info.slot_bytes = static_cast<uint32_t>(r.get(4));
  if (info.port == 0) bad("port", info.port, "1 or more");
  if (info.mtu < 1 || info.mtu > 5) bad("mtu", info.mtu, "1 (256) to 5 (4096)");
  if (info.link_layer != 1 && info.link_layer != 2) {
    bad("link_layer", info.link_layer, "1 (InfiniBand) or 2 (Ethernet)");
  }
  if (info.qpn == 0 || info.qpn >= (1u << 24)) bad("qpn", info.qpn, "1 to 2^24-1");
  if (info.psn >= (1u << 24)) bad("psn", info.psn, "below 2^24");
  if (info.ring_addr == 0) bad("ring_addr", 0, "a non-null address");
  if (info.slots < 2 || info.slots > 4096) bad("slots", info.slots, "2 to 4096");
  if (info.slot_bytes < 4096 || info.slot_bytes > (64u << 20) || info.slot_bytes % 64 != 0) {
    bad("slot_bytes", info.slot_bytes, "a multiple of 64 from 4096 to 64 MiB");
  }
  return info;
}

uint32_t encodeImmediate(const Immediate& imm) {
  return (static_cast<uint32_t>(imm.kind) << 24) | (imm.value & 0xffffffu);
}

Immediate decodeImmediate(uint32_t host_order) {
  const uint32_t kind = host_order >> 24;
  if (kind > static_cast<uint32_t>(ImmKind::kCredit)) {
    throw ProtocolError("ibverbs: immediate data of unknown kind " + std::to_string(kind));
  }
  return Immediate{static_cast<ImmKind>(kind), host_order & 0xffffffu};
}

}  // namespace railshard::transport::links::ibverbs
