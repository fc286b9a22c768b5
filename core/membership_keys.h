#pragma once

// What shrink() and grow() (core/communicator_shrink.cc, core/communicator_grow.cc) share
// about the store keys of a re-forming round: member lists as "0,2,3", and their call budget.
#include <chrono>
#include <sstream>
#include <string>
#include <vector>

namespace railshard::membership {

// One store call of a round (a set, an add, a read of a key the leader has just written).
constexpr auto kStoreCall = std::chrono::seconds(5);

inline std::string formatRanks(const std::vector<int>& ranks) {
  std::string list;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) list += ',';
    list += std::to_string(ranks[i]);
  }
  return list;
}

inline std::vector<int> parseRanks(const std::string& text) {
  std::vector<int> ranks;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) ranks.push_back(std::stoi(item));
  }
  return ranks;
}

}  // namespace railshard::membership
