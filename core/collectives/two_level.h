#pragma once

#include <cstddef>

#include "base/types.h"
#include "core/collectives/context.h"
#include "core/collectives/host_layout.h"

namespace railshard::collectives {

class ShmEngine;

// Two-level all-reduce for several ranks per host (DESIGN.md): the ranks of each host meet in
// shared memory (`host`, over this rank's host's ranks), and only one rank per host and block
// crosses the network, so each host sends 2(H-1)/H of the message in all instead of the flat
// ring's 2(n-1)/n, and every local rank drives the rails at once. `ctx` is the whole
// communicator's (its transport reaches every rank; the cross-host steps run over views of
// it). Avg sums at both levels and divides once by the world size.
//
// Any failure inside the host (a peer's process gone, a header mismatch) is also sent to the
// other hosts through the transport, so that no rank waits there for its deadline.

// Large messages are cut into chunks whose phases overlap: the cross-host all-reduce of one
// chunk runs on a second thread while this one reduce-scatters the next chunk and gathers the
// one before inside the host (so the host's memory work hides behind the rails). Elements
// per chunk and how many chunks a count of `element`-byte elements makes (the tuner's model
// uses the same).
size_t twoLevelChunkElements(size_t count, size_t element);
size_t twoLevelChunks(size_t count, size_t element);

// `host` is null on a rank alone on its host: it skips the phases inside the host (every rank
// must still run the same algorithm, the cross-host steps need it).

// Large messages: reduce-scatter in the host, ring all-reduce of each block across hosts,
// all-gather in the host.
void twoLevelAllreduce(const Context& ctx, ShmEngine* host, const HostLayout& layout,
                       const void* send, void* recv, size_t count, DataType dtype, ReduceOp op);
// Small messages: every rank of a host reduces the host's whole sum (one synchronisation),
// then recursive doubling across hosts within each rank's group (directGroups); no final
// step inside the host. Needs count * size(dtype) <= host->slotBytes().
void twoLevelDirectAllreduce(const Context& ctx, ShmEngine* host, const HostLayout& layout,
                             const void* send, void* recv, size_t count, DataType dtype,
                             ReduceOp op);

// Small messages on hosts with more ranks than cores: the host's sum in shared memory (one
// synchronisation), then only each host's first rank crosses the network (recursive doubling
// over the hosts' leaders), and it broadcasts the result in the host. Against the direct
// variant: one more synchronisation in the host, and 1/L of its network messages — which,
// where L ranks share fewer than L cores, queue for them (each message wakes a thread).
// Needs count * size(dtype) <= host->slotBytes().
void twoLevelLeaderAllreduce(const Context& ctx, ShmEngine* host, const HostLayout& layout,
                             const void* send, void* recv, size_t count, DataType dtype,
                             ReduceOp op);

// Reduce-scatter (rank d gets block d of the reduced buffer): each host reduces its share of
// every block in shared memory at the block's handler (blockHandler), which sends it straight
// to the block's owner; the owner reduces the H-1 partial sums it receives with its host's.
void twoLevelReduceScatter(const Context& ctx, ShmEngine* host, const HostLayout& layout,
                           const void* send, void* recv, size_t recv_count, DataType dtype,
                           ReduceOp op);
// All-gather: every rank sends its block to its handler on every other host, and each host's
// ranks then share what they received (and their own blocks) in shared memory.
void twoLevelAllgather(const Context& ctx, ShmEngine* host, const HostLayout& layout,
                       const void* send, void* recv, size_t send_count, DataType dtype);

// The same result for small all-gathers across many hosts: the host's blocks are shared in
// shared memory, each host's first rank gathers every host's across (bruckAllgatherv over the
// leaders: 2 ceil(log2 H) peers each, where the direct form above has every rank send to one
// rank of every other host), and broadcasts the whole in the host. With connections made on
// first use this is what bounds a rank's sockets (the dispatcher gathers its reports every
// step): at 512 hosts x 8 ranks 511 peers per rank against at most 18 per leader.
void twoLevelLeaderAllgather(const Context& ctx, ShmEngine* host, const HostLayout& layout,
                             const void* send, void* recv, size_t send_count, DataType dtype);
// Whether an all-gather of `total_bytes` (the whole result) takes the leaders' path: over
// kLeaderAllgatherHosts hosts, and small enough for one rank per host to carry.
inline constexpr int kLeaderAllgatherHosts = 16;
inline constexpr size_t kLeaderAllgatherBytes = size_t{1} << 20;
inline bool allgatherThroughLeaders(const HostLayout& layout, size_t total_bytes) {
  return layout.hostCount() > kLeaderAllgatherHosts && total_bytes <= kLeaderAllgatherBytes;
}

// Broadcast: one rank per host carries the message across hosts (the root on its own host,
// local rank 0 elsewhere) in a chain, then each host's carrier broadcasts it in shared memory.
void twoLevelBroadcast(const Context& ctx, ShmEngine* host, const HostLayout& layout,
                       const void* send, void* recv, size_t count, DataType dtype, int root);
// Barrier: every host's ranks meet in shared memory, local rank 0 of every host in a
// dissemination barrier across hosts, then the host's ranks again (so none leaves before every
// rank of every host has arrived).
void twoLevelBarrier(const Context& ctx, ShmEngine* host, const HostLayout& layout);

}  // namespace railshard::collectives
