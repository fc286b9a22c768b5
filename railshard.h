#pragma once

// Everything a user program needs: railshard::init(), Communicator, DataType, ReduceOp,
// Config and the error types.
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/base/types.h"
#include "core/communicator.h"
#include "launcher/init.h"
