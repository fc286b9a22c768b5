#pragma once

#include <memory>
#include <vector>

#include "base/config.h"
#include "base/store.h"
#include "transport/links/tcp/tcp_connect.h"
#include "transport/links/tcp/tcp_driver.h"
#include "transport/messaging/mesh.h"

namespace railshard::transport::links::tcp {

// A peer's connections as links of its messenger: a frame at a time on each, several of them
// striped by measured rate and re-dialled when one fails; one alone is the peer (its end is the
// peer lost). `data`: they carry messages (else only control frames beside other links).
// `rejoin_interval`: how often a failed one is dialled again. A connection without a descriptor
// (connected on first use) is added as a link to be dialled when the pair is first used.
void addLinks(TcpDriver& driver, messaging::Messenger& messenger, int peer,
              std::vector<Connection>& connections, bool data,
              Duration rejoin_interval = std::chrono::seconds(1));

// The group's timer: often enough for a stalled link (a few per rail timeout) and for the
// heartbeat (ten per timeout), at most every 5 ms.
Duration tickPeriod(const LinkConfig& links);

struct MeshOptions {
  ConnectOptions connect;
  TagFormatter formatter;
  LinkConfig links;
  Duration rejoin_interval = std::chrono::seconds(1);
  messaging::WaitPlan wait;
};

// Every pair over TCP alone: the messengers, their links and the driver, started. For tools and
// tests; a communicator's channels choose the links of each pair (core/channels.h).
std::unique_ptr<messaging::Mesh> connectMesh(Store& store, const MeshOptions& options);

}  // namespace railshard::transport::links::tcp
