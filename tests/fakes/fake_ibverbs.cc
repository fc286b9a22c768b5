// fake_ibverbs: an in-process software emulation of the part of libibverbs railshard uses.
//
// What it is: a test bed for the RDMA transport's protocol logic on machines without RDMA
// hardware. The library exports the libibverbs entry points by their real names and prototypes
// (rdma-core 44's <infiniband/verbs.h>) and fills `context->ops` so the inline data-path calls
// (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq) land here too. Point
// RAILSHARD_IBVERBS_LIBRARY at libfake_ibverbs.so and run several ranks as threads of ONE
// process: an RDMA write is then a checked memcpy between registered regions of the same address
// space, done by one background "wire" thread so completions arrive asynchronously and in order
// per QP, as on an HCA.
//
// What it is not: a claim about hardware. Nothing here models timing, bandwidth, packetisation,
// ordering between different QPs, memory pinning, or any vendor's quirks. It enforces the rules a
// correct verbs program must follow anyway (QP state machine and attribute masks as the kernel
// checks them, lkey/rkey/PD/access checks, receive-queue and send-queue capacity, one completion
// event per arm, flush semantics after an error), so a protocol that passes here has its verbs
// usage checked, not its performance.
//
// Emulated: RC QPs only; opcodes IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM and
// IBV_WR_RDMA_READ (max_rd_atomic and max_dest_rd_atomic must be set, not counted); one port per
// device (port 1, InfiniBand link layer, LID = device index + 1, GID fe80::<index+1>, 4X EDR i.e.
// 4 lanes x 25 Gb/s = 100 Gb/s). Devices "fake0".."fakeN-1", N from FAKE_IBVERBS_DEVICES
// (default 2); FAKE_IBVERBS_PORT_DOWN=fake1[,fake2...] reports those ports as DOWN.
//
// Where it knowingly differs from libibverbs + a real HCA:
//  - ibv_close_device, ibv_destroy_cq and ibv_destroy_qp return EBUSY where the real library
//    would close anyway (objects left) or block forever (events not acknowledged; a QP's
//    async event retrieved by another thread is waited for up to 5 s first, as the real
//    library waits for it).
//  - A finite rnr_retry fails a write with immediate that finds no receive at once; 7 waits.
//  - A PSN mismatch between sq_psn and the peer's rq_psn fails with IBV_WC_RETRY_EXC_ERR.
//  - lkey != rkey for every MR, so using one for the other is caught.
//  - A port reported DOWN (FAKE_IBVERBS_PORT_DOWN) still carries traffic; use
//    fake_ibverbs_break_qp to fail a connection.
//  - A CQ overflow drops the completion, prints to stderr and raises IBV_EVENT_CQ_ERR.
//  - qp->state follows ibv_modify_qp only, as in libibverbs; ibv_query_qp reports the true
//    state, including ERR entered through a failed WR or a break.
//  - fork(): the child keeps a copy of every object and gets its own wire thread.
//
// Test hooks (extern "C"): fake_ibverbs_break_qp[_one_side], fake_ibverbs_bytes_written,
// fake_ibverbs_plain_write_bytes,
// fake_ibverbs_last_error, fake_ibverbs_live_objects; see the end of this file.

#include <infiniband/verbs.h>

// verbs.h turns these names into inline wrappers; the library defines the exported symbols.
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// Device limits reported by ibv_query_device and enforced at object creation.
constexpr uint32_t kMaxQpWr = 4096;
constexpr int kMaxSge = 4;
constexpr int kMaxCqe = 65536;
constexpr uint32_t kMaxInline = 512;
constexpr uint8_t kMaxRdAtomic = 16;
constexpr uint64_t kMaxMrSize = 1ull << 46;
constexpr uint32_t kPsnMask = 0xffffff;
constexpr int kMaxDevices = 64;

struct Device {
  ibv_device pub_{};
  int index_ = 0;
  uint64_t bytes_written_ = 0;  // payload of successful RDMA writes sent from this device's QPs
  uint64_t plain_written_ = 0;  // of those, by RDMA WRITE without immediate
};

struct Cq;
struct Qp;

struct Context {
  ibv_context pub_{};
  Device* device_ = nullptr;
  std::deque<ibv_async_event> async_events_;  // not yet returned by ibv_get_async_event
};

struct Pd {
  ibv_pd pub_{};
  Context* ctx_ = nullptr;
  int users_ = 0;  // MRs + QPs; ibv_dealloc_pd refuses while any remain
};

struct Mr {
  ibv_mr pub_{};
  Pd* pd_ = nullptr;
  int access_ = 0;
  uint64_t iova_ = 0;  // remote addresses are relative to this (== addr for ibv_reg_mr)
};

struct Channel {
  ibv_comp_channel pub_{};
  Context* ctx_ = nullptr;
  std::deque<Cq*> events_;  // CQs whose event has not been read yet
};

struct Completion {
  ibv_wc wc_{};
  bool is_send_ = false;
  uint64_t seq_ = 0;        // send WRs: position in the QP's send queue, frees slots when polled
  bool solicited_ = false;  // the sender set IBV_SEND_SOLICITED
};

enum class Arm { kNone, kAny, kSolicited };

struct Cq {
  ibv_cq pub_{};
  Context* ctx_ = nullptr;
  Channel* channel_ = nullptr;
  std::deque<Completion> entries_;
  int capacity_ = 0;
  Arm arm_ = Arm::kNone;
  int qps_ = 0;
  bool overflowed_ = false;
  // Real libibverbs makes ibv_destroy_cq wait until every event it handed out was acknowledged.
  uint64_t comp_delivered_ = 0, comp_acked_ = 0, async_delivered_ = 0, async_acked_ = 0;
};

struct SendWr {
  uint64_t wr_id_ = 0;
  ibv_wr_opcode opcode_ = IBV_WR_RDMA_WRITE;
  unsigned flags_ = 0;
  uint32_t imm_ = 0;
  uint64_t remote_addr_ = 0;
  uint32_t rkey_ = 0;
  std::vector<ibv_sge> sges_;
  bool inline_ = false;
  std::vector<char> inline_data_;  // IBV_SEND_INLINE copies the payload at post time
  bool signaled_ = false;
  uint64_t seq_ = 0;
  uint64_t length_ = 0;
};

struct Qp {
  ibv_qp pub_{};
  Pd* pd_ = nullptr;
  Cq* send_cq_ = nullptr;
  Cq* recv_cq_ = nullptr;
  ibv_qp_cap cap_{};
  bool sig_all_ = false;
  ibv_qp_state state_ = IBV_QPS_RESET;  // the true state; pub_.state only follows ibv_modify_qp
  ibv_qp_attr attr_{};                  // attributes accumulated over ibv_modify_qp calls
  std::deque<SendWr> pending_;          // posted, not yet executed by the wire
  std::deque<uint64_t> recvs_;          // posted receive wr_ids, oldest first
  uint64_t posted_ = 0;                 // send WRs ever posted
  uint64_t released_ = 0;               // send-queue slots freed by polled send completions
  uint32_t recv_outstanding_ = 0;       // receive WRs posted and not yet polled
  bool scheduled_ = false;              // queued on the wire
  bool stalled_ = false;                // waiting for a receive at the peer (rnr_retry == 7)
  int break_status_ = -1;               // fake_ibverbs_break_qp: status of the next failing WR
  uint32_t next_send_psn_ = 0, expected_psn_ = 0;
  uint64_t async_delivered_ = 0, async_acked_ = 0;
};

// Everything lives behind one mutex: the emulation is for correctness tests, and a single lock
// makes every verb atomic with respect to the wire, so a memcpy never races an ibv_dereg_mr.
struct State {
  std::mutex mu_;
  std::condition_variable wire_cv_;
  std::deque<std::unique_ptr<Device>> devices_;  // never freed: ibv_device pointers stay valid
  std::unordered_map<const void*, std::unique_ptr<Context>> contexts_;
  std::unordered_map<const void*, std::unique_ptr<Pd>> pds_;
  std::unordered_map<const void*, std::unique_ptr<Mr>> mrs_;
  std::unordered_map<const void*, std::unique_ptr<Channel>> channels_;
  std::unordered_map<const void*, std::unique_ptr<Cq>> cqs_;
  std::unordered_map<const void*, std::unique_ptr<Qp>> qps_;
  std::unordered_map<uint32_t, Qp*> qp_by_num_;
  std::unordered_map<uint32_t, Mr*> mr_by_lkey_, mr_by_rkey_;
  uint32_t next_qp_num_ = 0x100;  // never reused, so a stale number on the wire finds nothing
  uint32_t next_key_ = 0x1000;
  uint32_t next_handle_ = 1;
  std::deque<uint32_t> wire_;  // QP numbers with work, round robin
  std::thread wire_thread_;
  bool wire_stop_ = false;
  std::string last_error_;
};

State& state();

