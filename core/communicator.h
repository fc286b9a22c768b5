#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/base/config.h"
#include "core/base/store.h"
#include "core/base/types.h"
#include "core/collectives/tuner.h"

namespace railshard {

namespace transport {
class Transport;
}
namespace topology {
class Topology;
}
namespace collectives {
class Workspace;
class ShmEngine;
}  // namespace collectives

// A group of ranks that run collectives together. Collectives are blocking and must be called
// in the same order with matching arguments on every rank; every call is checked against the
// other ranks (MismatchError when they disagree) and bounded by Config::timeout.
//
// Buffers are host memory. Out-of-place when send != recv; in-place when send == recv (for
// reduceScatter when send + rank*recv_count == recv, for allgather when
// recv + rank*send_count == send), as in NCCL. One thread at a time per communicator.
class Communicator {
 public:
  struct Options {
    int rank = 0;
    int size = 1;
    Config config;
    std::string key_prefix = "railshard";  // store namespace, distinct per communicator
    std::string advertise_host;            // address peers reach this rank at; "" = loopback
    // The cluster graph (launcher::buildClusterTopology); when set, it decides which ranks
    // share a host. Null: ranks compare host identities through the store.
    std::shared_ptr<const topology::Topology> topology;
  };

  // Connects to every peer through `store` (address exchange) and returns when the mesh is
  // up. The store must outlive this call only.
  static std::unique_ptr<Communicator> create(Store& store, const Options& options);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Config& config() const { return config_; }

  void allreduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op);
  void allreduce(void* buffer, size_t count, DataType dtype, ReduceOp op) {
    allreduce(buffer, buffer, count, dtype, op);
  }
  // send: size() * recv_count elements; recv: recv_count elements (block rank()).
  void reduceScatter(const void* send, void* recv, size_t recv_count, DataType dtype, ReduceOp op);
  // send: send_count elements; recv: size() * send_count elements, rank r's at block r.
  void allgather(const void* send, void* recv, size_t send_count, DataType dtype);
  // `send` is read on the root only; every rank's `recv` receives the root's data.
  void broadcast(const void* send, void* recv, size_t count, DataType dtype, int root);
  void broadcast(void* buffer, size_t count, DataType dtype, int root) {
    broadcast(buffer, buffer, count, dtype, root);
  }
  void barrier();

  // Number of collectives started so far (the sequence number of the next one).
  uint64_t sequence() const { return sequence_; }
  // True when collectives run through shared memory (every rank on this host).
  bool usesSharedMemory() const { return shm_ != nullptr; }
  // Name of the algorithm the last all-reduce ran ("ring", "shm_direct", ...).
  std::string_view lastAlgorithm() const { return last_algorithm_; }
  transport::Transport& transport() { return *transport_; }
  // The cluster graph this communicator was built with; null when none was given.
  const topology::Topology* topology() const { return topology_.get(); }

  // Keeps `resource` alive as long as this communicator (e.g. the store server rank 0 hosts).
  void keepAlive(std::shared_ptr<void> resource) { resources_.push_back(std::move(resource)); }

 private:
  Communicator(const Options& options, std::unique_ptr<transport::Transport> transport);
  void checkBuffer(const char* collective, const char* what, const void* buffer, size_t count,
                   DataType dtype) const;
  void checkTypes(const char* collective, DataType dtype, ReduceOp op) const;
  void setUpSharedMemory(Store& store, const std::string& key_prefix);

  int rank_;
  int size_;
  Config config_;
  std::unique_ptr<transport::Transport> transport_;
  std::shared_ptr<const topology::Topology> topology_;
  std::unique_ptr<collectives::Workspace> workspace_;
  std::unique_ptr<collectives::ShmEngine> shm_;
  std::string_view last_algorithm_ = "none";
  // Last tuner decision (see allreduce()).
  bool tuned_ = false;
  size_t tuned_bytes_ = 0;
  collectives::Algorithm tuned_algorithm_{};
  uint64_t sequence_ = 0;
  std::vector<std::shared_ptr<void>> resources_;
};

}  // namespace railshard
