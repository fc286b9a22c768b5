#pragma once

#include <stdexcept>
#include <string>

namespace railshard {

// Every error railshard raises derives from Error, so callers can catch one type. The
// subclasses tell *what kind* of failure happened; the message says where and why.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// The caller passed something wrong (null buffer, bad root, unknown dtype...).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A deadline passed before the operation completed.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A peer process died, closed its connection or stopped answering.
class PeerLostError : public Error {
 public:
  using Error::Error;
};

// Ranks disagreed on what collective they were running (op, dtype, count, root, order).
class MismatchError : public Error {
 public:
  using Error::Error;
};

// The environment or configuration is missing, malformed or contradictory.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A peer sent bytes that violate the wire protocol.
class ProtocolError : public Error {
 public:
  using Error::Error;
};

// Wire-visible tag for forwarding an error of a given kind to other ranks.
enum class ErrorKind : uint8_t {
  kGeneric = 0,
  kInvalidArgument = 1,
  kTimeout = 2,
  kPeerLost = 3,
  kMismatch = 4,
  kConfig = 5,
  kProtocol = 6,
};

ErrorKind kindOf(const std::exception& error);
// Throws the exception class that matches `kind`, carrying `message`.
[[noreturn]] void throwError(ErrorKind kind, const std::string& message);
// std::exception_ptr holding an exception of the class that matches `kind`.
std::exception_ptr makeError(ErrorKind kind, const std::string& message);

}  // namespace railshard