// fork(): the child gets the state but not the wire thread. Holding the mutex across fork keeps
// the copy consistent; the child forgets the parent's thread (without joining or detaching a
// thread that does not exist there) and starts its own on its next post.
void beforeFork() {
  state().mu_.lock();
}
void afterForkInParent() {
  state().mu_.unlock();
}
void afterForkInChild() {
  State& s = state();
  new (&s.wire_thread_) std::thread();  // ends the copied object's lifetime without ~thread()
  new (&s.wire_cv_) std::condition_variable();
  s.wire_.clear();
  for (auto& [key, qp] : s.qps_) {
    qp->scheduled_ = false;
  }
  for (auto& [key, qp] : s.qps_) {
    if (!qp->pending_.empty() && !qp->stalled_) {
      qp->scheduled_ = true;
      s.wire_.push_back(qp->pub_.qp_num);
    }
  }
  s.mu_.unlock();
}

// Leaked on purpose: a user thread still calling in during static destruction must not find the
// state gone. Only the wire thread is stopped at unload (WireJoiner below).
State& state() {
  static State* s = [] {
    auto* created = new State;
    pthread_atfork(beforeFork, afterForkInParent, afterForkInChild);
    return created;
  }();
  return *s;
}

template <typename T>
T* find(std::unordered_map<const void*, std::unique_ptr<T>>& map, const void* pub) {
  if (pub == nullptr) return nullptr;
  auto it = map.find(pub);
  return it == map.end() ? nullptr : it->second.get();
}

// Records why a verb failed; callers hold the mutex. FAKE_IBVERBS_VERBOSE=1 also prints it.
__attribute__((format(printf, 1, 2))) void setError(const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  state().last_error_ = buf;
  const char* verbose = std::getenv("FAKE_IBVERBS_VERBOSE");
  if (verbose != nullptr && verbose[0] == '1') std::fprintf(stderr, "fake_ibverbs: %s\n", buf);
}

// The async_fd and channel fds are eventfds that are readable exactly while their queue is
// non-empty. They are flipped under the mutex on the empty <-> non-empty edges, so lowerFd's
// read never blocks, and users can poll()/epoll them as they would the real descriptors.
void raiseFd(int fd) {
  const uint64_t one = 1;
  ssize_t rc = write(fd, &one, sizeof one);
  (void)rc;
}

void lowerFd(int fd) {
  uint64_t value = 0;
  ssize_t rc = read(fd, &value, sizeof value);
  (void)rc;
}

// Blocks until fd is readable, as the real blocking read would; false (errno EAGAIN) if the
// user made the descriptor non-blocking.
bool waitReadable(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0) return false;
  if (flags & O_NONBLOCK) {
    errno = EAGAIN;
    return false;
  }
  pollfd p{fd, POLLIN, 0};
  const int rc = poll(&p, 1, -1);
  return rc >= 0 || errno == EINTR;
}

bool isQpEvent(ibv_event_type type) {
  switch (type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      return true;
    default:
      return false;
  }
}

void queueAsync(Context& ctx, const ibv_async_event& event) {
  if (ctx.async_events_.empty()) raiseFd(ctx.pub_.async_fd);
  ctx.async_events_.push_back(event);
}

// Drops unread async events that name an object about to be freed (the kernel does the same).
template <typename Pred>
void dropAsync(Context& ctx, Pred pred) {
  const bool had = !ctx.async_events_.empty();
  std::erase_if(ctx.async_events_, pred);
  if (had && ctx.async_events_.empty()) lowerFd(ctx.pub_.async_fd);
}

void pushCompletion(Cq& cq, const Completion& c) {
  if (static_cast<int>(cq.entries_.size()) >= cq.capacity_) {
    // The HCA would raise a CQ error and stop; report it loudly, once, and drop the entry.
    if (!cq.overflowed_) {
      cq.overflowed_ = true;
      setError("CQ overflow: more than %d completions outstanding", cq.capacity_);
      std::fprintf(stderr, "fake_ibverbs: CQ overflow (cqe %d); completions are being lost\n",
                   cq.capacity_);
      ibv_async_event event{};
      event.element.cq = &cq.pub_;
      event.event_type = IBV_EVENT_CQ_ERR;
      queueAsync(*cq.ctx_, event);
    }
    return;
  }
  cq.entries_.push_back(c);
  const bool fire = cq.arm_ == Arm::kAny || (cq.arm_ == Arm::kSolicited &&
                                             (c.solicited_ || c.wc_.status != IBV_WC_SUCCESS));
  if (!fire) return;
  // One event per arm: the consumer must re-arm and poll again, and a completion that arrived
  // before the arm does not wake anyone -- the race real programs must handle.
  cq.arm_ = Arm::kNone;
  if (cq.channel_ == nullptr) return;
  if (cq.channel_->events_.empty()) raiseFd(cq.channel_->pub_.fd);
  cq.channel_->events_.push_back(&cq);
}

// Removes a QP's completions from a CQ, as providers do on destroy and on reset.
void purgeCompletions(Cq* cq, uint32_t qp_num) {
  if (cq == nullptr) return;
  std::erase_if(cq->entries_, [&](const Completion& c) { return c.wc_.qp_num == qp_num; });
}

void wireLoop();

// Started lazily (no thread in processes that never post), and again in a forked child.
void ensureWireThread() {
  State& s = state();
  if (!s.wire_.empty() && !s.wire_thread_.joinable() && !s.wire_stop_) {
    s.wire_thread_ = std::thread(wireLoop);
  }
}

void schedule(Qp& qp) {
  State& s = state();
  if (qp.scheduled_ || qp.stalled_ || qp.pending_.empty()) return;
  qp.scheduled_ = true;
  s.wire_.push_back(qp.pub_.qp_num);
  ensureWireThread();
  s.wire_cv_.notify_one();
}

// A sender waiting for receives at `qp_num` (rnr_retry == 7) retries once something changes there.
void wakeStalledSenders(uint32_t qp_num) {
  for (auto& [key, qp] : state().qps_) {
    if (qp->stalled_ && qp->attr_.dest_qp_num == qp_num) {
      qp->stalled_ = false;
      schedule(*qp);
    }
  }
}

void completeSend(Qp& qp, const SendWr& wr, ibv_wc_status status) {
  // Error completions are always generated; successful ones only when signaled.
  if (status == IBV_WC_SUCCESS && !wr.signaled_) return;
  Completion c;
  c.wc_.wr_id = wr.wr_id_;
  c.wc_.status = status;
  c.wc_.opcode = wr.opcode_ == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
  c.wc_.byte_len = static_cast<uint32_t>(wr.length_);
  c.wc_.qp_num = qp.pub_.qp_num;
  c.is_send_ = true;
  c.seq_ = wr.seq_;
  pushCompletion(*qp.send_cq_, c);
}

void flushRecv(Qp& qp, uint64_t wr_id) {
  Completion c;
  c.wc_.wr_id = wr_id;
  c.wc_.status = IBV_WC_WR_FLUSH_ERR;
  c.wc_.opcode = IBV_WC_RECV;
  c.wc_.qp_num = qp.pub_.qp_num;
  pushCompletion(*qp.recv_cq_, c);
}

// The QP enters the error state: posted receives flush now, pending sends flush on the wire.
void enterError(Qp& qp) {
  if (qp.state_ == IBV_QPS_ERR) return;
  qp.state_ = IBV_QPS_ERR;
  for (uint64_t id : qp.recvs_) flushRecv(qp, id);
  qp.recvs_.clear();
  qp.stalled_ = false;
  schedule(qp);
  wakeStalledSenders(qp.pub_.qp_num);
}

// The connected peer of `qp`, if it is connected back to it.
Qp* peerOf(const Qp& qp) {
  auto it = state().qp_by_num_.find(qp.attr_.dest_qp_num);
  if (it == state().qp_by_num_.end()) return nullptr;
  Qp* peer = it->second;
  const bool connected = peer->state_ == IBV_QPS_RTR || peer->state_ == IBV_QPS_RTS;
  return connected && peer->attr_.dest_qp_num == qp.pub_.qp_num ? peer : nullptr;
}

uint32_t mtuBytes(ibv_mtu mtu) {
  return 128u << static_cast<int>(mtu);
}

// The sender's failure after which the remote side also notices (retries exhausted).
void failSend(Qp& qp, SendWr& wr, ibv_wc_status status, Qp* also_fail) {
  completeSend(qp, wr, status);
  qp.pending_.pop_front();
  enterError(qp);
  if (also_fail != nullptr) enterError(*also_fail);
}

