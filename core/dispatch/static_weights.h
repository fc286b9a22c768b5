#pragma once

#include <string>
#include <vector>

namespace railshard::topology {
class Topology;
}

namespace railshard::dispatch {

// Relative speed of a GPU model for weighted_round_robin before anything is measured: dense
// FP16/BF16 tensor throughput in TFLOP/s from the vendors' data sheets (a rough guide: real
// models reach different fractions of it). 0 for a model not in the table.
double gpuModelTflops(const std::string& model);

// Static weights for the ranks of `topology` (weighted_round_robin's DispatchOptions::weights):
// a rank with a GPU weighs its model's throughput (unknown models: the median of the known
// ones, or 1); a CPU-only rank weighs its host's cores divided among the host's ranks, scaled
// so that CPU ranks and GPU ranks are not compared (a cluster is one or the other: with GPU
// ranks present, CPU-only ranks get the smallest GPU weight). InvalidArgument when the graph
// places no ranks.
std::vector<double> weightsFromTopology(const topology::Topology& topology);

}  // namespace railshard::dispatch
