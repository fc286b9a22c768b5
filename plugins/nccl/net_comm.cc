#include "plugins/nccl/net_comm.h"

#include "base/error.h"
#include "base/logging.h"
#include "plugins/nccl/rdma_rails.h"
#include "transport/links/tcp/tcp_mesh.h"

namespace railshard::plugins::nccl {
namespace {

namespace messaging = transport::messaging;

// NCCL's messages carry this as their collective: a railshard peer that is not the plugin is
// refused by the tag check.
constexpr uint8_t kNcclCollective = 0xCC;

// One grouped receive's buffers: each message of the group takes the first free one with its
// tag that is large enough, when its first piece says its tag and size.
struct Buffers {
  struct Slot {
    uint8_t* data = nullptr;
    size_t size = 0;
    int tag = 0;
    bool taken = false;
  };
  std::vector<Slot> slots;
};

struct Request {
  NetComm* comm = nullptr;
  bool send = false;
  std::vector<transport::RequestPtr> parts;  // a send: one; a receive: one per buffer
  std::shared_ptr<Buffers> buffers;          // a receive's
  std::vector<int> slot_of_part;             // which buffer each part's message took
  size_t send_size = 0;
};

}  // namespace

transport::MessageTag ncclTag(int tag) {
  transport::MessageTag t;
  t.collective = kNcclCollective;
  t.step = static_cast<uint32_t>(tag);
  return t;
}

NetComm::NetComm(bool sender, Established established, const CommOptions& comm)
    : sender_(sender), peer_(std::move(established.peer)) {
  namespace tcp = transport::links::tcp;
  const int rank = sender ? 1 : 0;
  transport::TagFormatter formatter;
  formatter.describe = [](const transport::MessageTag& tag) {
    return "NCCL message (tag " + std::to_string(static_cast<int>(tag.step)) + ")";
  };
  mesh_ = std::make_unique<messaging::Mesh>(rank, 2, formatter);
  mesh_->setName("nccl-plugin");
  tcp::TcpDriver::Options driver_options;
  driver_options.rank = rank;
  driver_options.size = 2;
  driver_options.token = established.token;
  driver_options.failure = &mesh_->failure();
  auto driver = std::make_unique<tcp::TcpDriver>(driver_options, std::move(established.listeners));
  messaging::MessengerOptions options;
  options.peer = 1 - rank;
  options.peer_address = peer_;
  options.links = comm.links;
  options.initiator = sender;  // it dialled the connections, it dials them again
  messaging::Group group = mesh_->group();
  group.cuda = comm.cuda;
  takes_device_memory_ = comm.cuda != nullptr;
  auto messenger = std::make_unique<messaging::Messenger>(group, options);
  // Lanes pair rail r with rail r while the layers agree (RdmaDriver::makeLanes): none when
  // the first differs, and then the TCP connections must carry the data after all.
  const std::string mine = rdmaLayers(comm.rdma_rails);
  const std::string& theirs = established.peer_layers;
  const bool lanes = !mine.empty() && !theirs.empty() && mine[0] == theirs[0];
  tcp::addLinks(*driver, *messenger, options.peer, established.connections,
                comm.tcp_data || !lanes);
  std::unique_ptr<transport::links::Driver> rdma;
  if (lanes) {
    rdma = addRdmaLanes(*messenger, comm.rdma_rails, theirs, comm.rdma, rank, mesh_->failure());
  }
  messaging::Messenger* m = messenger.get();
  mesh_->addMessenger(std::move(messenger));
  // The RDMA driver first: its completion queues must exist before the TCP connections
  // deliver the peer's records for the lanes.
  if (rdma) rdma->start();
  driver->start();
  mesh_->addDriver(std::move(driver));
  rdma_ = rdma.get();
  if (rdma) mesh_->addDriver(std::move(rdma));
  mesh_->start(tcp::tickPeriod(comm.links));
  // Connected now, not waited for (NCCL's connect must not block): until a lane is up the
  // scheduler counts it down and the TCP connections carry everything.
  if (lanes) m->connect();
}

NetComm::~NetComm() {
  // What each rail carried, for whoever reads NCCL's INFO log (NCCL_DEBUG=INFO).
  for (const auto& rail : mesh_->rails()) {
    RS_LOG_INFO("NCCL {} comm with {}: {} carried {} bytes, {:.3f} Gbit/s estimated, {}{}",
                sender_ ? "send" : "recv", peer_, rail.name, rail.bytes_sent, rail.gbps,
                rail.up ? "up" : "down: ", rail.down_reason);
  }
}

void* NetComm::isend(const void* data, size_t size, int tag) {
  auto request = std::make_unique<Request>();
  request->comm = this;
  request->send = true;
  request->send_size = size;
  request->parts.push_back(mesh_->isend(0, data, size, ncclTag(tag)));
  return request.release();
}

void NetComm::forgetDeviceMemory(const void* addr, size_t bytes) {
  if (rdma_ == nullptr) return;
  auto guard = mesh_->messenger(sender_ ? 0 : 1)->guard();
  plugins::nccl::forgetDeviceMemory(*rdma_, addr, bytes);
}

void* NetComm::irecv(int n, void* const* data, const size_t* sizes, const int* tags, bool device) {
  if (n < 1 || n > kMaxRecvs) {
    throw InvalidArgument("irecv of " + std::to_string(n) + " buffers (1 to " +
                          std::to_string(kMaxRecvs) + ")");
  }
  auto request = std::make_unique<Request>();
  request->comm = this;
  request->buffers = std::make_shared<Buffers>();
  size_t largest = 0;
  for (int i = 0; i < n; ++i) {
    request->buffers->slots.push_back(
        Buffers::Slot{static_cast<uint8_t*>(data[i]), sizes[i], tags[i], false});
    largest = std::max(largest, sizes[i]);
  }
  request->slot_of_part.assign(static_cast<size_t>(n), -1);
  messaging::Messenger& messenger = *mesh_->messenger(1);
  for (int part = 0; part < n; ++part) {
    // Runs under the messenger's lock when the message's first piece arrives (or now, when it
    // is here already): the request outlives it (its parts are done only after it ran).
    Request* r = request.get();
    request->parts.push_back(messenger.irecvChosen(
        largest, device, [r, part](const transport::MessageTag& tag, uint64_t total) {
          messaging::Choice choice;
          const int nccl_tag = static_cast<int>(tag.step);
          for (size_t s = 0; s < r->buffers->slots.size(); ++s) {
            auto& slot = r->buffers->slots[s];
            if (slot.taken || slot.tag != nccl_tag || slot.size < total) continue;
            slot.taken = true;
            r->slot_of_part[static_cast<size_t>(part)] = static_cast<int>(s);
            choice.data = slot.data;
            return choice;
          }
          std::string posted;
          for (const auto& slot : r->buffers->slots) {
            posted += (posted.empty() ? "" : ", ") + std::to_string(slot.size) + " B tag " +
                      std::to_string(slot.tag) + (slot.taken ? " (taken)" : "");
          }
          if (tag.collective != kNcclCollective) {
            choice.problem = messaging::Problem{ErrorKind::kMismatch,
                                                "the peer sent a message that is not NCCL's"};
          } else {
            choice.problem = messaging::Problem{
                ErrorKind::kMismatch, "a message of " + std::to_string(total) + " bytes with tag " +
                                          std::to_string(nccl_tag) +
                                          " fits no buffer of the posted receive (" + posted + ")"};
          }
          return choice;
        }));
  }
  return request.release();
}

bool testRequest(void* handle, int* sizes) {
  auto* request = static_cast<Request*>(handle);
  for (const auto& part : request->parts) {
    if (!part->done()) {
      request->comm->mesh().checkHealthy();  // a lost peer, a mismatch: raised here
      return false;
    }
  }
  if (sizes != nullptr) {
    if (request->send) {
      sizes[0] = static_cast<int>(request->send_size);
    } else {
      for (size_t s = 0; s < request->buffers->slots.size(); ++s) sizes[s] = 0;
      for (size_t part = 0; part < request->parts.size(); ++part) {
        const int slot = request->slot_of_part[part];
        if (slot >= 0) sizes[slot] = static_cast<int>(request->parts[part]->received());
      }
    }
  }
  delete request;
  return true;
}

}  // namespace railshard::plugins::nccl