// Executes the oldest pending send WR of `qp`. Called by the wire thread with the mutex held.
void executeFront(Qp& qp) {
  State& s = state();
  SendWr& wr = qp.pending_.front();
  const uint32_t qpn = qp.pub_.qp_num;

  if (qp.state_ == IBV_QPS_ERR) {
    ibv_wc_status status = IBV_WC_WR_FLUSH_ERR;
    if (qp.break_status_ >= 0) {
      status = static_cast<ibv_wc_status>(qp.break_status_);
      qp.break_status_ = -1;
    }
    completeSend(qp, wr, status);
    qp.pending_.pop_front();
    return;
  }
  if (qp.state_ != IBV_QPS_RTS) return;  // reset clears the queue; nothing else can be here

  // Local gather list: each sge inside an MR of this QP's PD, by lkey (inline data skips this,
  // as the HCA never reads memory for it).
  if (!wr.inline_) {
    for (const ibv_sge& sge : wr.sges_) {
      auto it = s.mr_by_lkey_.find(sge.lkey);
      const Mr* mr = it == s.mr_by_lkey_.end() ? nullptr : it->second;
      const auto begin = reinterpret_cast<uintptr_t>(mr ? mr->pub_.addr : nullptr);
      const bool read = wr.opcode_ == IBV_WR_RDMA_READ;
      if (mr == nullptr || mr->pd_ != qp.pd_ || sge.addr < begin ||
          sge.addr + sge.length > begin + mr->pub_.length ||
          (read && !(mr->access_ & IBV_ACCESS_LOCAL_WRITE))) {
        setError(
            "QP %u wr_id %llu: local sge [0x%llx, +%u) lkey 0x%x is not inside an MR of the "
            "QP's PD (with IBV_ACCESS_LOCAL_WRITE for a read)",
            qpn, static_cast<unsigned long long>(wr.wr_id_),
            static_cast<unsigned long long>(sge.addr), sge.length, sge.lkey);
        failSend(qp, wr, IBV_WC_LOC_PROT_ERR, nullptr);
        return;
      }
    }
  }

  // The responder: it must exist, be able to receive and be connected back to this QP.
  auto dit = s.qp_by_num_.find(qp.attr_.dest_qp_num);
  Qp* dest = dit == s.qp_by_num_.end() ? nullptr : dit->second;
  if (dest == nullptr || (dest->state_ != IBV_QPS_RTR && dest->state_ != IBV_QPS_RTS) ||
      dest->attr_.dest_qp_num != qpn) {
    setError("QP %u: destination QP %u %s; packets are dropped until the retry count runs out", qpn,
             qp.attr_.dest_qp_num,
             dest == nullptr                  ? "does not exist"
             : dest->attr_.dest_qp_num != qpn ? "is not connected to this QP"
                                              : "is not in RTR or RTS");
    failSend(qp, wr, IBV_WC_RETRY_EXC_ERR, nullptr);
    return;
  }
  if (qp.next_send_psn_ != dest->expected_psn_) {
    // On hardware a PSN mismatch makes the responder drop or NAK every packet.
    setError("QP %u sends PSN 0x%x but QP %u expects 0x%x (sq_psn/rq_psn exchanged wrongly?)", qpn,
             qp.next_send_psn_, dest->pub_.qp_num, dest->expected_psn_);
    failSend(qp, wr, IBV_WC_RETRY_EXC_ERR, dest);
    return;
  }

  // Remote range: inside an MR of the responder's PD, by rkey, with remote write (read)
  // allowed on both the MR and the responder QP. Zero-length writes touch no memory and are
  // not checked.
  const bool read = wr.opcode_ == IBV_WR_RDMA_READ;
  const int remote_access = read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
  char* target = nullptr;
  if (wr.length_ > 0) {
    auto it = s.mr_by_rkey_.find(wr.rkey_);
    const Mr* mr = it == s.mr_by_rkey_.end() ? nullptr : it->second;
    const char* why = nullptr;
    if (!(dest->attr_.qp_access_flags & remote_access)) {
      why = read ? "the responder QP lacks IBV_ACCESS_REMOTE_READ"
                 : "the responder QP lacks IBV_ACCESS_REMOTE_WRITE";
    } else if (read && (qp.attr_.max_rd_atomic == 0 || dest->attr_.max_dest_rd_atomic == 0)) {
      why = "max_rd_atomic (requester) or max_dest_rd_atomic (responder) is 0";
    } else if (mr == nullptr) {
      why = "no MR has this rkey";
    } else if (mr->pd_ != dest->pd_) {
      why = "the MR belongs to another PD than the responder QP";
    } else if (!(mr->access_ & remote_access)) {
      why = read ? "the MR lacks IBV_ACCESS_REMOTE_READ" : "the MR lacks IBV_ACCESS_REMOTE_WRITE";
    } else if (wr.remote_addr_ < mr->iova_ || wr.length_ > mr->pub_.length ||
               wr.remote_addr_ - mr->iova_ > mr->pub_.length - wr.length_) {
      why = "the range is outside the MR";
    }
    if (why != nullptr) {
      setError("QP %u wr_id %llu: remote %s [0x%llx, +%llu) rkey 0x%x rejected: %s", qpn,
               static_cast<unsigned long long>(wr.wr_id_), read ? "read" : "write",
               static_cast<unsigned long long>(wr.remote_addr_),
               static_cast<unsigned long long>(wr.length_), wr.rkey_, why);
      failSend(qp, wr, IBV_WC_REM_ACCESS_ERR, nullptr);
      return;
    }
    target = static_cast<char*>(mr->pub_.addr) + (wr.remote_addr_ - mr->iova_);
  }

  const bool with_imm = wr.opcode_ == IBV_WR_RDMA_WRITE_WITH_IMM;
  if (with_imm && dest->recvs_.empty()) {
    if (qp.attr_.rnr_retry == 7) {
      // rnr_retry 7 retries forever: the send queue stalls until the responder posts a receive.
      qp.stalled_ = true;
      return;
    }
    // A finite rnr_retry is treated as exhausted at once; hardware would wait
    // (rnr_retry + 1) * min_rnr_timer first, which only delays the same outcome.
    setError("QP %u wr_id %llu: write with immediate found no posted receive at QP %u", qpn,
             static_cast<unsigned long long>(wr.wr_id_), dest->pub_.qp_num);
    failSend(qp, wr, IBV_WC_RNR_RETRY_EXC_ERR, dest);
    return;
  }

  // The transfer. memmove: loopback QPs may write within one buffer.
  if (read) {
    uint64_t offset = 0;
    for (const ibv_sge& sge : wr.sges_) {
      if (sge.length == 0) continue;
      std::memmove(reinterpret_cast<void*>(sge.addr), target + offset, sge.length);
      offset += sge.length;
    }
  } else if (wr.inline_) {
    if (wr.length_ > 0) std::memmove(target, wr.inline_data_.data(), wr.length_);
  } else {
    uint64_t offset = 0;
    for (const ibv_sge& sge : wr.sges_) {
      if (sge.length == 0) continue;
      std::memmove(target + offset, reinterpret_cast<const void*>(sge.addr), sge.length);
      offset += sge.length;
    }
  }
  Context* ctx = find(s.contexts_, qp.pub_.context);
  if (ctx != nullptr) {
    ctx->device_->bytes_written_ += wr.length_;
    if (wr.opcode_ == IBV_WR_RDMA_WRITE) ctx->device_->plain_written_ += wr.length_;
  }
  const uint32_t mtu = mtuBytes(qp.attr_.path_mtu);
  const uint32_t packets =
      wr.length_ == 0 ? 1 : static_cast<uint32_t>((wr.length_ + mtu - 1) / mtu);
  qp.next_send_psn_ = (qp.next_send_psn_ + packets) & kPsnMask;
  dest->expected_psn_ = (dest->expected_psn_ + packets) & kPsnMask;

  if (with_imm) {
    Completion c;
    c.wc_.wr_id = dest->recvs_.front();
    dest->recvs_.pop_front();
    c.wc_.status = IBV_WC_SUCCESS;
    c.wc_.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
    c.wc_.wc_flags = IBV_WC_WITH_IMM;
    c.wc_.imm_data = wr.imm_;  // network byte order, untouched, as the HCA delivers it
    c.wc_.byte_len = static_cast<uint32_t>(wr.length_);
    c.wc_.qp_num = dest->pub_.qp_num;
    c.wc_.src_qp = qpn;
    c.wc_.slid = static_cast<uint16_t>(ctx != nullptr ? ctx->device_->index_ + 1 : 0);
    c.solicited_ = (wr.flags_ & IBV_SEND_SOLICITED) != 0;
    pushCompletion(*dest->recv_cq_, c);
  }
  completeSend(qp, wr, IBV_WC_SUCCESS);
  qp.pending_.pop_front();
}

// The wire: one thread executes send WRs, one WR per QP per turn, so each QP's WRs complete in
// order while busy QPs do not starve each other.
void wireLoop() {
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mu_);
  for (;;) {
    s.wire_cv_.wait(lock, [&] { return s.wire_stop_ || !s.wire_.empty(); });
    if (s.wire_stop_) return;
    const uint32_t qpn = s.wire_.front();
    s.wire_.pop_front();
    auto it = s.qp_by_num_.find(qpn);
    if (it == s.qp_by_num_.end()) continue;  // destroyed while queued
    Qp& qp = *it->second;
    qp.scheduled_ = false;
    if (qp.pending_.empty() || qp.stalled_) continue;
    executeFront(qp);
    schedule(qp);
  }
}

// Stops and joins the wire thread when the library is unloaded or the process exits.
struct WireJoiner {
  ~WireJoiner() {
    State& s = state();
    std::thread thread;
    {
      std::lock_guard<std::mutex> lock(s.mu_);
      s.wire_stop_ = true;
      thread = std::move(s.wire_thread_);
    }
    s.wire_cv_.notify_all();
    if (thread.joinable()) thread.join();
  }
} wire_joiner;

// ---- data path, reached through context->ops ----

