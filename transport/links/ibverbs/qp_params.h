#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "transport/links/ibverbs/wire_format.h"

namespace railshard::transport::links::ibverbs {

// Reliable-connection timing, from RAILSHARD_IB_TIMEOUT / RAILSHARD_IB_RETRY_CNT.
struct QpTiming {
  // Local ACK timeout exponent: the HCA waits 4.096 us * 2^timeout for an ACK before it
  // retransmits. 18 = 1.07 s (NCCL's default too): long enough for a congested fabric,
  // short enough that retry_cnt retries (7 → about 8 s in all) end well inside the collective
  // timeout, after which the completion says IBV_WC_RETRY_EXC_ERR.
  uint8_t timeout = 18;
  uint8_t retry_cnt = 7;       // transport retries (0-7)
  uint8_t rnr_retry = 7;       // 7 = retry forever on receiver-not-ready; credits prevent RNR
  uint8_t min_rnr_timer = 12;  // 0.64 ms
  uint8_t service_level = 0;
  uint8_t traffic_class = 0;  // RoCE: DSCP << 2
};

// Seconds an unanswered peer takes to surface as a retry-exceeded completion.
double retryExhaustedSeconds(const QpTiming& timing);

// Attributes and the mask ibv_modify_qp wants for one transition. Pure: built from the two
// sides' LaneInfo, so the parameters can be checked without a device.
struct QpTransition {
  ibv_qp_attr attr{};
  int mask = 0;
};

// RESET -> INIT: port, pkey 0, remote write allowed (the peer writes into our ring).
QpTransition initTransition(uint8_t port);
// INIT -> RTR: the peer's QPN/PSN, path MTU = the smaller of both ports', and the address:
// LID for InfiniBand, the peer's GID (global route, our sgid index) for RoCE.
QpTransition rtrTransition(const LaneInfo& local, const LaneInfo& remote, const QpTiming& timing);
// RTR -> RTS: our PSN, timeout and retry counts.
QpTransition rtsTransition(const LaneInfo& local, const LaneInfo& remote, const QpTiming& timing);
// RDMA reads a lane may have outstanding: what both ends serve and issue; 0 = none (a peer
// that never reads).
int readDepth(const LaneInfo& local, const LaneInfo& remote);

// "INIT", "RTR", "RTS", ... for messages.
const char* qpStateName(ibv_qp_state state);

}  // namespace railshard::transport::links::ibverbs
