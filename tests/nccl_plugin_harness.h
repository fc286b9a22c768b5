#pragma once

// Drives libnccl-net-railshard.so the way NCCL's proxy thread does: dlopen, the versioned
// struct NCCL 2.28 binds first (ncclNetPlugin_v11), non-blocking connect/accept loops, and
// test() polled until each request is done. No NCCL is needed: the harness is the client.

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "plugins/nccl/net_api.h"

namespace railshard::test {

namespace nccl = plugins::nccl;

// Every line the plugin logs through NCCL's logger.
inline std::mutex& logMutex() {
  static std::mutex mutex;
  return mutex;
}
inline std::vector<std::string>& logLines() {
  static std::vector<std::string> lines;
  return lines;
}
inline void captureLog(nccl::LogLevel level, unsigned long, const char*, int, const char* format,
                       ...) {
  char text[2048];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  std::lock_guard<std::mutex> lock(logMutex());
  logLines().push_back(std::to_string(static_cast<int>(level)) + " " + text);
}
inline bool logged(const std::string& what) {
  std::lock_guard<std::mutex> lock(logMutex());
  for (const auto& line : logLines()) {
    if (line.find(what) != std::string::npos) return true;
  }
  return false;
}
inline std::string allLogged() {
  std::lock_guard<std::mutex> lock(logMutex());
  std::string all;
  for (const auto& line : logLines()) all += line + "\n";
  return all;
}

struct LoadedPlugin {
  void* library = nullptr;
  nccl::NetV11* net = nullptr;
  void* ctx = nullptr;
};

// dlopen()s the built plugin (RTLD_LOCAL, as NCCL does) and runs init; fails the test
// with dlerror() when it cannot.
inline LoadedPlugin loadPlugin() {
  LoadedPlugin loaded;
  loaded.library = ::dlopen(RAILSHARD_NCCL_PLUGIN, RTLD_NOW | RTLD_LOCAL);
  EXPECT_NE(loaded.library, nullptr) << ::dlerror();
  if (loaded.library == nullptr) return loaded;
  loaded.net = static_cast<nccl::NetV11*>(::dlsym(loaded.library, "ncclNetPlugin_v11"));
  EXPECT_NE(loaded.net, nullptr);
  if (loaded.net == nullptr) return loaded;
  nccl::CommConfig config{-1};
  const nccl::Result r = loaded.net->init(&loaded.ctx, 1, &config, captureLog, nullptr);
  EXPECT_EQ(r, nccl::Result::kSuccess) << allLogged();
  return loaded;
}

// listen + connect/accept, each called again while it returns a NULL comm, as NCCL's proxy
// does; both in this thread (a host talking to itself), bounded by `limit`.
inline bool connectPair(const LoadedPlugin& p, int dev, void** send_comm, void** recv_comm,
                        std::chrono::seconds limit = std::chrono::seconds(20)) {
  char handle[nccl::kHandleBytes] = {};
  void* listen_comm = nullptr;
  if (p.net->listen(p.ctx, dev, handle, &listen_comm) != nccl::Result::kSuccess) return false;
  *send_comm = nullptr;
  *recv_comm = nullptr;
  const auto until = std::chrono::steady_clock::now() + limit;
  while ((*send_comm == nullptr || *recv_comm == nullptr) &&
         std::chrono::steady_clock::now() < until) {
    if (*send_comm == nullptr &&
        p.net->connect(p.ctx, dev, handle, send_comm, nullptr) != nccl::Result::kSuccess) {
      break;
    }
    if (*recv_comm == nullptr &&
        p.net->accept(listen_comm, recv_comm, nullptr) != nccl::Result::kSuccess) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  p.net->closeListen(listen_comm);
  return *send_comm != nullptr && *recv_comm != nullptr;
}

// Polls test() until done (true) or `limit` (false); sizes as test() reports them.
inline nccl::Result testUntilDone(const LoadedPlugin& p, void* request, int* sizes,
                                  std::chrono::seconds limit = std::chrono::seconds(30)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    int done = 0;
    const nccl::Result r = p.net->test(request, &done, sizes);
    if (r != nccl::Result::kSuccess) return r;
    if (done) return nccl::Result::kSuccess;
    std::this_thread::yield();
  }
  return nccl::Result::kInProgress;
}

// A byte pattern that differs per message and per offset.
inline std::vector<uint8_t> pattern(size_t bytes, int seed) {
  std::vector<uint8_t> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>(i * 131 + seed * 7 + (i >> 9));
  return data;
}

}  // namespace railshard::test