int fakePostSend(ibv_qp* pub, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  Qp* qp = find(s.qps_, pub);
  auto reject = [&](ibv_send_wr* at, int err) {
    if (bad_wr != nullptr) *bad_wr = at;
    return err;
  };
  if (qp == nullptr) {
    setError("ibv_post_send: unknown QP %p", static_cast<void*>(pub));
    return reject(wr, EINVAL);
  }
  for (; wr != nullptr; wr = wr->next) {
    // An errored QP accepts WRs and flushes them, as hardware does; other states refuse.
    if (qp->state_ != IBV_QPS_RTS && qp->state_ != IBV_QPS_ERR) {
      setError("ibv_post_send: QP %u is not in RTS", pub->qp_num);
      return reject(wr, EINVAL);
    }
    if (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM &&
        wr->opcode != IBV_WR_RDMA_READ) {
      setError("ibv_post_send: opcode %d is not emulated (RDMA_WRITE[_WITH_IMM], RDMA_READ)",
               static_cast<int>(wr->opcode));
      return reject(wr, EINVAL);
    }
    if (wr->opcode == IBV_WR_RDMA_READ && (wr->send_flags & IBV_SEND_INLINE)) {
      setError("ibv_post_send: an RDMA read cannot be inline");
      return reject(wr, EINVAL);
    }
    if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > qp->cap_.max_send_sge ||
        (wr->num_sge > 0 && wr->sg_list == nullptr)) {
      setError("ibv_post_send: num_sge %d exceeds the QP's max_send_sge %u", wr->num_sge,
               qp->cap_.max_send_sge);
      return reject(wr, EINVAL);
    }
    if (qp->posted_ - qp->released_ >= qp->cap_.max_send_wr) {
      // Slots free only when a completion at or after them is polled: a program that never
      // signals fills the queue, as on hardware.
      setError("ibv_post_send: send queue of QP %u is full (%u WRs outstanding)", pub->qp_num,
               qp->cap_.max_send_wr);
      return reject(wr, ENOMEM);
    }
    SendWr copy;
    copy.wr_id_ = wr->wr_id;
    copy.opcode_ = wr->opcode;
    copy.flags_ = wr->send_flags;
    copy.imm_ = wr->imm_data;
    copy.remote_addr_ = wr->wr.rdma.remote_addr;
    copy.rkey_ = wr->wr.rdma.rkey;
    copy.sges_.assign(wr->sg_list, wr->sg_list + wr->num_sge);
    for (const ibv_sge& sge : copy.sges_) copy.length_ += sge.length;
    copy.signaled_ = qp->sig_all_ || (wr->send_flags & IBV_SEND_SIGNALED);
    copy.inline_ = (wr->send_flags & IBV_SEND_INLINE) != 0;
    if (copy.inline_) {
      if (copy.length_ > qp->cap_.max_inline_data) {
        setError("ibv_post_send: %llu inline bytes exceed max_inline_data %u",
                 static_cast<unsigned long long>(copy.length_), qp->cap_.max_inline_data);
        return reject(wr, EINVAL);
      }
      for (const ibv_sge& sge : copy.sges_) {
        const char* from = reinterpret_cast<const char*>(sge.addr);
        copy.inline_data_.insert(copy.inline_data_.end(), from, from + sge.length);
      }
    }
    copy.seq_ = qp->posted_++;
    qp->pending_.push_back(std::move(copy));
  }
  schedule(*qp);
  return 0;
}

int fakePostRecv(ibv_qp* pub, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  Qp* qp = find(s.qps_, pub);
  auto reject = [&](ibv_recv_wr* at, int err) {
    if (bad_wr != nullptr) *bad_wr = at;
    return err;
  };
  if (qp == nullptr) {
    setError("ibv_post_recv: unknown QP %p", static_cast<void*>(pub));
    return reject(wr, EINVAL);
  }
  for (; wr != nullptr; wr = wr->next) {
    if (qp->state_ == IBV_QPS_RESET) {
      setError("ibv_post_recv: QP %u is in RESET", pub->qp_num);
      return reject(wr, EINVAL);
    }
    if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > qp->cap_.max_recv_sge) {
      setError("ibv_post_recv: num_sge %d exceeds max_recv_sge %u", wr->num_sge,
               qp->cap_.max_recv_sge);
      return reject(wr, EINVAL);
    }
    if (qp->recv_outstanding_ >= qp->cap_.max_recv_wr) {
      setError("ibv_post_recv: receive queue of QP %u is full (%u WRs)", pub->qp_num,
               qp->cap_.max_recv_wr);
      return reject(wr, ENOMEM);
    }
    ++qp->recv_outstanding_;
    if (qp->state_ == IBV_QPS_ERR) {
      flushRecv(*qp, wr->wr_id);
    } else {
      // The scatter list is not kept: a write with immediate consumes the WR but places its
      // data by rkey, and no other inbound opcode is emulated.
      qp->recvs_.push_back(wr->wr_id);
    }
  }
  wakeStalledSenders(pub->qp_num);
  return 0;
}

int fakePollCq(ibv_cq* pub, int num_entries, ibv_wc* wc) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  Cq* cq = find(s.cqs_, pub);
  if (cq == nullptr || num_entries < 0 || (num_entries > 0 && wc == nullptr)) {
    setError("ibv_poll_cq: unknown CQ or bad arguments");
    return -1;
  }
  ensureWireThread();  // a forked child may have inherited queued work and no thread yet
  int n = 0;
  while (n < num_entries && !cq->entries_.empty()) {
    const Completion& c = cq->entries_.front();
    wc[n++] = c.wc_;
    auto it = s.qp_by_num_.find(c.wc_.qp_num);
    if (it != s.qp_by_num_.end()) {
      Qp& qp = *it->second;
      if (c.is_send_) {
        qp.released_ = std::max(qp.released_, c.seq_ + 1);
      } else if (qp.recv_outstanding_ > 0) {
        --qp.recv_outstanding_;
      }
    }
    cq->entries_.pop_front();
  }
  return n;
}

int fakeReqNotifyCq(ibv_cq* pub, int solicited_only) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  Cq* cq = find(s.cqs_, pub);
  if (cq == nullptr) {
    setError("ibv_req_notify_cq: unknown CQ");
    return EINVAL;
  }
  // An "any" arm already pending is not narrowed by a later solicited-only request.
  if (!(cq->arm_ == Arm::kAny && solicited_only)) {
    cq->arm_ = solicited_only ? Arm::kSolicited : Arm::kAny;
  }
  return 0;
}

// ---- ibv_modify_qp's rules, from the kernel's qp_state_table for RC ----

struct TransitionRule {
  bool valid = false;
  int required = 0;
  int optional = 0;
};

TransitionRule ruleFor(ibv_qp_state cur, ibv_qp_state next) {
  if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) return {true, 0, 0};
  if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT) {
    return {true, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0};
  }
  if (cur == IBV_QPS_INIT && next == IBV_QPS_INIT) {
    return {true, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS};
  }
  if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) {
    return {true,
            IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
            IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX};
  }
  if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) {
    return {true,
            IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                IBV_QP_MAX_QP_RD_ATOMIC,
            IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
                IBV_QP_PATH_MIG_STATE};
  }
  if (cur == IBV_QPS_RTS && next == IBV_QPS_RTS) {
    return {true, 0,
            IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
                IBV_QP_MIN_RNR_TIMER};
  }
  return {};
}

