#pragma once

#include <vector>

#include "core/dispatch/dispatcher.h"

namespace railshard::dispatch {

// What an operator watches of the load balance (RAILSHARD_METRICS, RAILSHARD_METRICS_PORT),
// as gauges labelled rank=<this process's launch rank>: every dispatcher rank's share of the
// current step and its measured samples/s (shard_rank=<its number>), this rank's step, and
// this rank's own load signals as it last reported them -- queue, memory and its limit, GPU
// utilisation and memory, CPU quota and throttling, power and samples per joule, memory cap.
// Shared by the CollectiveDispatcher and the Python ThroughputSampler.
void exportMetrics(const Dispatcher& dispatcher, int my_rank, int my_launch_rank);

// Registers the gauges' help texts (once per process; later calls do nothing).
void describeMetrics();

}  // namespace railshard::dispatch
