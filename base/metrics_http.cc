#include "base/metrics_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "base/error.h"
#include "base/logging.h"
#include "base/metrics.h"

namespace railshard::metrics {

namespace {

constexpr int kRequestTimeoutMs = 5000;
constexpr size_t kMaxRequestBytes = 8192;

struct Server {
  std::mutex control;
  std::thread thread;
  int listener = -1;
  int wake[2] = {-1, -1};  // a byte here stops the loop
  pid_t owner = 0;         // a forked child (a DataLoader worker) has no thread to stop
};

Server& server() {
  static auto* s = new Server;  // never destroyed: stopped at exit by the atexit handler
  return *s;
}

void sendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;  // the scraper went away: its loss
    }
    sent += static_cast<size_t>(n);
  }
}

// Reads up to the end of the request head ("\r\n\r\n") within the timeout; "" when the client
// sent nothing usable.
std::string readHead(int fd) {
  std::string head;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kRequestTimeoutMs);
  char buffer[1024];
  while (head.find("\r\n\r\n") == std::string::npos && head.size() < kMaxRequestBytes) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) return "";
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return "";
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    head.append(buffer, static_cast<size_t>(n));
  }
  return head;
}

std::string response(int code, const char* reason, const std::string& type, const std::string& body,
                     bool with_body) {
  std::string out = "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\n";
  out += "Content-Type: " + type + "\r\n";
  out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  out += "Connection: close\r\n\r\n";
  if (with_body) out += body;
  return out;
}

void serve(int client) {
  const std::string head = readHead(client);
  const size_t line_end = head.find("\r\n");
  if (line_end == std::string::npos) return;
  // "GET /metrics HTTP/1.1"
  const std::string line = head.substr(0, line_end);
  const size_t space = line.find(' ');
  const size_t second = space == std::string::npos ? std::string::npos : line.find(' ', space + 1);
  if (second == std::string::npos) {
    sendAll(client, response(400, "Bad Request", "text/plain", "bad request\n", true));
    return;
  }
  const std::string method = line.substr(0, space);
  std::string path = line.substr(space + 1, second - space - 1);
  path = path.substr(0, path.find('?'));
  if (method != "GET" && method != "HEAD") {
    sendAll(client, response(405, "Method Not Allowed", "text/plain", "GET only\n", true));
    return;
  }
  if (path != "/metrics" && path != "/") {
    sendAll(client, response(404, "Not Found", "text/plain", "try /metrics\n", method == "GET"));
    return;
  }
  sendAll(client, response(200, "OK", "text/plain; version=0.0.4; charset=utf-8",
                           renderPrometheus(), method == "GET"));
}

void serveLoop(int listener, int wake) {
  while (true) {
    pollfd fds[2] = {{listener, POLLIN, 0}, {wake, POLLIN, 0}};
    const int ready = ::poll(fds, 2, -1);
    if (ready < 0) {
      if (errno == EINTR) continue;
      RS_LOG_WARN("metrics HTTP: poll failed: {}; no longer serving", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int client = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    try {
      serve(client);
    } catch (const std::exception& e) {
      RS_LOG_WARN("metrics HTTP: {}", e.what());
    }
    ::close(client);
  }
}

}  // namespace

int startHttpExporter(const std::string& host, int port) {
  if (port < 0 || port > 65535) {
    throw InvalidArgument("metrics HTTP: port " + std::to_string(port) + " is out of range");
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) {
    throw InvalidArgument("metrics HTTP: '" + host + "' is not an IPv4 address");
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error(std::string("metrics HTTP: socket: ") + std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(fd, 16) != 0) {
    const int error = errno;
    ::close(fd);
    throw Error("metrics HTTP: cannot listen on " + host + ":" + std::to_string(port) + ": " +
                std::strerror(error) + " (RAILSHARD_METRICS_PORT)");
  }
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  stopHttpExporter();
  Server& s = server();
  std::lock_guard<std::mutex> lock(s.control);
  if (::pipe2(s.wake, O_CLOEXEC) != 0) {
    ::close(fd);
    throw Error(std::string("metrics HTTP: pipe: ") + std::strerror(errno));
  }
  s.listener = fd;
  s.thread = std::thread(serveLoop, fd, s.wake[0]);
  s.owner = ::getpid();
  static std::once_flag at_exit;
  std::call_once(at_exit, [] { std::atexit([] { stopHttpExporter(); }); });
  return ntohs(address.sin_port);
}

void stopHttpExporter() {
  Server& s = server();
  std::lock_guard<std::mutex> lock(s.control);
  if (!s.thread.joinable()) return;
  if (s.owner != ::getpid()) {
    // A forked child: the thread is its parent's. Park the handle where nothing destroys it
    // (as the file exporter does) and leave the parent's socket alone.
    alignas(std::thread) static unsigned char orphan[sizeof(std::thread)];
    ::new (static_cast<void*>(orphan)) std::thread(std::move(s.thread));
    return;
  }
  const char byte = 1;
  ssize_t ignored = ::write(s.wake[1], &byte, 1);
  (void)ignored;
  if (s.thread.get_id() == std::this_thread::get_id()) {
    s.thread.detach();
  } else {
    s.thread.join();
  }
  for (int* fd : {&s.listener, &s.wake[0], &s.wake[1]}) {
    ::close(*fd);
    *fd = -1;
  }
}

}  // namespace railshard::metrics