const char* stateName(ibv_qp_state state) {
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

int modifyQpLocked(Qp& qp, const ibv_qp_attr& attr, int mask) {
  State& s = state();
  const uint32_t qpn = qp.pub_.qp_num;
  const ibv_qp_state cur = qp.state_;
  const ibv_qp_state next = (mask & IBV_QP_STATE) ? attr.qp_state : cur;
  const TransitionRule rule = ruleFor(cur, next);
  if (!rule.valid) {
    setError("ibv_modify_qp: QP %u cannot go from %s to %s", qpn, stateName(cur), stateName(next));
    return EINVAL;
  }
  if ((mask & IBV_QP_CUR_STATE) && cur != IBV_QPS_RTR && cur != IBV_QPS_RTS) {
    setError("ibv_modify_qp: IBV_QP_CUR_STATE is only valid from RTR or RTS");
    return EINVAL;
  }
  if ((mask & rule.required) != rule.required) {
    setError("ibv_modify_qp: QP %u %s->%s lacks required attribute mask bits 0x%x", qpn,
             stateName(cur), stateName(next), rule.required & ~mask);
    return EINVAL;
  }
  const int extra = mask & ~(rule.required | rule.optional | IBV_QP_STATE);
  if (extra != 0) {
    setError("ibv_modify_qp: QP %u %s->%s does not accept attribute mask bits 0x%x", qpn,
             stateName(cur), stateName(next), extra);
    return EINVAL;
  }

  if ((mask & IBV_QP_PORT) && attr.port_num != 1) {
    setError("ibv_modify_qp: port_num %u (only port 1 exists)", attr.port_num);
    return EINVAL;
  }
  if ((mask & IBV_QP_PKEY_INDEX) && attr.pkey_index != 0) {
    setError("ibv_modify_qp: pkey_index %u (the P_Key table has one entry)", attr.pkey_index);
    return EINVAL;
  }
  const int known_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                           IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  if ((mask & IBV_QP_ACCESS_FLAGS) && (attr.qp_access_flags & ~known_access)) {
    setError("ibv_modify_qp: unknown qp_access_flags 0x%x", attr.qp_access_flags);
    return EINVAL;
  }
  if (mask & IBV_QP_PATH_MTU) {
    // Every fake port runs at IBV_MTU_4096, so any valid MTU is <= the active one.
    if (attr.path_mtu < IBV_MTU_256 || attr.path_mtu > IBV_MTU_4096) {
      setError("ibv_modify_qp: path_mtu %d is not a valid MTU <= the port's active MTU 4096",
               static_cast<int>(attr.path_mtu));
      return EINVAL;
    }
  }
  if (mask & IBV_QP_DEST_QPN) {
    auto it = s.qp_by_num_.find(attr.dest_qp_num);
    if (it == s.qp_by_num_.end()) {
      setError("ibv_modify_qp: dest_qp_num %u names no QP", attr.dest_qp_num);
      return EINVAL;
    }
    const Qp& dest = *it->second;
    const Context* dest_ctx = find(s.contexts_, dest.pub_.context);
    const int dest_index = dest_ctx != nullptr ? dest_ctx->device_->index_ : -1;
    if (mask & IBV_QP_AV) {
      const ibv_ah_attr& ah = attr.ah_attr;
      if (ah.port_num != 1) {
        setError("ibv_modify_qp: ah_attr.port_num %u (only port 1 exists)", ah.port_num);
        return EINVAL;
      }
      // InfiniBand routes by LID; the LID must be the one of the device owning the target QP.
      if (ah.dlid != dest_index + 1) {
        setError("ibv_modify_qp: ah_attr.dlid %u but QP %u lives on fake%d with LID %d", ah.dlid,
                 attr.dest_qp_num, dest_index, dest_index + 1);
        return EINVAL;
      }
      if (ah.is_global) {
        uint8_t expected[16] = {0xfe, 0x80};
        expected[15] = static_cast<uint8_t>(dest_index + 1);
        if (ah.grh.sgid_index != 0 || std::memcmp(ah.grh.dgid.raw, expected, 16) != 0) {
          setError("ibv_modify_qp: GRH with sgid_index %u / dgid not of fake%d", ah.grh.sgid_index,
                   dest_index);
          return EINVAL;
        }
      }
    }
  }
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > kMaxRdAtomic) {
    setError("ibv_modify_qp: max_dest_rd_atomic %u > %u", attr.max_dest_rd_atomic, kMaxRdAtomic);
    return EINVAL;
  }
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > kMaxRdAtomic) {
    setError("ibv_modify_qp: max_rd_atomic %u > %u", attr.max_rd_atomic, kMaxRdAtomic);
    return EINVAL;
  }
  if (((mask & IBV_QP_MIN_RNR_TIMER) && attr.min_rnr_timer > 31) ||
      ((mask & IBV_QP_TIMEOUT) && attr.timeout > 31) ||
      ((mask & IBV_QP_RETRY_CNT) && attr.retry_cnt > 7) ||
      ((mask & IBV_QP_RNR_RETRY) && attr.rnr_retry > 7)) {
    setError(
        "ibv_modify_qp: min_rnr_timer/timeout (<= 31) or retry_cnt/rnr_retry (<= 7) out of "
        "range");
    return EINVAL;
  }

  // Accepted: record the attributes the mask names.
  ibv_qp_attr& a = qp.attr_;
  if (mask & IBV_QP_PKEY_INDEX) a.pkey_index = attr.pkey_index;
  if (mask & IBV_QP_PORT) a.port_num = attr.port_num;
  if (mask & IBV_QP_ACCESS_FLAGS) a.qp_access_flags = attr.qp_access_flags;
  if (mask & IBV_QP_AV) a.ah_attr = attr.ah_attr;
  if (mask & IBV_QP_PATH_MTU) a.path_mtu = attr.path_mtu;
  if (mask & IBV_QP_DEST_QPN) a.dest_qp_num = attr.dest_qp_num;
  if (mask & IBV_QP_RQ_PSN) a.rq_psn = attr.rq_psn & kPsnMask;
  if (mask & IBV_QP_SQ_PSN) a.sq_psn = attr.sq_psn & kPsnMask;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) a.max_rd_atomic = attr.max_rd_atomic;
  if (mask & IBV_QP_MIN_RNR_TIMER) a.min_rnr_timer = attr.min_rnr_timer;
  if (mask & IBV_QP_TIMEOUT) a.timeout = attr.timeout;
  if (mask & IBV_QP_RETRY_CNT) a.retry_cnt = attr.retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) a.rnr_retry = attr.rnr_retry;
  if (mask & IBV_QP_STATE) qp.pub_.state = next;

  if (next == IBV_QPS_RESET) {
    // Reset discards all work without completions and removes the QP's CQ entries.
    qp.state_ = IBV_QPS_RESET;
    qp.pending_.clear();
    qp.recvs_.clear();
    qp.posted_ = qp.released_ = 0;
    qp.recv_outstanding_ = 0;
    qp.stalled_ = false;
    qp.break_status_ = -1;
    purgeCompletions(qp.send_cq_, qpn);
    purgeCompletions(qp.recv_cq_, qpn);
    wakeStalledSenders(qpn);
  } else if (next == IBV_QPS_ERR) {
    enterError(qp);
  } else {
    if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) qp.expected_psn_ = a.rq_psn;
    if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) qp.next_send_psn_ = a.sq_psn;
    qp.state_ = next;
  }
  return 0;
}

ibv_mr* regMr(ibv_pd* pub, void* addr, size_t length, uint64_t iova, int access) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  Pd* pd = find(s.pds_, pub);
  if (pd == nullptr) {
    setError("ibv_reg_mr: unknown PD");
    errno = EINVAL;
    return nullptr;
  }
  if ((addr == nullptr && length > 0) || length > kMaxMrSize) {
    setError("ibv_reg_mr: bad range %p +%zu", addr, length);
    errno = EINVAL;
    return nullptr;
  }
  // The verbs rule: remote write or atomic access requires local write.
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(access & IBV_ACCESS_LOCAL_WRITE)) {
    setError("ibv_reg_mr: IBV_ACCESS_REMOTE_WRITE/ATOMIC without IBV_ACCESS_LOCAL_WRITE");
    errno = EINVAL;
    return nullptr;
  }
  auto mr = std::make_unique<Mr>();
  mr->pd_ = pd;
  mr->access_ = access;
  mr->iova_ = iova;
  mr->pub_.context = pub->context;
  mr->pub_.pd = pub;
  mr->pub_.addr = addr;
  mr->pub_.length = length;
  mr->pub_.handle = s.next_handle_++;
  // Distinct lkey and rkey values, so using one where the other belongs is caught.
  mr->pub_.lkey = s.next_key_++;
  mr->pub_.rkey = s.next_key_++;
  s.mr_by_lkey_[mr->pub_.lkey] = mr.get();
  s.mr_by_rkey_[mr->pub_.rkey] = mr.get();
  ++pd->users_;
  ibv_mr* out = &mr->pub_;
  s.mrs_[out] = std::move(mr);
  return out;
}

int parseDeviceCount() {
  const char* text = std::getenv("FAKE_IBVERBS_DEVICES");
  if (text == nullptr || text[0] == '\0') return 2;
  char* end = nullptr;
  const long n = std::strtol(text, &end, 10);
  if (*end != '\0' || n < 0 || n > kMaxDevices) return 2;
  return static_cast<int>(n);
}

bool portIsDown(const Device& device) {
  const char* text = std::getenv("FAKE_IBVERBS_PORT_DOWN");
  if (text == nullptr) return false;
  const std::string list = std::string(",") + text + ",";
  return list.find(std::string(",") + device.pub_.name + ",") != std::string::npos;
}

}  // namespace

// ---- devices and contexts ----

FAKE_EXPORT ibv_device** ibv_get_device_list(int* num_devices) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  const int n = parseDeviceCount();
  while (static_cast<int>(s.devices_.size()) < n) {
    auto device = std::make_unique<Device>();
    device->index_ = static_cast<int>(s.devices_.size());
    device->pub_.node_type = IBV_NODE_CA;
    device->pub_.transport_type = IBV_TRANSPORT_IB;
    std::snprintf(device->pub_.name, sizeof device->pub_.name, "fake%d", device->index_);
    std::snprintf(device->pub_.dev_name, sizeof device->pub_.dev_name, "uverbs%d", device->index_);
    std::snprintf(device->pub_.dev_path, sizeof device->pub_.dev_path,
                  "/sys/class/infiniband_verbs/uverbs%d", device->index_);
    std::snprintf(device->pub_.ibdev_path, sizeof device->pub_.ibdev_path,
                  "/sys/class/infiniband/fake%d", device->index_);
    s.devices_.push_back(std::move(device));
  }
  auto** list = new ibv_device*[n + 1];
  for (int i = 0; i < n; ++i) list[i] = &s.devices_[i]->pub_;
  list[n] = nullptr;
  if (num_devices != nullptr) *num_devices = n;
  return list;
}

FAKE_EXPORT void ibv_free_device_list(ibv_device** list) {
  delete[] list;
}

FAKE_EXPORT const char* ibv_get_device_name(ibv_device* device) {
  return device != nullptr ? device->name : nullptr;
}

