#pragma once

#include <optional>
#include <string>

namespace railshard::bench {

// One option of a benchmark's command line: "--key=value", or "--key value" / "-k value" with
// the value in the next argument.
struct OptionArg {
  std::string key;
  std::string value;
};

// Reads the option at argv[i] and moves i past the argument(s) it used. nullopt when the
// value should be the next argument and there is none (each benchmark words its own error).
inline std::optional<OptionArg> readOption(int argc, char** argv, int& i) {
  const std::string arg = argv[i];
  const auto eq = arg.find('=');
  if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
    return OptionArg{arg.substr(0, eq), arg.substr(eq + 1)};
  }
  if (i + 1 >= argc) return std::nullopt;
  ++i;
  return OptionArg{arg, argv[i]};
}

}  // namespace railshard::bench
