#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/config.h"
#include "transport/cuda_driver.h"
#include "transport/links/driver.h"
#include "transport/links/ibverbs/hca_discovery.h"
#include "transport/links/ibverbs/qp_params.h"
#include "transport/links/ibverbs/registration_cache.h"
#include "transport/links/ibverbs/verbs_api.h"
#include "transport/messaging/failure_state.h"

namespace railshard::transport::links::ibverbs {

class RdmaLane;

// One HCA port: a rail. Every lane on it shares its protection domain and completion queue.
struct Rail {
  HcaPort port;
  uint8_t rd_atomic = 0;  // reads this rail serves and issues per queue pair (LaneInfo)
  bool software = false;  // Soft-RoCE, soft iWARP
  ibv_context* context = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
  int lanes = 0;
  // GPU buffers registered with this rail's protection domain (GPUDirect), made on first use.
  std::unique_ptr<RegistrationCache> device_cache;
};

// The RDMA side of one group: its rails (HCA ports: device context, protection domain,
// completion queue and channel each), its lanes (one reliable-connected queue pair per peer and
// rail, made by records its messenger exchanges), and one progress thread that polls the
// completion queues and reports what completed into the lanes' messengers.
//
// NEVER RUN ON RDMA HARDWARE: this code was developed on machines without an HCA; it runs in the
// tests over an in-process emulation of libibverbs (tests/fakes/fake_ibverbs.cc) and over
// Soft-RoCE in a qemu guest (docs/rdma.md).
class RdmaDriver final : public Driver {
 public:
  struct Options {
    int rank = 0;
    RdmaConfig rdma;         // slots, slot sizes, ACK timeout and retries, re-admission
    bool want_reads = true;  // this rank's rendezvous reads (else the sender writes)
    // How long the progress thread polls after its last completion before it sleeps on the
    // completion channels, at most 100 µs: the wait plan's polling budget (zero with more
    // ranks than cores, where a spinning thread takes the core a rank, or the kernel's own
    // network work, needs).
    Duration spin = std::chrono::microseconds(100);
    messaging::FailureState* failure = nullptr;
    QpTiming timing() const {
      QpTiming t;
      t.timeout = static_cast<uint8_t>(rdma.ack_timeout);
      t.retry_cnt = static_cast<uint8_t>(rdma.retry_cnt);
      return t;
    }
  };
  // Opens `ports` (the rails, in discovery order).
  RdmaDriver(const VerbsApi& api, Options options, const std::vector<HcaPort>& ports);
  ~RdmaDriver() override;

  // 'I' (InfiniBand) or 'E' (Ethernet) per rail: lane r to a peer joins our rail r to its rail
  // r where both have that rail with the same link layer (rail-optimised fabrics pair HCAs by
  // index).
  std::string layers() const;
  bool software() const;
  // The lanes to `peer` (`their_layers`: its layers()); ConfigError when they share none.
  std::vector<std::unique_ptr<RdmaLane>> makeLanes(int peer, const std::string& their_layers);
  // Completion queues sized for every lane made, then the progress thread.
  void start() override;
  // Closing: what lanes still have posted (ends, credits) gets until `until` to complete.
  void linger(Deadline until) override;
  void stop() override;

  // --- the lanes ---
  const VerbsApi& api() const { return api_; }
  const Options& options() const { return options_; }
  Rail& rail(int index) { return *rails_[static_cast<size_t>(index)]; }
  const CudaDriver* cuda() const { return cuda_; }
  // A lane was shut down or failed: the progress thread looks for it to go quiet.
  void wake();
  // Forgets the GPU memory registrations overlapping [addr, addr + bytes) on every rail: its
  // owner frees the memory (NCCL's deregMr), and a new buffer at that address must not be
  // read through the old registration. With the lock of every messenger whose lanes are on
  // this driver held (lanes make the caches under it). Returns the entries touched.
  size_t forgetDeviceMemory(const void* addr, size_t bytes);

 private:
  void openRails(const std::vector<HcaPort>& ports);
  void progressLoop();
  bool pollCompletions();
  void waitForEvents();
  void handleAsyncEvent(Rail& rail);
  void reportQuiet();
  void teardown();

  const VerbsApi& api_;
  Options options_;
  const CudaDriver* cuda_;
  std::vector<std::unique_ptr<Rail>> rails_;
  std::vector<RdmaLane*> lanes_;  // a work request's id names its lane by index here
  std::thread progress_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> quiet_check_{false};
  int wake_fd_ = -1;
};

}  // namespace railshard::transport::links::ibverbs