FAKE_EXPORT __be64 ibv_get_device_guid(ibv_device* device) {
  const Device* d = reinterpret_cast<const Device*>(device);  // pub_ is the first member
  return htobe64(0x00fa4e0000000000ull | static_cast<uint64_t>(d->index_ + 1));
}

FAKE_EXPORT ibv_context* ibv_open_device(ibv_device* pub) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  Device* device = nullptr;
  for (auto& d : s.devices_) {
    if (&d->pub_ == pub) device = d.get();
  }
  if (device == nullptr) {
    setError("ibv_open_device: not a fake device");
    errno = ENODEV;
    return nullptr;
  }
  const int fd = eventfd(0, EFD_CLOEXEC);
  if (fd < 0) return nullptr;
  auto ctx = std::make_unique<Context>();
  ctx->device_ = device;
  ibv_context& c = ctx->pub_;
  c.device = pub;
  c.ops.post_send = fakePostSend;
  c.ops.post_recv = fakePostRecv;
  c.ops.poll_cq = fakePollCq;
  c.ops.req_notify_cq = fakeReqNotifyCq;
  c.cmd_fd = -1;
  c.async_fd = fd;
  c.num_comp_vectors = 1;
  pthread_mutex_init(&c.mutex, nullptr);
  // Not __VERBS_ABI_IS_EXTENDED: verbs.h's inline wrappers then take the plain entry points.
  c.abi_compat = nullptr;
  ibv_context* out = &ctx->pub_;
  s.contexts_[out] = std::move(ctx);
  return out;
}

FAKE_EXPORT int ibv_close_device(ibv_context* pub) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  Context* ctx = find(s.contexts_, pub);
  if (ctx == nullptr) {
    setError("ibv_close_device: unknown context");
    return EINVAL;
  }
  // Real libibverbs closes regardless and the kernel reaps what is left; refusing here keeps
  // pointers the wire may still follow valid and makes leaks visible to the tests.
  auto uses = [&](const auto& map) {
    for (const auto& [key, obj] : map) {
      if (obj->pub_.context == pub) return true;
    }
    return false;
  };
  if (uses(s.pds_) || uses(s.cqs_) || uses(s.channels_) || uses(s.qps_) || uses(s.mrs_)) {
    setError("ibv_close_device: %s still has PDs, MRs, CQs, QPs or channels",
             ctx->device_->pub_.name);
    return EBUSY;
  }
  close(pub->async_fd);
  pthread_mutex_destroy(&pub->mutex);
  s.contexts_.erase(pub);
  return 0;
}

FAKE_EXPORT int ibv_query_device(ibv_context* pub, ibv_device_attr* attr) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  Context* ctx = find(s.contexts_, pub);
  if (ctx == nullptr || attr == nullptr) return EINVAL;
  std::memset(attr, 0, sizeof *attr);
  std::snprintf(attr->fw_ver, sizeof attr->fw_ver, "fake");
  attr->node_guid = ibv_get_device_guid(pub->device);
  attr->sys_image_guid = attr->node_guid;
  attr->max_mr_size = kMaxMrSize;
  attr->page_size_cap = 4096;
  attr->hw_ver = 1;
  attr->max_qp = 65536;
  attr->max_qp_wr = kMaxQpWr;
  attr->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT;
  attr->max_sge = kMaxSge;
  attr->max_sge_rd = kMaxSge;
  attr->max_cq = 65536;
  attr->max_cqe = kMaxCqe;
  attr->max_mr = 1 << 20;
  attr->max_pd = 65536;
  attr->max_qp_rd_atom = kMaxRdAtomic;
  attr->max_qp_init_rd_atom = kMaxRdAtomic;
  attr->max_res_rd_atom = kMaxRdAtomic * 65536;
  attr->atomic_cap = IBV_ATOMIC_NONE;
  attr->max_pkeys = 1;
  attr->local_ca_ack_delay = 16;
  attr->phys_port_cnt = 1;
  return 0;
}

// The exported symbol takes the compatibility struct; callers (verbs.h's inline wrapper and
// railshard alike) pass a zeroed full struct ibv_port_attr, which is filled completely.
FAKE_EXPORT int ibv_query_port(ibv_context* pub, uint8_t port_num, _compat_ibv_port_attr* compat) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  Context* ctx = find(s.contexts_, pub);
  if (ctx == nullptr || compat == nullptr || port_num != 1) {
    setError("ibv_query_port: unknown context or port %u (only port 1 exists)", port_num);
    return EINVAL;
  }
  auto* attr = reinterpret_cast<ibv_port_attr*>(compat);
  std::memset(attr, 0, sizeof *attr);
  const bool down = portIsDown(*ctx->device_);
  attr->state = down ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
  attr->max_mtu = IBV_MTU_4096;
  attr->active_mtu = IBV_MTU_4096;
  attr->gid_tbl_len = 1;
  attr->max_msg_sz = 0x80000000u;
  attr->pkey_tbl_len = 1;
  attr->lid = static_cast<uint16_t>(ctx->device_->index_ + 1);
  attr->sm_lid = 1;
  attr->max_vl_num = 1;
  attr->subnet_timeout = 18;
  attr->active_width = 2;           // 4X
  attr->active_speed = 32;          // EDR, 25 Gb/s per lane: 4X EDR = 100 Gb/s
  attr->phys_state = down ? 3 : 5;  // Disabled : LinkUp
  attr->link_layer = IBV_LINK_LAYER_INFINIBAND;
  return 0;
}

FAKE_EXPORT int ibv_query_gid(ibv_context* pub, uint8_t port_num, int index, ibv_gid* gid) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  Context* ctx = find(s.contexts_, pub);
  if (ctx == nullptr || gid == nullptr || port_num != 1 || index != 0) {
    setError("ibv_query_gid: port %u index %d (only port 1, index 0 exist)", port_num, index);
    return EINVAL;
  }
  std::memset(gid->raw, 0, sizeof gid->raw);
  gid->raw[0] = 0xfe;
  gid->raw[1] = 0x80;
  gid->raw[15] = static_cast<uint8_t>(ctx->device_->index_ + 1);
  return 0;
}

FAKE_EXPORT int ibv_get_async_event(ibv_context* pub, ibv_async_event* event) {
  State& s = state();
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(s.mu_);
      Context* ctx = find(s.contexts_, pub);
      if (ctx == nullptr || event == nullptr) {
        errno = EINVAL;
        return -1;
      }
      if (!ctx->async_events_.empty()) {
        *event = ctx->async_events_.front();
        ctx->async_events_.pop_front();
        if (ctx->async_events_.empty()) lowerFd(pub->async_fd);
        if (isQpEvent(event->event_type)) {
          if (Qp* qp = find(s.qps_, event->element.qp)) ++qp->async_delivered_;
        } else if (event->event_type == IBV_EVENT_CQ_ERR) {
          if (Cq* cq = find(s.cqs_, event->element.cq)) ++cq->async_delivered_;
        }
        return 0;
      }
    }
    if (!waitReadable(pub->async_fd)) return -1;
  }
}

FAKE_EXPORT void ibv_ack_async_event(ibv_async_event* event) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  if (event == nullptr) return;
  if (isQpEvent(event->event_type)) {
    if (Qp* qp = find(s.qps_, event->element.qp)) ++qp->async_acked_;
  } else if (event->event_type == IBV_EVENT_CQ_ERR) {
    if (Cq* cq = find(s.cqs_, event->element.cq)) ++cq->async_acked_;
  }
}

// ---- protection domains and memory regions ----

FAKE_EXPORT ibv_pd* ibv_alloc_pd(ibv_context* pub) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  Context* ctx = find(s.contexts_, pub);
  if (ctx == nullptr) {
    setError("ibv_alloc_pd: unknown context");
    errno = EINVAL;
    return nullptr;
  }
  auto pd = std::make_unique<Pd>();
  pd->ctx_ = ctx;
  pd->pub_.context = pub;
  pd->pub_.handle = s.next_handle_++;
  ibv_pd* out = &pd->pub_;
  s.pds_[out] = std::move(pd);
  return out;
}

FAKE_EXPORT int ibv_dealloc_pd(ibv_pd* pub) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  Pd* pd = find(s.pds_, pub);
  if (pd == nullptr) {
    setError("ibv_dealloc_pd: unknown PD");
    return EINVAL;
  }
  if (pd->users_ > 0) {
    setError("ibv_dealloc_pd: %d MRs/QPs still use the PD", pd->users_);
    return EBUSY;
  }
  s.pds_.erase(pub);
  return 0;
}

FAKE_EXPORT ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return regMr(pd, addr, length, reinterpret_cast<uintptr_t>(addr), access);
}

FAKE_EXPORT ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                                     unsigned int access) {
  return regMr(pd, addr, length, iova, static_cast<int>(access));
}

FAKE_EXPORT ibv_mr* ibv_reg_dmabuf_mr(ibv_pd*, uint64_t, size_t, uint64_t, int, int) {
  errno = EOPNOTSUPP;  // no device memory in a single process; callers fall back to host MRs
  return nullptr;
}

