// railshard-store: the rendezvous store of one job in a process of its own, so that it outlives
// every rank -- under mpirun, Slurm or torchrun, where rank 0 would otherwise host it and take
// it down when it dies. railshard-launch --elastic hosts the same store itself.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "base/config.h"
#include "base/error.h"
#include "launcher/job_token.h"
#include "launcher/tcp_store_server.h"
#include "transport/links/tcp/socket.h"

namespace {

constexpr const char* kName = "railshard-store";
constexpr int kUsageExit = 2;

constexpr const char* kHelp =
    "usage: railshard-store [--host ADDR] [--port PORT] [--token-file FILE]\n"
    "                       [--address-file FILE]\n"
    "\n"
    "Serves the rendezvous store of one job until SIGINT or SIGTERM, outside the ranks, so\n"
    "that no rank is a single point of failure: ranks started by mpirun, srun or torchrun\n"
    "with RAILSHARD_STORE_EXTERNAL=1, RAILSHARD_STORE_ADDR=HOST:PORT and the job's\n"
    "RAILSHARD_TOKEN use it, can shrink() when any of them dies (rank 0 included) and\n"
    "admit restarted ranks with grow() (RAILSHARD_JOIN=1). See docs/reliability.md.\n"
    "\n"
    "  --host ADDR          address to listen on (default 0.0.0.0: every interface)\n"
    "  --port PORT          port (default 29400; 0: any free port)\n"
    "  --token-file FILE    the job token, read from FILE (default: RAILSHARD_TOKEN; when\n"
    "                       neither is set a fresh token is made and printed)\n"
    "  --address-file FILE  once listening, write HOST:PORT (and the token, when it was\n"
    "                       made here) to FILE, for scripts that start it in the background\n"
    "  -h, --help\n"
    "\n"
    "Prints 'RAILSHARD_STORE_ADDR=HOST:PORT' on stdout once listening (and\n"
    "'RAILSHARD_TOKEN=...' when it made the token). Bad options exit with status 2.\n";

struct UsageError {
  std::string problem;
};

struct Arguments {
  std::string host = "0.0.0.0";
  uint16_t port = 29400;
  std::string token_file;
  std::string address_file;
  bool help = false;
};

Arguments parse(int argc, char** argv) {
  Arguments args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      args.help = true;
      continue;
    }
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError{arg + " needs a value"};
      return argv[++i];
    };
    if (arg == "--host") {
      args.host = value();
      if (args.host.empty()) throw UsageError{"--host needs an address"};
    } else if (arg == "--port") {
      try {
        args.port = static_cast<uint16_t>(railshard::parseInteger("--port", value(), 0, 65535));
      } catch (const railshard::Error& e) {
        throw UsageError{e.what()};
      }
    } else if (arg == "--token-file") {
      args.token_file = value();
    } else if (arg == "--address-file") {
      args.address_file = value();
    } else {
      throw UsageError{"unknown option '" + arg + "'"};
    }
  }
  return args;
}

std::string readToken(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw railshard::ConfigError("--token-file: cannot read '" + path + "'");
  std::string token;
  std::getline(in, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (token.empty()) throw railshard::ConfigError("--token-file: '" + path + "' is empty");
  return token;
}

// Written under a temporary name and renamed, so a reader never sees half of it.
void writeAddressFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
    if (!out) throw railshard::Error("--address-file: cannot write '" + tmp + "'");
  }
  std::filesystem::rename(tmp, path);
}

int serve(const Arguments& args) {
  std::string token;
  bool made = false;
  if (!args.token_file.empty()) {
    token = readToken(args.token_file);
  } else if (const char* env = std::getenv("RAILSHARD_TOKEN"); env != nullptr && *env != '\0') {
    token = env;
  } else {
    token = railshard::launcher::makeJobToken();
    made = true;
  }
  // Blocked before the server's thread starts, so that only sigwait() below takes them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  const auto addr = railshard::transport::links::tcp::resolve(
      railshard::transport::links::tcp::joinHostPort(args.host, args.port), "--host/--port");
  railshard::launcher::TcpStoreServer server(addr, token);
  // Listening everywhere: tell clients this host's name, which other hosts can reach.
  std::string host = args.host;
  if (host == "0.0.0.0" || host == "::") {
    char name[256] = {};
    if (::gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0') host = name;
  }
  const std::string where = railshard::transport::links::tcp::joinHostPort(host, server.port());
  std::printf("RAILSHARD_STORE_ADDR=%s\n", where.c_str());
  if (made) std::printf("RAILSHARD_TOKEN=%s\n", token.c_str());
  std::fflush(stdout);
  if (!args.address_file.empty()) {
    writeAddressFile(args.address_file, where + "\n" + (made ? token + "\n" : ""));
  }
  std::fprintf(stderr, "%s: serving on %s until SIGINT or SIGTERM\n", kName, where.c_str());
  int signal = 0;
  sigwait(&stop, &signal);
  std::fprintf(stderr, "%s: stopping (%s)\n", kName, signal == SIGINT ? "SIGINT" : "SIGTERM");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Arguments args;
  try {
    args = parse(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\nTry '%s --help' for more information.\n", kName,
                 e.problem.c_str(), kName);
    return kUsageExit;
  }
  if (args.help) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  try {
    return serve(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", kName, e.what());
    return 1;
  }
}
