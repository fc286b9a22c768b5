#pragma once

// Everything a user program needs: railshard::init(), Communicator, DataType, ReduceOp,
// Config, the error types and trace::flush() (RAILSHARD_TRACE, docs/tracing.md).
#include "base/config.h"
#include "base/error.h"
#include "base/trace.h"
#include "base/types.h"
#include "core/communicator.h"
#include "launcher/init.h"
