#pragma once

// Everything a user program needs: railshard::init(), Communicator, DataType, ReduceOp,
// Config, the error types and trace::flush() (RAILSHARD_TRACE, docs/tracing.md).
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/base/trace.h"
#include "core/base/types.h"
#include "core/communicator.h"
#include "launcher/init.h"
