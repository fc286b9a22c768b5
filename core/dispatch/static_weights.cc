#include "core/dispatch/static_weights.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <utility>

#include "base/error.h"
#include "core/topology/topology.h"

namespace railshard::dispatch {

namespace {

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// Most specific names first: "a100" must not match "a10"'s entry and "h100 pcie" must win
// over "h100".
constexpr std::array<std::pair<const char*, double>, 16> kModels{{
    {"gb200", 2500},
    {"b200", 2250},
    {"h200", 989},
    {"h100 pcie", 756},
    {"h100", 989},
    {"a100", 312},
    {"l40s", 362},
    {"l40", 181},
    {"a40", 150},
    {"a30", 165},
    {"a10g", 70},
    {"a10", 125},
    {"l4", 121},
    {"v100", 125},
    {"t4", 65},
    {"mi300x", 1307},
}};

}  // namespace

double gpuModelTflops(const std::string& model) {
  const std::string name = lower(model);
  for (const auto& [key, tflops] : kModels) {
    const size_t at = name.find(key);
    if (at == std::string::npos) continue;
    // Whole token: "a10" must not match inside "a100".
    const size_t end = at + std::string(key).size();
    if (end < name.size() && std::isalnum(static_cast<unsigned char>(name[end]))) continue;
    return tflops;
  }
  return 0;
}

std::vector<double> weightsFromTopology(const topology::Topology& topology) {
  const int n = topology.worldSize();
  if (n == 0) throw InvalidArgument("weightsFromTopology: the topology places no ranks");
  std::vector<double> weights(static_cast<size_t>(n), 0);
  std::vector<double> known;
  for (int r = 0; r < n; ++r) {
    const auto& placement = topology.rank(r);
    if (placement.gpu.empty()) continue;
    weights[static_cast<size_t>(r)] = gpuModelTflops(topology.vertex(placement.gpu).name);
    if (weights[static_cast<size_t>(r)] > 0) known.push_back(weights[static_cast<size_t>(r)]);
  }
  double fill = 1;
  if (!known.empty()) {
    std::sort(known.begin(), known.end());
    fill = known[known.size() / 2];
  }
  const bool any_gpu = std::any_of(topology.ranks().begin(), topology.ranks().end(),
                                   [](const auto& p) { return !p.gpu.empty(); });
  double smallest_gpu = 0;
  for (int r = 0; r < n; ++r) {
    const auto& placement = topology.rank(r);
    double& w = weights[static_cast<size_t>(r)];
    if (!placement.gpu.empty()) {
      if (w == 0) w = fill;
      smallest_gpu = smallest_gpu == 0 ? w : std::min(smallest_gpu, w);
    }
  }
  for (int r = 0; r < n; ++r) {
    const auto& placement = topology.rank(r);
    if (!placement.gpu.empty()) continue;
    double& w = weights[static_cast<size_t>(r)];
    if (any_gpu) {
      w = smallest_gpu;
    } else {
      const int cores = std::max(topology.vertex(placement.host).cores, 1);
      const auto on_host = topology.ranksOn(placement.host).size();
      w = static_cast<double>(cores) / static_cast<double>(std::max<size_t>(on_host, 1));
    }
  }
  return weights;
}

}  // namespace railshard::dispatch