FAKE_EXPORT int ibv_dereg_mr(ibv_mr* pub) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  Mr* mr = find(s.mrs_, pub);
  if (mr == nullptr) {
    setError("ibv_dereg_mr: unknown MR");
    return EINVAL;
  }
  s.mr_by_lkey_.erase(pub->lkey);
  s.mr_by_rkey_.erase(pub->rkey);
  --mr->pd_->users_;
  s.mrs_.erase(pub);
  return 0;
}

// ---- completion channels and CQs ----

FAKE_EXPORT ibv_comp_channel* ibv_create_comp_channel(ibv_context* pub) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  Context* ctx = find(s.contexts_, pub);
  if (ctx == nullptr) {
    setError("ibv_create_comp_channel: unknown context");
    errno = EINVAL;
    return nullptr;
  }
  const int fd = eventfd(0, EFD_CLOEXEC);
  if (fd < 0) return nullptr;
  auto channel = std::make_unique<Channel>();
  channel->ctx_ = ctx;
  channel->pub_.context = pub;
  channel->pub_.fd = fd;
  channel->pub_.refcnt = 0;
  ibv_comp_channel* out = &channel->pub_;
  s.channels_[out] = std::move(channel);
  return out;
}

FAKE_EXPORT int ibv_destroy_comp_channel(ibv_comp_channel* pub) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  Channel* channel = find(s.channels_, pub);
  if (channel == nullptr) {
    setError("ibv_destroy_comp_channel: unknown channel");
    return EINVAL;
  }
  if (pub->refcnt > 0) {
    setError("ibv_destroy_comp_channel: %d CQs still use the channel", pub->refcnt);
    return EBUSY;
  }
  close(pub->fd);
  s.channels_.erase(pub);
  return 0;
}

FAKE_EXPORT ibv_cq* ibv_create_cq(ibv_context* pub, int cqe, void* cq_context,
                                  ibv_comp_channel* channel_pub, int comp_vector) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  Context* ctx = find(s.contexts_, pub);
  Channel* channel = find(s.channels_, channel_pub);
  if (ctx == nullptr || cqe < 1 || cqe > kMaxCqe || comp_vector < 0 ||
      comp_vector >= pub->num_comp_vectors || (channel_pub != nullptr && channel == nullptr) ||
      (channel != nullptr && channel->ctx_ != ctx)) {
    setError("ibv_create_cq: unknown context/channel, cqe %d not in [1, %d] or comp_vector %d", cqe,
             kMaxCqe, comp_vector);
    errno = EINVAL;
    return nullptr;
  }
  auto cq = std::make_unique<Cq>();
  cq->ctx_ = ctx;
  cq->channel_ = channel;
  cq->capacity_ = cqe;
  cq->pub_.context = pub;
  cq->pub_.channel = channel_pub;
  cq->pub_.cq_context = cq_context;
  cq->pub_.handle = s.next_handle_++;
  cq->pub_.cqe = cqe;
  pthread_mutex_init(&cq->pub_.mutex, nullptr);
  pthread_cond_init(&cq->pub_.cond, nullptr);
  if (channel != nullptr) ++channel_pub->refcnt;
  ibv_cq* out = &cq->pub_;
  s.cqs_[out] = std::move(cq);
  return out;
}

FAKE_EXPORT int ibv_destroy_cq(ibv_cq* pub) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  Cq* cq = find(s.cqs_, pub);
  if (cq == nullptr) {
    setError("ibv_destroy_cq: unknown CQ");
    return EINVAL;
  }
  if (cq->qps_ > 0) {
    setError("ibv_destroy_cq: %d QPs still use the CQ", cq->qps_);
    return EBUSY;
  }
  if (cq->comp_delivered_ != cq->comp_acked_ || cq->async_delivered_ != cq->async_acked_) {
    // Real libibverbs blocks forever here; failing is kinder to a test run.
    setError(
        "ibv_destroy_cq: %llu completion / %llu async events not acknowledged (real "
        "libibverbs would hang)",
        static_cast<unsigned long long>(cq->comp_delivered_ - cq->comp_acked_),
        static_cast<unsigned long long>(cq->async_delivered_ - cq->async_acked_));
    return EBUSY;
  }
  if (Channel* channel = cq->channel_) {
    const bool had = !channel->events_.empty();
    std::erase(channel->events_, cq);
    if (had && channel->events_.empty()) lowerFd(channel->pub_.fd);
    --channel->pub_.refcnt;
  }
  dropAsync(*cq->ctx_, [&](const ibv_async_event& e) {
    return e.event_type == IBV_EVENT_CQ_ERR && e.element.cq == pub;
  });
  pthread_mutex_destroy(&pub->mutex);
  pthread_cond_destroy(&pub->cond);
  s.cqs_.erase(pub);
  return 0;
}

FAKE_EXPORT int ibv_get_cq_event(ibv_comp_channel* pub, ibv_cq** cq_out, void** cq_context) {
  State& s = state();
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(s.mu_);
      Channel* channel = find(s.channels_, pub);
      if (channel == nullptr || cq_out == nullptr || cq_context == nullptr) {
        errno = EINVAL;
        return -1;
      }
      if (!channel->events_.empty()) {
        Cq* cq = channel->events_.front();
        channel->events_.pop_front();
        if (channel->events_.empty()) lowerFd(pub->fd);
        ++cq->comp_delivered_;
        *cq_out = &cq->pub_;
        *cq_context = cq->pub_.cq_context;
        return 0;
      }
    }
    if (!waitReadable(pub->fd)) return -1;
  }
}

FAKE_EXPORT void ibv_ack_cq_events(ibv_cq* pub, unsigned int nevents) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  if (Cq* cq = find(s.cqs_, pub)) cq->comp_acked_ += nevents;
}

// ---- queue pairs ----

FAKE_EXPORT ibv_qp* ibv_create_qp(ibv_pd* pd_pub, ibv_qp_init_attr* init) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  Pd* pd = find(s.pds_, pd_pub);
  if (pd == nullptr || init == nullptr) {
    setError("ibv_create_qp: unknown PD");
    errno = EINVAL;
    return nullptr;
  }
  Cq* send_cq = find(s.cqs_, init->send_cq);
  Cq* recv_cq = find(s.cqs_, init->recv_cq);
  const ibv_qp_cap& cap = init->cap;
  const char* why = nullptr;
  if (init->qp_type != IBV_QPT_RC) {
    why = "only IBV_QPT_RC is emulated";
  } else if (send_cq == nullptr || recv_cq == nullptr) {
    why = "send_cq and recv_cq must be CQs";
  } else if (send_cq->ctx_ != pd->ctx_ || recv_cq->ctx_ != pd->ctx_) {
    why = "the CQs belong to another device context than the PD";
  } else if (init->srq != nullptr) {
    why = "SRQs are not emulated";
  } else if (cap.max_send_wr > kMaxQpWr || cap.max_recv_wr > kMaxQpWr) {
    why = "max_send_wr/max_recv_wr exceed max_qp_wr 4096";
  } else if (cap.max_send_sge > kMaxSge || cap.max_recv_sge > kMaxSge) {
    why = "max_send_sge/max_recv_sge exceed max_sge 4";
  } else if (cap.max_inline_data > kMaxInline) {
    why = "max_inline_data exceeds 512";
  }
  if (why != nullptr) {
    setError("ibv_create_qp: %s", why);
    errno = EINVAL;
    return nullptr;
  }
  auto qp = std::make_unique<Qp>();
  qp->pd_ = pd;
  qp->send_cq_ = send_cq;
  qp->recv_cq_ = recv_cq;
  qp->cap_ = cap;
  qp->sig_all_ = init->sq_sig_all != 0;
  ibv_qp& q = qp->pub_;
  q.context = pd_pub->context;
  q.qp_context = init->qp_context;
  q.pd = pd_pub;
  q.send_cq = init->send_cq;
  q.recv_cq = init->recv_cq;
  q.handle = s.next_handle_++;
  q.qp_num = s.next_qp_num_++;
  q.state = IBV_QPS_RESET;
  q.qp_type = IBV_QPT_RC;
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  ++pd->users_;
  ++send_cq->qps_;
  ++recv_cq->qps_;
  s.qp_by_num_[q.qp_num] = qp.get();
  ibv_qp* out = &qp->pub_;
  s.qps_[out] = std::move(qp);
  return out;
}

FAKE_EXPORT int ibv_modify_qp(ibv_qp* pub, ibv_qp_attr* attr, int mask) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  Qp* qp = find(s.qps_, pub);
  if (qp == nullptr || attr == nullptr) {
    setError("ibv_modify_qp: unknown QP");
    return EINVAL;
  }
  return modifyQpLocked(*qp, *attr, mask);
}

FAKE_EXPORT int ibv_query_qp(ibv_qp* pub, ibv_qp_attr* attr, int /*mask*/, ibv_qp_init_attr* init) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  Qp* qp = find(s.qps_, pub);
  if (qp == nullptr || attr == nullptr) return EINVAL;
  *attr = qp->attr_;
  attr->qp_state = qp->state_;  // the true state, including errors the wire moved it to
  attr->cur_qp_state = qp->state_;
  attr->cap = qp->cap_;
  if (init != nullptr) {
    std::memset(init, 0, sizeof *init);
    init->qp_context = pub->qp_context;
    init->send_cq = pub->send_cq;
    init->recv_cq = pub->recv_cq;
    init->cap = qp->cap_;
    init->qp_type = IBV_QPT_RC;
    init->sq_sig_all = qp->sig_all_ ? 1 : 0;
  }
  return 0;
}

