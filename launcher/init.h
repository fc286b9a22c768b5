#pragma once

#include <memory>

#include "core/communicator.h"

namespace railshard {

// Builds the world communicator from whatever launched this process: railshard-launch or
// RAILSHARD_* variables set by hand, mpirun, Slurm or torchrun (see launcher/environment.h),
// or a single rank when nothing did. Rank 0 hosts the rendezvous store; everyone connects to
// it, exchanges addresses and forms the full mesh. Throws ConfigError for a bad environment,
// TimeoutError when peers do not show up within RAILSHARD_CONNECT_TIMEOUT.
std::unique_ptr<Communicator> init();

}  // namespace railshard
