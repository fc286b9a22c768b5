#include "transport/links/ibverbs/qp_params.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace railshard::transport::links::ibverbs {

double retryExhaustedSeconds(const QpTiming& timing) {
  const double ack_timeout = 4.096e-6 * std::ldexp(1.0, timing.timeout);
  return ack_timeout * (1 + timing.retry_cnt);
}

int readDepth(const LaneInfo& local, const LaneInfo& remote) {
  return std::min(local.rd_atomic, remote.rd_atomic);
}

QpTransition initTransition(uint8_t port) {
  QpTransition t;
  t.attr.qp_state = IBV_QPS_INIT;
  t.attr.pkey_index = 0;
  t.attr.port_num = port;
  // RDMA writes (pieces, credits) and reads (the rendezvous: the peer reads a large message
  // from the registration it named); never atomics.
  t.attr.qp_access_flags =
      IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE;
  t.mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  return t;
}

QpTransition rtrTransition(const LaneInfo& local, const LaneInfo& remote, const QpTiming& timing) {
  QpTransition t;
  t.attr.qp_state = IBV_QPS_RTR;
  t.attr.path_mtu = static_cast<ibv_mtu>(std::min(local.mtu, remote.mtu));
  t.attr.dest_qp_num = remote.qpn;
  t.attr.rq_psn = remote.psn;
  t.attr.max_dest_rd_atomic = std::max<uint8_t>(1, local.rd_atomic);
  t.attr.min_rnr_timer = timing.min_rnr_timer;
  ibv_ah_attr& ah = t.attr.ah_attr;
  ah.port_num = local.port;
  ah.sl = timing.service_level;
  ah.src_path_bits = 0;
  if (remote.link_layer == IBV_LINK_LAYER_ETHERNET) {
    // RoCE has no LIDs: every packet carries a global route header to the peer's GID.
    ah.is_global = 1;
    ah.dlid = 0;
    std::memcpy(ah.grh.dgid.raw, remote.gid.data(), remote.gid.size());
    ah.grh.sgid_index = local.gid_index;
    ah.grh.hop_limit = 64;
    ah.grh.traffic_class = timing.traffic_class;
    ah.grh.flow_label = 0;
  } else {
    ah.is_global = 0;
    ah.dlid = remote.lid;
  }
  t.mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  return t;
}

QpTransition rtsTransition(const LaneInfo& local, const LaneInfo& remote, const QpTiming& timing) {
  QpTransition t;
  t.attr.qp_state = IBV_QPS_RTS;
  t.attr.sq_psn = local.psn;
  t.attr.timeout = timing.timeout;
  t.attr.retry_cnt = timing.retry_cnt;
  t.attr.rnr_retry = timing.rnr_retry;
  t.attr.max_rd_atomic = std::max<uint8_t>(1, readDepth(local, remote));
  t.mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
           IBV_QP_MAX_QP_RD_ATOMIC;
  return t;
}

const char* qpStateName(ibv_qp_state state) {
  switch (state) {
    case IBV_QPS_RESET:
      return "RESET";
    case IBV_QPS_INIT:
      return "INIT";
    case IBV_QPS_RTR:
      return "RTR";
    case IBV_QPS_RTS:
      return "RTS";
    case IBV_QPS_SQD:
      return "SQD";
    case IBV_QPS_SQE:
      return "SQE";
    case IBV_QPS_ERR:
      return "ERR";
    default:
      return "UNKNOWN";
  }
}

}  // namespace railshard::transport::links::ibverbs
