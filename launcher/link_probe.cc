#include "launcher/link_probe.h"

#include <sys/socket.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "base/error.h"
#include "base/logging.h"
#include "transport/links/tcp/socket.h"

namespace railshard::launcher {

namespace {

namespace tcp = transport::links::tcp;
using topology::Rail;
using topology::Topology;

std::string pairKey(const ProbeOptions& options, const std::string& a, const std::string& b) {
  return options.key_prefix + "/result/" + a + "|" + b;
}

struct Measurement {
  double gbps = 0;
  double latency_us = 0;
};

// Server side of one rail: accept, check the token, echo pings, count the stream.
void serveRail(int listen_fd, const ProbeOptions& options, const std::string& what) {
  const Deadline deadline = deadlineAfter(options.timeout);
  tcp::Fd fd = tcp::acceptBefore(listen_fd, deadline, what);
  tcp::setNonBlocking(fd.get(), false);
  tcp::setNoDelay(fd.get());
  uint32_t length = 0;
  tcp::recvAll(fd.get(), &length, sizeof(length), deadline, what);
  if (length > 4096) throw ProtocolError(what + ": oversized hello");
  std::string token(length, '\0');
  tcp::recvAll(fd.get(), token.data(), length, deadline, what);
  if (token != options.token) throw ProtocolError(what + ": peer presented a wrong job token");
  for (int i = 0; i < options.pings; ++i) {
    uint64_t ping = 0;
    tcp::recvAll(fd.get(), &ping, sizeof(ping), deadline, what);
    tcp::sendAll(fd.get(), &ping, sizeof(ping), deadline, what);
  }
  std::vector<char> buffer(1 << 20);
  uint64_t bytes = 0;
  Clock::time_point first{};
  while (true) {
    const ssize_t n = ::recv(fd.get(), buffer.data(), buffer.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw PeerLostError(what + ": " + tcp::errnoText(errno));
    if (n == 0) break;
    if (bytes == 0) first = Clock::now();
    bytes += static_cast<uint64_t>(n);
    if (Clock::now() > deadline) throw TimeoutError(what + ": stream did not end in time");
  }
  const uint64_t reply[2] = {
      bytes,
      static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - first).count())};
  tcp::sendAll(fd.get(), reply, sizeof(reply), deadline, what);
}

// Client side of one rail.
Measurement probeRail(const Rail& rail, uint16_t port, const ProbeOptions& options,
                      const std::string& what) {
  const Deadline deadline = deadlineAfter(options.timeout + options.bulk_time);
  const tcp::SockAddr source = tcp::resolve(tcp::joinHostPort(rail.address_a, 0), what);
  tcp::Fd fd = tcp::connectWithRetry(tcp::resolve(tcp::joinHostPort(rail.address_b, port), what),
                                     deadline, what, &source);
  const auto length = static_cast<uint32_t>(options.token.size());
  tcp::sendAll(fd.get(), &length, sizeof(length), deadline, what);
  tcp::sendAll(fd.get(), options.token.data(), length, deadline, what);
  std::vector<double> rtts;
  for (int i = 0; i < options.pings; ++i) {
    uint64_t ping = static_cast<uint64_t>(i);
    const auto start = Clock::now();
    tcp::sendAll(fd.get(), &ping, sizeof(ping), deadline, what);
    tcp::recvAll(fd.get(), &ping, sizeof(ping), deadline, what);
    rtts.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  std::vector<char> buffer(256 << 10, 'r');
  const Deadline stop = Clock::now() + options.bulk_time;
  while (Clock::now() < stop) tcp::sendAll(fd.get(), buffer.data(), buffer.size(), deadline, what);
  ::shutdown(fd.get(), SHUT_WR);
  uint64_t reply[2] = {0, 0};
  tcp::recvAll(fd.get(), reply, sizeof(reply), deadline, what);
  Measurement m;
  std::nth_element(rtts.begin(), rtts.begin() + static_cast<long>(rtts.size() / 2), rtts.end());
  m.latency_us = rtts.empty() ? 0 : rtts[rtts.size() / 2] / 2;
  m.gbps = reply[1] == 0 ? 0 : static_cast<double>(reply[0]) * 8 / static_cast<double>(reply[1]);
  return m;
}

std::vector<Rail> probeableRails(const Topology& graph, const std::string& a,
                                 const std::string& b) {
  std::vector<Rail> result;
  for (const Rail& rail : graph.rails(a, b)) {
    if (!rail.address_a.empty() && !rail.address_b.empty()) result.push_back(rail);
  }
  return result;
}

// All host leaders meet here after each round, so a server never sees the next round's
// client while it still waits for this round's.
void roundBarrier(Store& store, const ProbeOptions& options, size_t round, int hosts) {
  const std::string key = options.key_prefix + "/round/" + std::to_string(round);
  if (store.add(key, 1, options.timeout) == hosts)
    store.setString(key + "/done", "1", options.timeout);
  store.get(key + "/done", options.timeout);
}

}  // namespace

std::vector<std::vector<std::pair<int, int>>> probeSchedule(int hosts) {
  std::vector<std::vector<std::pair<int, int>>> rounds;
  if (hosts < 2) return rounds;
  const int m = hosts % 2 == 0 ? hosts : hosts + 1;  // an odd count gets a "bye" slot
  std::vector<int> seat(static_cast<size_t>(m));
  for (int i = 0; i < m; ++i) seat[static_cast<size_t>(i)] = i;
  for (int r = 0; r < m - 1; ++r) {
    std::vector<std::pair<int, int>> pairs;
    for (int i = 0; i < m / 2; ++i) {
      const int x = seat[static_cast<size_t>(i)];
      const int y = seat[static_cast<size_t>(m - 1 - i)];
      if (x < hosts && y < hosts) pairs.emplace_back(std::min(x, y), std::max(x, y));
    }
    std::sort(pairs.begin(), pairs.end());
    rounds.push_back(pairs);
    // Keep seat 0, rotate the rest by one.
    std::rotate(seat.begin() + 1, seat.end() - 1, seat.end());
  }
  return rounds;
}

namespace {

// Hosts where ranks run, in canonical order: a host without ranks (one a topology file lists,
// or one whose ranks were all lost) has nobody to take part.
std::vector<std::string> probedHosts(const Topology& graph) {
  std::vector<std::string> hosts;
  for (const auto& host : graph.hosts()) {
    if (!graph.ranksOn(host).empty()) hosts.push_back(host);
  }
  return hosts;
}

}  // namespace

void runLinkProbe(Store& store, const Topology& graph, const std::string& host,
                  const ProbeOptions& options) {
  const auto hosts = probedHosts(graph);
  const int me = static_cast<int>(std::find(hosts.begin(), hosts.end(), host) - hosts.begin());
  const auto schedule = probeSchedule(static_cast<int>(hosts.size()));
  for (size_t round = 0; round < schedule.size(); ++round) {
    for (const auto& [x, y] : schedule[round]) {
      if (x != me && y != me) continue;
      const std::string& a = hosts[static_cast<size_t>(x)];
      const std::string& b = hosts[static_cast<size_t>(y)];
      const auto rails = probeableRails(graph, a, b);
      if (y == me) {
        // Server: one listener per rail on the rail's own address, published by port.
        for (size_t i = 0; i < rails.size(); ++i) {
          const std::string what = "link probe " + b + " <- " + a + " over " + rails[i].nic_b;
          tcp::Fd listener =
              tcp::listenOn(tcp::resolve(tcp::joinHostPort(rails[i].address_b, 0), what));
          store.setString(pairKey(options, a, b) + "/port/" + std::to_string(i),
                          std::to_string(tcp::localAddress(listener.get()).port()),
                          options.timeout);
          serveRail(listener.get(), options, what);
        }
      } else {
        nlohmann::json results = nlohmann::json::array();
        for (size_t i = 0; i < rails.size(); ++i) {
          const Rail& rail = rails[i];
          const std::string what = "link probe " + a + " -> " + b + " over " + rail.nic_a + " (" +
                                   rail.address_a + " -> " + rail.address_b + ")";
          const int port = std::stoi(store.getString(
              pairKey(options, a, b) + "/port/" + std::to_string(i), options.timeout));
          const Measurement m = probeRail(rail, static_cast<uint16_t>(port), options, what);
          RS_LOG_INFO("{}: {:.3f} Gbit/s, {:.1f} us", what, m.gbps, m.latency_us);
          results.push_back({{"nic_a", rail.nic_a},
                             {"nic_b", rail.nic_b},
                             {"kind", std::string(topology::name(rail.kind))},
                             {"nominal_gbps", rail.nominal_gbps},
                             {"gbps", m.gbps},
                             {"latency_us", m.latency_us}});
        }
        store.setString(pairKey(options, a, b), results.dump(), options.timeout);
      }
    }
    roundBarrier(store, options, round, static_cast<int>(hosts.size()));
  }
}

void collectProbeResults(Store& store, Topology& graph, const ProbeOptions& options) {
  const auto hosts = probedHosts(graph);
  for (const auto& round : probeSchedule(static_cast<int>(hosts.size()))) {
    for (const auto& [x, y] : round) {
      const std::string& a = hosts[static_cast<size_t>(x)];
      const std::string& b = hosts[static_cast<size_t>(y)];
      const auto results =
          nlohmann::json::parse(store.getString(pairKey(options, a, b), options.timeout));
      for (const auto& r : results) {
        topology::Link link;
        link.a = r.at("nic_a").get<std::string>();
        link.b = r.at("nic_b").get<std::string>();
        if (!topology::parse(r.at("kind").get<std::string>(), link.kind)) {
          throw ProtocolError("link probe: unknown rail kind in results of " + a + " -> " + b);
        }
        link.nominal_gbps = r.at("nominal_gbps").get<double>();
        // Rounded so the graph (and its hash) does not carry meaningless digits.
        link.measured_gbps = std::round(r.at("gbps").get<double>() * 1000) / 1000;
        link.latency_us = std::round(r.at("latency_us").get<double>() * 10) / 10;
        // A grown generation probes again over a graph that holds the earlier measurements.
        const auto earlier = graph.linksOf(link.a);
        const bool measured_before = std::any_of(earlier.begin(), earlier.end(), [&](auto* l) {
          return l->kind == link.kind && (l->a == link.b || l->b == link.b);
        });
        if (measured_before) {
          graph.setMeasurement(link.a, link.b, link.kind, link.measured_gbps, link.latency_us);
        } else {
          graph.addLink(link);
        }
      }
    }
  }
}

}  // namespace railshard::launcher
