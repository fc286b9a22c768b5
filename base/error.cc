#include "base/error.h"

namespace railshard {

ErrorKind kindOf(const std::exception& error) {
  // Most specific first: they all derive from Error.
  if (dynamic_cast<const InvalidArgument*>(&error)) return ErrorKind::kInvalidArgument;
  if (dynamic_cast<const TimeoutError*>(&error)) return ErrorKind::kTimeout;
  if (dynamic_cast<const PeerLostError*>(&error)) return ErrorKind::kPeerLost;
  if (dynamic_cast<const MismatchError*>(&error)) return ErrorKind::kMismatch;
  if (dynamic_cast<const ConfigError*>(&error)) return ErrorKind::kConfig;
  if (dynamic_cast<const ProtocolError*>(&error)) return ErrorKind::kProtocol;
  return ErrorKind::kGeneric;
}

void throwError(ErrorKind kind, const std::string& message) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      throw InvalidArgument(message);
    case ErrorKind::kTimeout:
      throw TimeoutError(message);
    case ErrorKind::kPeerLost:
      throw PeerLostError(message);
    case ErrorKind::kMismatch:
      throw MismatchError(message);
    case ErrorKind::kConfig:
      throw ConfigError(message);
    case ErrorKind::kProtocol:
      throw ProtocolError(message);
    case ErrorKind::kGeneric:
      break;
  }
  throw Error(message);
}

std::exception_ptr makeError(ErrorKind kind, const std::string& message) {
  try {
    throwError(kind, message);
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace railshard
