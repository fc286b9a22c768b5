#include "benchmarks/gloo_store.h"

#include <utility>

namespace railshard::bench {

GlooStore::GlooStore(std::shared_ptr<railshard::Store> store, std::string prefix,
                     std::chrono::milliseconds timeout)
    : store_(std::move(store)), prefix_(std::move(prefix)), timeout_(timeout) {}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  store_->set(prefixed(key), railshard::Store::Bytes(data.begin(), data.end()), timeout_);
}

std::vector<char> GlooStore::get(const std::string& key) {
  const railshard::Store::Bytes value = store_->get(prefixed(key), timeout_);
  return std::vector<char>(value.begin(), value.end());
}

void GlooStore::wait(const std::vector<std::string>& keys) {
  wait(keys, timeout_);
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& key : keys) full.push_back(prefixed(key));
  store_->wait(full, timeout);
}

}  // namespace railshard::bench
