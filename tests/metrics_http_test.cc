// The metrics registry over HTTP (base/metrics_http.h), spoken to over real sockets as a
// scraper would: GET /metrics returns exactly what renderPrometheus() renders, HEAD its headers
// only, other paths and methods their errors, and a client that sends nothing holds the server
// only for its timeout. A real Prometheus server scraping real ranks is
// tests/python/test_prometheus.py.
#include "base/metrics_http.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "base/error.h"
#include "base/metrics.h"

namespace railshard::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

int connectTo(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` and reads until the server closes.
std::string httpRequest(int port, const std::string& request) {
  const int fd = connectTo(port);
  if (fd < 0) return "";
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string answer;
  char buffer[4096];
  ssize_t n;
  while ((n = ::recv(fd, buffer, sizeof(buffer), 0)) > 0)
    answer.append(buffer, static_cast<size_t>(n));
  ::close(fd);
  return answer;
}

class MetricsHttp : public ::testing::Test {
 protected:
  void SetUp() override {
    reset();
    port_ = startHttpExporter("127.0.0.1", 0);
  }
  void TearDown() override {
    stopHttpExporter();
    reset();
  }
  int port_ = 0;
};

TEST_F(MetricsHttp, GetMetricsAnswersWithTheRegistryInTheTextFormat) {
  describe("railshard_test_total", "counter", "A test counter.");
  add("railshard_test_total", {{"rank", "3"}}, 7);
  set("railshard_test_gauge", {{"rank", "3"}, {"rail", "eth0"}}, 0.25);
  const std::string answer = httpRequest(port_, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_THAT(answer, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(answer, HasSubstr("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  const std::string body = answer.substr(answer.find("\r\n\r\n") + 4);
  EXPECT_EQ(body, renderPrometheus());
  EXPECT_THAT(body, HasSubstr("railshard_test_total{rank=\"3\"} 7\n"));
  EXPECT_THAT(answer, HasSubstr("Content-Length: " + std::to_string(body.size()) + "\r\n"));
  // A query string is ignored; / is the same page.
  EXPECT_THAT(httpRequest(port_, "GET /?x=1 HTTP/1.0\r\n\r\n"), StartsWith("HTTP/1.1 200 OK"));
}

TEST_F(MetricsHttp, HeadOtherPathsOtherMethodsAndGarbageGetTheirAnswers) {
  set("railshard_test_gauge", {}, 1);
  const std::string head = httpRequest(port_, "HEAD /metrics HTTP/1.1\r\n\r\n");
  ASSERT_THAT(head, StartsWith("HTTP/1.1 200 OK"));
  EXPECT_EQ(head.substr(head.find("\r\n\r\n") + 4), "");
  EXPECT_THAT(httpRequest(port_, "GET /admin HTTP/1.1\r\n\r\n"),
              StartsWith("HTTP/1.1 404 Not Found"));
  EXPECT_THAT(httpRequest(port_, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
              StartsWith("HTTP/1.1 405 Method Not Allowed"));
  EXPECT_THAT(httpRequest(port_, "nonsense\r\n\r\n"), StartsWith("HTTP/1.1 400 Bad Request"));
  // An oversized request head is cut off, not buffered without end.
  EXPECT_THAT(httpRequest(port_, std::string(100000, 'A')), ::testing::Not(HasSubstr("200 OK")));
}

TEST_F(MetricsHttp, AClientThatSendsNothingHoldsTheServerOnlyForItsTimeout) {
  const int silent = connectTo(port_);
  ASSERT_GE(silent, 0);
  const auto start = std::chrono::steady_clock::now();
  const std::string answer = httpRequest(port_, "GET /metrics HTTP/1.1\r\n\r\n");
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 200 OK"));
  EXPECT_LT(waited, 8.0);  // the silent one is dropped after 5 s
  ::close(silent);
}

TEST(MetricsHttpStart, ABusyPortOrABadAddressIsAnErrorNamingIt) {
  const int port = startHttpExporter("127.0.0.1", 0);
  // A second server on the same port: replaced only after binding, so this one fails to bind.
  const int other = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
  try {
    startHttpExporter("127.0.0.1", port);
    ADD_FAILURE() << "expected Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("metrics HTTP: cannot listen on 127.0.0.1:" + std::to_string(port)));
    EXPECT_THAT(e.what(), HasSubstr("RAILSHARD_METRICS_PORT"));
  }
  ::close(other);
  EXPECT_THROW(startHttpExporter("not-an-address", 0), InvalidArgument);
  EXPECT_THROW(startHttpExporter("127.0.0.1", 70000), InvalidArgument);
  stopHttpExporter();
}

}  // namespace
}  // namespace railshard::metrics
