#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/store.h"

namespace railshard {

namespace topology {
class Topology;
}

// A generation that admits joiners agrees on a cluster graph extended by their hosts: the
// members know the cluster, each joiner only its own host. Discovery and the graph's exchange
// live in the launcher, above this layer, so the communicator is handed a function that does
// it (launcher::graphExtender(); init() and the torch backend set it). It runs on every rank of
// the new generation and returns the graph all of them agreed on.
struct GraphRound {
  std::string key_prefix;  // the new generation's store namespace
  int rank = 0;            // in the new generation
  int size = 0;
  int members = 0;  // ranks 0..members-1 were members before, the rest joined
  // Members: the cluster graph with the members placed as ranks 0..members-1; joiners: null.
  std::shared_ptr<const topology::Topology> known;
};
using GraphExtender =
    std::function<std::shared_ptr<const topology::Topology>(Store&, const GraphRound&)>;

// What a Communicator is made from (Communicator::Options).
struct CommunicatorOptions {
  int rank = 0;
  int size = 1;
  Config config;
  std::string key_prefix = "railshard";  // store namespace, distinct per communicator
  std::string advertise_host;            // address peers reach this rank at; "" = loopback
  // The cluster graph (launcher::buildClusterTopology); when set, it decides which ranks share
  // a host. Null: ranks compare host identities through the store.
  std::shared_ptr<const topology::Topology> topology;
  // The store the ranks rendezvoused through, kept for the communicator's lifetime: ranks
  // publish which collective they are in (so a timeout can say who never arrived), mark lost
  // peers, and shrink() re-forms through it. Null: none of that (errors still name the peer,
  // shrink() is an InvalidArgument).
  std::shared_ptr<Store> store;
  // Launch ("world") rank of each member, by rank; empty = 0..size-1. Set by shrink() and
  // grow().
  std::vector<int> world_ranks;
  int generation = 0;  // how many times the group was re-formed; set by shrink() and grow()
  // Store namespace shared by every generation (lost marks, shrink and grow rounds, joiners);
  // empty = key_prefix. Set by shrink() and grow(); a joiner names it.
  std::string key_root;
  // Launch ranks handed out so far (joiners get the next ones, so that a number, and the lost
  // mark that may carry it, never comes back); 0 = size. Set by grow().
  int launch_ranks = 0;
  // How a grow() with joiners (and a joiner's join()) agrees on the extended cluster graph;
  // carried into every later generation. Null: a generation with joiners compares host
  // identities through the store, without a graph (no rails from it).
  GraphExtender extend_topology;
};

}  // namespace railshard
