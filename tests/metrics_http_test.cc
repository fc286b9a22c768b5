// The metrics registry over HTTP (base/metrics_http.h: prometheus-cpp's exposer), spoken to
// over real sockets as a scraper would: GET /metrics returns what renderPrometheus() renders
// (plus the exposer's own scrape counters), other paths, methods and garbage their errors,
// and a client that sends nothing holds the server only for its timeout. A real Prometheus server
// scraping real ranks is tests/python/test_prometheus.py.
#include "base/metrics_http.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "base/error.h"
#include "base/metrics.h"

namespace railshard::metrics {
namespace {

using ::testing::HasSubstr;

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

// The status code of an HTTP response ("HTTP/1.x 200 OK..."), or 0 when there is none.
int statusOf(const std::string& answer) {
  if (answer.rfind("HTTP/1.", 0) != 0 || answer.size() < 12) return 0;
  return std::atoi(answer.c_str() + 9);
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
  const std::string answer =
      httpRequest(port_, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  ASSERT_EQ(statusOf(answer), 200) << answer;
  EXPECT_THAT(answer, HasSubstr("Content-Type: text/plain"));
  const std::string body = answer.substr(answer.find("\r\n\r\n") + 4);
  EXPECT_THAT(body, HasSubstr(renderPrometheus()));
  EXPECT_THAT(body, HasSubstr("railshard_test_total{rank=\"3\"} 7\n"));
  EXPECT_THAT(body, HasSubstr("railshard_test_gauge{rail=\"eth0\",rank=\"3\"} 0.25\n"));
  EXPECT_THAT(body, HasSubstr("# TYPE exposer_scrapes_total counter\n"));
  // A query string is ignored.
  EXPECT_EQ(statusOf(httpRequest(port_, "GET /metrics?x=1 HTTP/1.0\r\n\r\n")), 200);
}

TEST_F(MetricsHttp, OtherPathsOtherMethodsAndGarbageGetTheirAnswers) {
  set("railshard_test_gauge", {}, 1);
  EXPECT_EQ(statusOf(httpRequest(port_, "GET /admin HTTP/1.0\r\n\r\n")), 404);
  EXPECT_EQ(statusOf(httpRequest(port_, "GET / HTTP/1.0\r\n\r\n")), 404);
  const std::string post =
      httpRequest(port_, "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
  EXPECT_GE(statusOf(post), 400) << post;
  EXPECT_THAT(post, ::testing::Not(HasSubstr("railshard_test_gauge")));
  EXPECT_THAT(httpRequest(port_, "nonsense\r\n\r\n"), ::testing::Not(HasSubstr("200 OK")));
  // An oversized request head is cut off, not buffered without end.
  EXPECT_THAT(httpRequest(port_, std::string(100000, 'A')), ::testing::Not(HasSubstr("200 OK")));
  // And the server still answers.
  EXPECT_EQ(statusOf(httpRequest(port_, "GET /metrics HTTP/1.0\r\n\r\n")), 200);
}

TEST_F(MetricsHttp, AClientThatSendsNothingDoesNotHoldUpAScrape) {
  const int silent = connectTo(port_);
  ASSERT_GE(silent, 0);
  const auto start = std::chrono::steady_clock::now();
  const std::string answer = httpRequest(port_, "GET /metrics HTTP/1.0\r\n\r\n");
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(statusOf(answer), 200) << answer;
  // Served by the other thread at once; the silent one would be dropped after 5 s anyway.
  EXPECT_LT(waited, 4.0);
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