FAKE_EXPORT int ibv_destroy_qp(ibv_qp* pub) {
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mu_);
  Qp* qp = find(s.qps_, pub);
  if (qp == nullptr) {
    setError("ibv_destroy_qp: unknown QP");
    return EINVAL;
  }
  // Real libibverbs waits until every async event of the QP that was retrieved is
  // acknowledged (another thread may be about to); forever if none comes. Here: up to 5 s.
  for (int waited_ms = 0; qp->async_delivered_ != qp->async_acked_ && waited_ms < 5000;
       ++waited_ms) {
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    lock.lock();
    qp = find(s.qps_, pub);
    if (qp == nullptr) {
      setError("ibv_destroy_qp: the QP was destroyed by another thread meanwhile");
      return EINVAL;
    }
  }
  if (qp->async_delivered_ != qp->async_acked_) {
    // Real libibverbs blocks forever here; failing is kinder to a test run.
    setError(
        "ibv_destroy_qp: %llu async events of QP %u not acknowledged (real libibverbs would "
        "hang)",
        static_cast<unsigned long long>(qp->async_delivered_ - qp->async_acked_), pub->qp_num);
    return EBUSY;
  }
  const uint32_t qpn = pub->qp_num;
  purgeCompletions(qp->send_cq_, qpn);
  purgeCompletions(qp->recv_cq_, qpn);
  --qp->send_cq_->qps_;
  --qp->recv_cq_->qps_;
  --qp->pd_->users_;
  dropAsync(*qp->pd_->ctx_, [&](const ibv_async_event& e) {
    return isQpEvent(e.event_type) && e.element.qp == pub;
  });
  pthread_mutex_destroy(&pub->mutex);
  pthread_cond_destroy(&pub->cond);
  s.qp_by_num_.erase(qpn);
  s.qps_.erase(pub);
  // Its peer now sends into the void: retries run out.
  wakeStalledSenders(qpn);
  return 0;
}

// ---- strings and misc ----

FAKE_EXPORT const char* ibv_wc_status_str(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_SUCCESS:
      return "success";
    case IBV_WC_LOC_LEN_ERR:
      return "local length error";
    case IBV_WC_LOC_QP_OP_ERR:
      return "local QP operation error";
    case IBV_WC_LOC_EEC_OP_ERR:
      return "local EE context operation error";
    case IBV_WC_LOC_PROT_ERR:
      return "local protection error";
    case IBV_WC_WR_FLUSH_ERR:
      return "Work Request Flushed Error";
    case IBV_WC_MW_BIND_ERR:
      return "memory management operation error";
    case IBV_WC_BAD_RESP_ERR:
      return "bad response error";
    case IBV_WC_LOC_ACCESS_ERR:
      return "local access error";
    case IBV_WC_REM_INV_REQ_ERR:
      return "remote invalid request error";
    case IBV_WC_REM_ACCESS_ERR:
      return "remote access error";
    case IBV_WC_REM_OP_ERR:
      return "remote operation error";
    case IBV_WC_RETRY_EXC_ERR:
      return "transport retry counter exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return "RNR retry counter exceeded";
    case IBV_WC_LOC_RDD_VIOL_ERR:
      return "local RDD violation error";
    case IBV_WC_REM_INV_RD_REQ_ERR:
      return "remote invalid RD request";
    case IBV_WC_REM_ABORT_ERR:
      return "aborted error";
    case IBV_WC_INV_EECN_ERR:
      return "invalid EE context number";
    case IBV_WC_INV_EEC_STATE_ERR:
      return "invalid EE context state";
    case IBV_WC_FATAL_ERR:
      return "fatal error";
    case IBV_WC_RESP_TIMEOUT_ERR:
      return "response timeout error";
    case IBV_WC_GENERAL_ERR:
      return "general error";
    case IBV_WC_TM_ERR:
      return "TM error";
    case IBV_WC_TM_RNDV_INCOMPLETE:
      return "TM software rendezvous";
  }
  return "unknown";
}

FAKE_EXPORT const char* ibv_event_type_str(ibv_event_type event) {
  switch (event) {
    case IBV_EVENT_CQ_ERR:
      return "CQ error";
    case IBV_EVENT_QP_FATAL:
      return "local work queue catastrophic error";
    case IBV_EVENT_QP_REQ_ERR:
      return "invalid request local work queue error";
    case IBV_EVENT_QP_ACCESS_ERR:
      return "local access violation work queue error";
    case IBV_EVENT_COMM_EST:
      return "communication established";
    case IBV_EVENT_SQ_DRAINED:
      return "send queue drained";
    case IBV_EVENT_PATH_MIG:
      return "path migrated";
    case IBV_EVENT_PATH_MIG_ERR:
      return "path migration request error";
    case IBV_EVENT_DEVICE_FATAL:
      return "local catastrophic error";
    case IBV_EVENT_PORT_ACTIVE:
      return "port active";
    case IBV_EVENT_PORT_ERR:
      return "port error";
    case IBV_EVENT_LID_CHANGE:
      return "LID change";
    case IBV_EVENT_PKEY_CHANGE:
      return "P_Key change";
    case IBV_EVENT_SM_CHANGE:
      return "SM change";
    case IBV_EVENT_SRQ_ERR:
      return "SRQ catastrophic error";
    case IBV_EVENT_SRQ_LIMIT_REACHED:
      return "SRQ limit reached";
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      return "last WQE reached";
    case IBV_EVENT_CLIENT_REREGISTER:
      return "client reregistration";
    case IBV_EVENT_GID_CHANGE:
      return "GID table change";
    case IBV_EVENT_WQ_FATAL:
      return "WQ fatal";
  }
  return "unknown";
}

FAKE_EXPORT int ibv_fork_init(void) {
  return 0;
}

// ---- test hooks ----

// The QP fails as a pulled cable would: it and its connected peer enter ERR; the oldest
// outstanding send WR (or, with none outstanding, the next one posted) completes with `status`
// and the rest flush; receives on both flush; IBV_EVENT_QP_FATAL for this QP is queued on its
// context. Returns 0, ENOENT for an unknown QP number, EINVAL for a status that is not an error.
namespace {
// fake_ibverbs_break_qp[_one_side]: the QP (and its connected peer when `both`) in error,
// the next failing WR with `status`, and a QP_FATAL event.
int breakQp(uint32_t qp_num, int status, bool both) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  auto it = s.qp_by_num_.find(qp_num);
  if (it == s.qp_by_num_.end()) return ENOENT;
  if (status <= IBV_WC_SUCCESS || status > IBV_WC_TM_RNDV_INCOMPLETE) return EINVAL;
  Qp& qp = *it->second;
  Qp* peer = both ? peerOf(qp) : nullptr;
  qp.break_status_ = status;
  if (qp.state_ == IBV_QPS_ERR) schedule(qp);  // already errored: pending WRs pick it up
  enterError(qp);
  if (peer != nullptr) enterError(*peer);
  ibv_async_event event{};
  event.element.qp = &qp.pub_;
  event.event_type = IBV_EVENT_QP_FATAL;
  queueAsync(*qp.pd_->ctx_, event);
  return 0;
}
}  // namespace

FAKE_EXPORT int fake_ibverbs_break_qp(uint32_t qp_num, int status) {
  return breakQp(qp_num, status, true);
}

// Like fake_ibverbs_break_qp, but only this end fails (a local error on one host): the
// connected QP stays in RTS and learns of it only by sending to this one.
FAKE_EXPORT int fake_ibverbs_break_qp_one_side(uint32_t qp_num, int status) {
  return breakQp(qp_num, status, false);
}

namespace {
uint64_t deviceCount(const char* device_name, uint64_t Device::*counter) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  if (device_name == nullptr) return 0;
  for (const auto& d : s.devices_) {
    if (std::strcmp(d->pub_.name, device_name) == 0) return (*d).*counter;
  }
  return 0;
}
}  // namespace

// Payload bytes successfully RDMA-written by QPs of the named device since the process began.
FAKE_EXPORT uint64_t fake_ibverbs_bytes_written(const char* device_name) {
  return deviceCount(device_name, &Device::bytes_written_);
}

// Of those, the bytes written by RDMA WRITE without immediate (the write rendezvous).
FAKE_EXPORT uint64_t fake_ibverbs_plain_write_bytes(const char* device_name) {
  return deviceCount(device_name, &Device::plain_written_);
}

// The last validation failure (any thread), "" if none. The pointer stays valid in the calling
// thread until its next call.
FAKE_EXPORT const char* fake_ibverbs_last_error(void) {
  static thread_local std::string copy;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  copy = s.last_error_;
  return copy.c_str();
}

// Live contexts + PDs + MRs + CQs + QPs + completion channels.
FAKE_EXPORT int fake_ibverbs_live_objects(void) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu_);
  return static_cast<int>(s.contexts_.size() + s.pds_.size() + s.mrs_.size() + s.cqs_.size() +
                          s.qps_.size() + s.channels_.size());
}
