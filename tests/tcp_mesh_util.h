#pragma once

// Ranks of a bare TCP mesh (transport/links/tcp/tcp_mesh.h) in this process, for the tests that
// drive the transport without a communicator.
#include <memory>
#include <stdexcept>
#include <string>

#include "base/memory_store.h"
#include "core/collective_tag.h"
#include "transport/links/tcp/tcp_driver.h"
#include "transport/links/tcp/tcp_mesh.h"
#include "transport/messaging/mesh.h"

namespace railshard::test {

using transport::messaging::Mesh;

inline transport::links::tcp::MeshOptions tcpMeshOptions(int rank, int size,
                                                         const std::string& token) {
  transport::links::tcp::MeshOptions options;
  options.connect.rank = rank;
  options.connect.size = size;
  options.connect.token = token;
  options.connect.connect_timeout = std::chrono::seconds(20);
  options.formatter = tagFormatter();
  options.wait.poll = std::chrono::microseconds(2000);
  options.wait.pause = std::chrono::microseconds(20);
  return options;
}

// The TCP driver of a mesh (or of a communicator's transport).
inline transport::links::tcp::TcpDriver& tcpDriverOf(const transport::Transport& transport) {
  const auto& mesh = dynamic_cast<const Mesh&>(transport);
  for (const auto& driver : mesh.drivers()) {
    if (auto* tcp = dynamic_cast<transport::links::tcp::TcpDriver*>(driver.get())) return *tcp;
  }
  throw std::logic_error("the mesh has no TCP driver");
}

}  // namespace railshard::test
