// Process-level tests of the real railshard-launch binary: environment, store socket hand-off,
// output prefixing, failure handling and signal forwarding.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "launcher/job_token.h"
#include "launcher/line_prefixer.h"
#include "launcher/local_job.h"
#include "tests/test_util.h"

namespace {

using railshard::test::ProcessResult;
using railshard::test::runProcess;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

const std::string kLaunch = RAILSHARD_LAUNCH_BIN;
const std::string kProbe = std::string(RAILSHARD_BINARY_DIR) + "/tests/launch_probe";

// An empty RAILSHARD_TOKEN counts as unset, so a token in the test's own environment cannot
// leak into tests that expect a fresh one.
const std::map<std::string, std::string> kNoToken = {{"RAILSHARD_TOKEN", ""}};

ProcessResult launch(const std::vector<std::string>& args,
                     const std::map<std::string, std::string>& env = kNoToken,
                     std::chrono::milliseconds timeout = 20s) {
  std::vector<std::string> argv = {kLaunch};
  argv.insert(argv.end(), args.begin(), args.end());
  return runProcess(argv, env, timeout);
}

// "-n N /bin/sh -c SCRIPT" plus options before it.
std::vector<std::string> shellJob(int ranks, const std::string& script,
                                  const std::vector<std::string>& options = {}) {
  std::vector<std::string> args = {"-n", std::to_string(ranks)};
  args.insert(args.end(), options.begin(), options.end());
  args.insert(args.end(), {"/bin/sh", "-c", script});
  return args;
}

std::vector<std::string> linesOf(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Lines that carry a "[rank] " prefix, grouped by rank with the prefix removed.
std::map<int, std::vector<std::string>> byRank(const std::string& text) {
  static const std::regex kPrefixed(R"(\[(\d+)\] (.*))");
  std::map<int, std::vector<std::string>> ranks;
  std::smatch match;
  for (const auto& line : linesOf(text)) {
    if (std::regex_match(line, match, kPrefixed)) {
      ranks[std::stoi(match[1].str())].push_back(match[2].str());
    }
  }
  return ranks;
}

std::vector<std::string> words(const std::string& line) {
  std::vector<std::string> result;
  std::istringstream in(line);
  for (std::string word; in >> word;) result.push_back(word);
  return result;
}

// Alive and not a zombie: an orphaned grandchild may wait a while for init to reap it.
bool alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto paren = content.rfind(')');
  return paren == std::string::npos || paren + 2 >= content.size() || content[paren + 2] != 'Z';
}

bool goneWithin(pid_t pid, std::chrono::milliseconds patience) {
  const auto deadline = Clock::now() + patience;
  while (alive(pid)) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

bool isHexToken(const std::string& token) {
  return std::regex_match(token, std::regex("[0-9a-f]{32}"));
}

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string hostName() {
  char name[256] = {0};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

// The one line railshard-launch prints for the first failure, as a regex.
std::string failureLine(int rank, const std::string& how, const std::string& rest,
                        bool first = true) {
  return "railshard-launch: rank " + std::to_string(rank) + " on host " + hostName() +
         (first ? " failed first: " : " failed: ") + how + "; " + rest + "\n";
}

size_t countOf(const std::string& text, const std::string& needle) {
  size_t count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

std::string describe(const ProcessResult& r) {
  return "exit=" + std::to_string(r.exit_code) + " signal=" + std::to_string(r.signal) +
         " timed_out=" + std::to_string(r.timed_out) + "\nstdout:\n" + r.out + "\nstderr:\n" +
         r.err;
}

constexpr const char* kPrintEnv =
    "echo \"$RAILSHARD_RANK $RAILSHARD_WORLD_SIZE $RAILSHARD_LOCAL_RANK $RAILSHARD_STORE_ADDR "
    "$RAILSHARD_TOKEN ${RAILSHARD_STORE_FD:-none}\"";

// rank -> {rank, world size, local rank, store addr, token, store fd}
std::map<int, std::vector<std::string>> launchEnv(int ranks,
                                                  const std::map<std::string, std::string>& env,
                                                  const std::vector<std::string>& options = {}) {
  const ProcessResult r = launch(shellJob(ranks, kPrintEnv, options), env);
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  std::map<int, std::vector<std::string>> result;
  for (const auto& [rank, lines] : byRank(r.out)) {
    EXPECT_EQ(lines.size(), 1u) << describe(r);
    if (!lines.empty()) result[rank] = words(lines[0]);
  }
  return result;
}

void expectEnvironment(const std::map<int, std::vector<std::string>>& env, int ranks) {
  ASSERT_EQ(env.size(), static_cast<size_t>(ranks));
  const auto& first = env.begin()->second;
  ASSERT_EQ(first.size(), 6u);
  EXPECT_TRUE(std::regex_match(first[3], std::regex(R"(127\.0\.0\.1:[1-9]\d*)"))) << first[3];
  EXPECT_TRUE(isHexToken(first[4])) << first[4];
  for (const auto& [rank, values] : env) {
    ASSERT_EQ(values.size(), 6u);
    EXPECT_EQ(values[0], std::to_string(rank));
    EXPECT_EQ(values[1], std::to_string(ranks));
    EXPECT_EQ(values[2], std::to_string(rank));
    EXPECT_EQ(values[3], first[3]) << "every rank dials the same store";
    EXPECT_EQ(values[4], first[4]) << "every rank shares the job token";
    if (rank == 0) {
      EXPECT_NE(values[5], "none") << "rank 0 gets the store socket";
    } else {
      EXPECT_EQ(values[5], "none") << "rank " << rank << " must not get the store socket";
    }
  }
}

TEST(LaunchTest, EnvironmentOfASingleRank) {
  expectEnvironment(launchEnv(1, kNoToken), 1);
}

TEST(LaunchTest, EnvironmentOfFourRanks) {
  expectEnvironment(launchEnv(4, kNoToken), 4);
}

TEST(LaunchTest, FreshTokenPerJobUnlessOneIsGiven) {
  const auto first = launchEnv(2, kNoToken);
  const auto second = launchEnv(2, kNoToken);
  ASSERT_FALSE(first.empty());
  ASSERT_FALSE(second.empty());
  EXPECT_NE(first.at(0).at(4), second.at(0).at(4));

  const auto given = launchEnv(3, {{"RAILSHARD_TOKEN", "token-from-the-user"}});
  ASSERT_EQ(given.size(), 3u);
  for (const auto& [rank, values] : given) EXPECT_EQ(values.at(4), "token-from-the-user");
}

TEST(LaunchTest, LaunchVariablesFromAnEnclosingJobAreReplaced) {
  const auto env = launchEnv(2, {{"RAILSHARD_TOKEN", ""},
                                 {"RAILSHARD_STORE_FD", "99"},
                                 {"RAILSHARD_RANK", "7"},
                                 {"RAILSHARD_STORE_ADDR", "10.0.0.1:1"}});
  expectEnvironment(env, 2);
}

TEST(LaunchTest, StorePortOption) {
  const int port = railshard::test::freePort();
  const auto env = launchEnv(2, kNoToken, {"--store-port", std::to_string(port)});
  ASSERT_EQ(env.size(), 2u);
  EXPECT_EQ(env.at(1).at(3), "127.0.0.1:" + std::to_string(port));
}

bool haveProbe() {
  return ::access(kProbe.c_str(), X_OK) == 0;
}

TEST(LaunchTest, StoreFdIsAListeningSocketOnTheAdvertisedPortInRankZeroOnly) {
  if (!haveProbe()) GTEST_SKIP() << "build the launch_probe target first: " << kProbe;
  const ProcessResult r = launch({"-n", "3", kProbe});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const auto ranks = byRank(r.out);
  ASSERT_EQ(ranks.size(), 3u) << describe(r);
  const std::regex rank0(
      R"(rank=0 store_fd=(\d+) listening=(\d+) port_match=yes launcher_copy=closed)");
  std::smatch match;
  ASSERT_TRUE(std::regex_match(ranks.at(0).at(0), match, rank0)) << describe(r);
  EXPECT_EQ(match[1].str(), match[2].str()) << "the only listening socket is the store's";
  EXPECT_EQ(ranks.at(1).at(0), "rank=1 store_fd=none listening=none");
  EXPECT_EQ(ranks.at(2).at(0), "rank=2 store_fd=none listening=none");
}

TEST(LaunchTest, OtherRanksReachRankZeroThroughTheStoreSocket) {
  if (!haveProbe()) GTEST_SKIP() << "build the launch_probe target first: " << kProbe;
  const ProcessResult r = launch({"-n", "3", kProbe, "exchange"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const auto ranks = byRank(r.out);
  ASSERT_EQ(ranks.count(0), 1u) << describe(r);
  const std::set<std::string> got(ranks.at(0).begin(), ranks.at(0).end());
  EXPECT_EQ(got, (std::set<std::string>{"got: hello from rank 1", "got: hello from rank 2"}));
}

TEST(LaunchTest, PrefixesEveryLineAndFlushesPartialLastLines) {
  const ProcessResult r =
      launch(shellJob(2, "printf 'a\\nb\\nc'; printf 'e1\\ne2' >&2; printf 'e3\\n' >&2"));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const auto out = byRank(r.out);
  const auto err = byRank(r.err);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(out.at(rank), (std::vector<std::string>{"a", "b", "c"})) << describe(r);
    EXPECT_EQ(err.at(rank), (std::vector<std::string>{"e1", "e2e3"})) << describe(r);
  }
  EXPECT_EQ(linesOf(r.out).size(), 6u) << "nothing but prefixed lines:\n" << r.out;
  EXPECT_EQ(r.out.back(), '\n');
}

TEST(LaunchTest, NoPrefixPassesOutputThrough) {
  const ProcessResult r = launch(shellJob(1, "printf 'a\\nb'", {"--no-prefix"}));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.out, "a\nb");
}

TEST(LaunchTest, LinesOfDifferentRanksNeverInterleave) {
  // Long lines written in pieces, from four ranks at once.
  const std::string script =
      "x=0123456789abcdefghijklmnopqrstuvwxyz; x=$x$x$x$x$x$x$x$x; x=$x$x$x$x$x$x$x$x; i=0; "
      "while [ $i -lt 200 ]; do printf '%s:' $RAILSHARD_RANK; printf '%s' $x; echo; "
      "i=$((i+1)); done";
  const ProcessResult r = launch(shellJob(4, script));
  ASSERT_EQ(r.exit_code, 0) << describe(r).substr(0, 2000);
  std::string body;
  for (int i = 0; i < 64; ++i) body += "0123456789abcdefghijklmnopqrstuvwxyz";
  const auto lines = linesOf(r.out);
  EXPECT_EQ(lines.size(), 800u);
  std::map<int, int> counts;
  for (const auto& line : lines) {
    // "[r] r:" then the body, intact.
    const bool intact = line.size() == 6 + body.size() && line[0] == '[' && line[2] == ']' &&
                        line[3] == ' ' && line[4] == line[1] && line[5] == ':' &&
                        line.compare(6, std::string::npos, body) == 0;
    ASSERT_TRUE(intact) << "mangled line: " << line.substr(0, 200);
    ++counts[line[1] - '0'];
  }
  EXPECT_EQ(counts, (std::map<int, int>{{0, 200}, {1, 200}, {2, 200}, {3, 200}}));
}

TEST(LaunchTest, AllRanksSucceedingExitsZeroQuietly) {
  const ProcessResult r = launch(shellJob(3, "exit 0"));
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out, "");
}

TEST(LaunchTest, FailingRankStopsTheOthers) {
  const auto start = Clock::now();
  const ProcessResult r = launch(
      shellJob(4, "if [ $RAILSHARD_RANK = 2 ]; then exit 3; fi; exec sleep 30", {"--grace", "5"}));
  EXPECT_LT(secondsSince(start), 4.0) << "the sleeping ranks should go on SIGTERM";
  EXPECT_EQ(r.exit_code, 3) << describe(r);
  EXPECT_NE(r.err.find(failureLine(2, "exited with status 3", "it wrote nothing to stderr") +
                       "railshard-launch: stopping the other 3 ranks\n"),
            std::string::npos)
      << describe(r);
}

TEST(LaunchTest, FirstFailureLineQuotesTheLastErrorLineOfTheRank) {
  // The error, then what a program prints after it: a usage hint and a warning (neither is
  // the cause), blank lines, stdout.
  const ProcessResult r = launch(shellJob(
      3,
      "if [ $RAILSHARD_RANK = 2 ]; then echo 'earlier trouble: an Error' >&2; "
      "echo \"prog: unknown option '--speed'\" >&2; echo '(prog --help lists the options)' >&2; "
      "echo 'UserWarning: something about DDP' >&2; printf '  \\n\\n' >&2; "
      "echo 'on stdout, not quoted'; exit 3; fi; exec sleep 30"));
  EXPECT_EQ(r.exit_code, 3) << describe(r);
  // The rank's own lines come first, then exactly one failure line.
  const std::string line = failureLine(2, "exited with status 3",
                                       "its last error line: \"prog: unknown option '--speed'\"");
  const size_t at = r.err.find(line);
  ASSERT_NE(at, std::string::npos) << describe(r);
  EXPECT_LT(r.err.find("[2] (prog --help lists the options)\n"), at) << describe(r);
  EXPECT_EQ(countOf(r.err, " failed"), 1u) << describe(r);
}

TEST(LaunchTest, LooksLikeErrorTellsErrorsFromWarningsAndChatter) {
  using railshard::launcher::LinePrefixer;
  for (const char* error :
       {"RuntimeError: boom", "error: no such file", "terminate called after throwing an instance",
        "  what():  peer 3 lost", "Fatal Python error: Aborted",
        "dispatch_bench: unknown option "
        "'--speed'",
        "invalid value for --steps", "cannot bind 10.0.0.1:29500",
        "Segmentation fault (core dumped) -- abort"}) {
    EXPECT_TRUE(LinePrefixer::looksLikeError(error)) << error;
  }
  for (const char* chatter :
       {"(dispatch_bench --help lists the options)", "UserWarning: grad strides do not match",
        "  warnings.warn(", "step 12: loss 0.25", "Warning: an error might follow", ""}) {
    EXPECT_FALSE(LinePrefixer::looksLikeError(chatter)) << chatter;
  }
}

TEST(LaunchTest, FirstFailureLineNamesTheSignalThatKilledTheRank) {
  // The rank is sent SIGKILL by pid; the others then die of the SIGTERM that stops them,
  // which must not be reported as failures of their own.
  const ProcessResult r = launch(
      shellJob(3,
               "if [ $RAILSHARD_RANK = 1 ]; then echo \"rank 1 is pid $$\" >&2; kill -KILL $$; fi; "
               "exec sleep 30"));
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << describe(r);
  EXPECT_TRUE(std::regex_search(
      r.err,
      std::regex(
          failureLine(1, "killed by SIGKILL",
                      R"(it wrote no error line; its last line on stderr: "rank 1 is pid \d+")") +
          "railshard-launch: stopping the other 2 ranks\n")))
      << describe(r);
  EXPECT_EQ(countOf(r.err, " failed"), 1u) << describe(r);
}

TEST(LaunchTest, FailureLineWithoutPrefixStillQuotesTheRank) {
  const ProcessResult r =
      launch(shellJob(1, "printf 'no newline at the end' >&2; exit 7", {"--no-prefix"}));
  EXPECT_EQ(r.exit_code, 7) << describe(r);
  EXPECT_NE(r.err.find(failureLine(
                0, "exited with status 7",
                "it wrote no error line; its last line on stderr: \"no newline at the end\"")),
            std::string::npos)
      << describe(r);
}

// --elastic and --max-failures.

TEST(LaunchTest, ElasticSurvivorsCarryOnAndTheJobSucceeds) {
  const auto start = Clock::now();
  const ProcessResult r = launch(shellJob(4,
                                          "if [ $RAILSHARD_RANK = 2 ]; then "
                                          "echo 'rank 2 exiting on purpose' >&2; exit 3; fi; "
                                          "sleep 1.5; echo \"finished $RAILSHARD_STORE_EXTERNAL\"",
                                          {"--elastic"}));
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_GE(secondsSince(start), 1.4) << "survivors must not be stopped";
  EXPECT_NE(
      r.err.find(
          failureLine(
              2, "exited with status 3",
              "it wrote no error line; its last line on stderr: \"rank 2 exiting on purpose\"") +
          "railshard-launch: continuing with 3 ranks (elastic, failure 1 of 1)\n"),
      std::string::npos)
      << describe(r);
  EXPECT_EQ(r.err.find("stopping"), std::string::npos) << describe(r);
  const auto out = byRank(r.out);
  for (const int rank : {0, 1, 3}) {
    ASSERT_EQ(out.count(rank), 1u) << "rank " << rank << " did not finish\n" << describe(r);
    EXPECT_EQ(out.at(rank), (std::vector<std::string>{"finished 1"})) << describe(r);
  }
}

TEST(LaunchTest, ElasticFailureBeyondMaxFailuresStopsTheJob) {
  const auto start = Clock::now();
  const ProcessResult r = launch(shellJob(4,
                                          "case $RAILSHARD_RANK in 1) exit 3;; "
                                          "2) sleep 0.5; echo 'second one' >&2; exit 4;; esac; "
                                          "exec sleep 30",
                                          {"--max-failures", "1", "--grace", "5"}));
  EXPECT_LT(secondsSince(start), 5.0) << "the sleeping ranks should go on SIGTERM";
  EXPECT_EQ(r.exit_code, 3) << "the first failure's status\n" << describe(r);
  EXPECT_NE(r.err.find(failureLine(1, "exited with status 3", "it wrote nothing to stderr") +
                       "railshard-launch: continuing with 3 ranks (elastic, failure 1 of 1)\n"),
            std::string::npos)
      << describe(r);
  EXPECT_NE(
      r.err.find(failureLine(2, "exited with status 4",
                             "it wrote no error line; its last line on stderr: \"second one\"",
                             false) +
                 "railshard-launch: stopping the other 2 ranks (elastic: failure 2 is more "
                 "than --max-failures 1)\n"),
      std::string::npos)
      << describe(r);
}

TEST(LaunchTest, ElasticToleratesUpToMaxFailures) {
  const ProcessResult r = launch(shellJob(3,
                                          "case $RAILSHARD_RANK in 0) exit 3;; "
                                          "1) sleep 0.3; kill -KILL $$;; esac; "
                                          "sleep 1.5; echo finished",
                                          {"--elastic", "--max-failures", "2"}));
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.err.find("continuing with 2 ranks (elastic, failure 1 of 2)"), std::string::npos)
      << describe(r);
  EXPECT_NE(r.err.find(failureLine(1, "killed by SIGKILL", "it wrote nothing to stderr", false) +
                       "railshard-launch: continuing with 1 rank (elastic, failure 2 of 2)\n"),
            std::string::npos)
      << describe(r);
  EXPECT_EQ(byRank(r.out)[2], (std::vector<std::string>{"finished"})) << describe(r);
}

// --min-ranks: any number of failures while enough ranks are left; the one that leaves
// fewer stops the job.
TEST(LaunchTest, MinRanksCarriesOnWhileEnoughAreLeftAndStopsBelow) {
  const ProcessResult r = launch(shellJob(4,
                                          "case $RAILSHARD_RANK in 1) exit 3;; "
                                          "2) sleep 0.3; exit 4;; 0) sleep 0.8; exit 5;; esac; "
                                          "exec sleep 30",
                                          {"--min-ranks", "2", "--grace", "5"}));
  EXPECT_EQ(r.exit_code, 3) << "the first failure's status\n" << describe(r);
  EXPECT_NE(r.err.find("railshard-launch: continuing with 3 ranks (elastic, failure 1, "
                       "--min-ranks 2)\n"),
            std::string::npos)
      << describe(r);
  EXPECT_NE(r.err.find("railshard-launch: continuing with 2 ranks (elastic, failure 2, "
                       "--min-ranks 2)\n"),
            std::string::npos)
      << describe(r);
  EXPECT_NE(r.err.find(failureLine(0, "exited with status 5", "it wrote nothing to stderr", false) +
                       "railshard-launch: stopping the other rank (elastic: 1 rank left, fewer "
                       "than --min-ranks 2)\n"),
            std::string::npos)
      << describe(r);
}

TEST(LaunchTest, MinRanksJobEndsWellWhenTheFloorHolds) {
  const ProcessResult r = launch(shellJob(3,
                                          "if [ $RAILSHARD_RANK = 0 ]; then exit 3; fi; "
                                          "sleep 1; echo finished",
                                          {"--min-ranks", "2"}));
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.err.find("continuing with 2 ranks (elastic, failure 1, --min-ranks 2)"),
            std::string::npos)
      << describe(r);
  const auto out = byRank(r.out);
  for (const int rank : {1, 2}) {
    EXPECT_EQ(out.at(rank), (std::vector<std::string>{"finished"})) << describe(r);
  }
}

TEST(LaunchTest, ElasticJobInWhichNoRankSucceedsFails) {
  const ProcessResult r =
      launch(shellJob(2, "if [ $RAILSHARD_RANK = 1 ]; then sleep 0.3; exit 6; fi; exit 5",
                      {"--max-failures", "3"}));
  EXPECT_EQ(r.exit_code, 5) << describe(r);
  EXPECT_NE(r.err.find("no rank left to continue with (elastic, failure 2 of 3)"),
            std::string::npos)
      << describe(r);
}

TEST(LaunchTest, ElasticRanksGetTheStoreAddressButNoSocket) {
  if (!haveProbe()) GTEST_SKIP() << "build the launch_probe target first: " << kProbe;
  const ProcessResult r = launch({"-n", "2", "--elastic", kProbe});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const auto ranks = byRank(r.out);
  ASSERT_EQ(ranks.size(), 2u) << describe(r);
  EXPECT_EQ(ranks.at(0).at(0), "rank=0 store_fd=none listening=none") << describe(r);
  EXPECT_EQ(ranks.at(1).at(0), "rank=1 store_fd=none listening=none") << describe(r);
}

TEST(LaunchTest, ElasticLauncherMarksTheLostRankInItsStore) {
  if (!haveProbe()) GTEST_SKIP() << "build the launch_probe target first: " << kProbe;
  const ProcessResult r = launch({"-n", "3", "--elastic", kProbe, "lost-mark", "1"});
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(
      r.err.find(failureLine(
          1, "exited with status 3",
          "it wrote no error line; its last line on stderr: \"rank 1 giving up on purpose\"")),
      std::string::npos)
      << describe(r);
  const auto ranks = byRank(r.out);
  for (const int rank : {0, 2}) {
    ASSERT_EQ(ranks.count(rank), 1u) << describe(r);
    EXPECT_EQ(ranks.at(rank), (std::vector<std::string>{"lost 1: exited with status 3"}))
        << describe(r);
  }
}

TEST(LaunchTest, RankKilledBySignalIsNamedWithTheSignal) {
  const ProcessResult r =
      launch(shellJob(3, "if [ $RAILSHARD_RANK = 1 ]; then kill -KILL $$; fi; exec sleep 30"));
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << describe(r);
  EXPECT_NE(r.err.find(failureLine(1, "killed by SIGKILL", "it wrote nothing to stderr") +
                       "railshard-launch: stopping the other 2 ranks\n"),
            std::string::npos)
      << describe(r);
}

TEST(LaunchTest, RankIgnoringSigtermIsKilledAfterTheGracePeriod) {
  const auto start = Clock::now();
  const ProcessResult r = launch(shellJob(
      2, "if [ $RAILSHARD_RANK = 0 ]; then sleep 0.5; exit 1; fi; trap '' TERM; exec sleep 30",
      {"--grace", "0.5"}));
  const double elapsed = secondsSince(start);
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_GE(elapsed, 0.9);
  EXPECT_LT(elapsed, 5.0);
  EXPECT_NE(r.err.find("stopping the other rank"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("1 rank still running 0.5 s after being asked to stop; killing it"),
            std::string::npos)
      << describe(r);
}

TEST(LaunchTest, SigtermToTheLauncherStopsEveryRankAndItsChildren) {
  char dir_template[] = "/tmp/launch_test.XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  // Each rank reports itself and a child of its own, then waits; rank 0, once all four are
  // up, sends SIGTERM to its parent, the launcher.
  const std::string script = "sleep 30 & echo pid $!; echo pid $$; touch " + dir +
                             "/$RAILSHARD_RANK; "
                             "if [ $RAILSHARD_RANK = 0 ]; then "
                             "  while [ $(ls " +
                             dir +
                             " | wc -l) -lt 4 ]; do sleep 0.02; done; kill -TERM $PPID; "
                             "fi; wait";
  const auto start = Clock::now();
  const ProcessResult r = launch(shellJob(4, script));
  EXPECT_LT(secondsSince(start), 4.0);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << describe(r);
  EXPECT_NE(r.err.find("railshard-launch: received SIGTERM; forwarding it to 4 ranks"),
            std::string::npos)
      << describe(r);
  std::vector<pid_t> pids;
  for (const auto& [rank, lines] : byRank(r.out)) {
    for (const auto& line : lines) {
      const auto fields = words(line);
      if (fields.size() == 2 && fields[0] == "pid") pids.push_back(std::stoi(fields[1]));
    }
  }
  EXPECT_EQ(pids.size(), 8u) << describe(r);
  for (const pid_t pid : pids) EXPECT_TRUE(goneWithin(pid, 2s)) << "pid " << pid << " survived";
  std::system(("rm -rf " + dir).c_str());
}

TEST(LaunchTest, SigintToTheLauncherIsForwarded) {
  const ProcessResult r =
      launch(shellJob(2, "if [ $RAILSHARD_RANK = 0 ]; then kill -INT $PPID; fi; exec sleep 30"));
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << describe(r);
  EXPECT_NE(r.err.find("received SIGINT; forwarding it to 2 ranks"), std::string::npos)
      << describe(r);
}

TEST(LaunchTest, ArgumentsAfterTheProgramBelongToIt) {
  const ProcessResult r = launch({"-n", "1", "/bin/echo", "-n", "--no-prefix"});
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.out, "[0] --no-prefix\n");
  const ProcessResult dashed = launch({"-n", "1", "--", "/bin/echo", "hi"});
  EXPECT_EQ(dashed.out, "[0] hi\n") << describe(dashed);
}

TEST(LaunchTest, MissingProgramIsReported) {
  const ProcessResult r = launch({"-n", "2", "railshard-no-such-program"});
  EXPECT_EQ(r.exit_code, 127) << describe(r);
  EXPECT_NE(r.err.find("cannot execute 'railshard-no-such-program': No such file or directory"),
            std::string::npos)
      << describe(r);
}

struct UsageCase {
  std::vector<std::string> args;
  std::string problem;
};

TEST(LaunchTest, UsageErrorsExitTwoNamingTheProblem) {
  const std::vector<UsageCase> cases = {
      {{"/bin/true"}, "missing -n"},
      {{}, "missing -n"},
      {{"-n", "0", "/bin/true"}, "-n must be between 1 and 4096, got 0"},
      {{"-n", "-3", "/bin/true"}, "-n must be between 1 and 4096, got -3"},
      {{"-n", "5000", "/bin/true"}, "-n must be between 1 and 4096, got 5000"},
      {{"-n", "99999999999999999999", "/bin/true"}, "-n must be between 1 and 4096"},
      {{"-n", "two", "/bin/true"}, "-n expects a number of ranks, got 'two'"},
      {{"-n"}, "option -n needs a value"},
      {{"-n", "2"}, "no program given"},
      {{"-n", "2", "--"}, "no program given"},
      {{"--bogus", "-n", "1", "/bin/true"}, "unknown option '--bogus'"},
      {{"-n", "1", "--grace", "soon", "/bin/true"}, "--grace expects a number of seconds"},
      {{"-n", "1", "--store-port", "70000", "/bin/true"}, "--store-port"},
      {{"-n", "1", "--no-prefix=yes", "/bin/true"}, "option --no-prefix takes no value"},
      {{"-n", "1", "--elastic=yes", "/bin/true"}, "option --elastic takes no value"},
      {{"-n", "2", "--max-failures", "-1", "/bin/true"}, "--max-failures"},
      {{"-n", "2", "--max-failures", "many", "/bin/true"}, "--max-failures"},
      {{"-n", "2", "--max-failures"}, "option --max-failures needs a value"},
      {{"-n", "4", "--min-ranks", "0", "/bin/true"},
       "--min-ranks must be between 1 and -n (4), got 0"},
      {{"-n", "4", "--min-ranks", "5", "/bin/true"},
       "--min-ranks must be between 1 and -n (4), got 5"},
      {{"-n", "4", "--min-ranks", "two", "/bin/true"}, "--min-ranks"},
  };
  for (const auto& c : cases) {
    const ProcessResult r = launch(c.args, kNoToken, 5s);
    std::string joined;
    for (const auto& a : c.args) joined += " " + a;
    EXPECT_EQ(r.exit_code, 2) << "args:" << joined << "\n" << describe(r);
    EXPECT_NE(r.err.find(c.problem), std::string::npos) << "args:" << joined << "\n" << r.err;
    EXPECT_NE(r.err.find("usage: railshard-launch -n N"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  }
}

TEST(LaunchTest, HelpAndVersion) {
  const ProcessResult help = launch({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("usage: railshard-launch -n N"), std::string::npos) << help.out;
  for (const char* option : {"--store-host", "--store-port", "--grace", "--no-prefix", "--elastic",
                             "--max-failures", "--min-ranks", "railshard/lost/"}) {
    EXPECT_NE(help.out.find(option), std::string::npos) << option;
  }
  const ProcessResult version = launch({"--version"});
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_TRUE(std::regex_search(version.out, std::regex(R"(^railshard-launch .*\d+\.\d+)")))
      << version.out;
}

// The pieces, directly.

TEST(LinePrefixerTest, PrefixesWholeLinesAcrossChunks) {
  railshard::launcher::LinePrefixer prefixer("[3] ");
  std::string out;
  prefixer.feed("ab", out);
  EXPECT_EQ(out, "");
  prefixer.feed("c\nd\n\ne", out);
  EXPECT_EQ(out, "[3] abc\n[3] d\n[3] \n");
  EXPECT_TRUE(prefixer.hasPending());
  prefixer.finish(out);
  EXPECT_EQ(out, "[3] abc\n[3] d\n[3] \n[3] e\n");
  EXPECT_FALSE(prefixer.hasPending());
}

TEST(LinePrefixerTest, CutsOverlongLinesAndPassesThroughWithoutPrefix) {
  railshard::launcher::LinePrefixer capped("> ", 4);
  std::string out;
  capped.feed("0123456789", out);
  EXPECT_EQ(out, "> 0123\n> 4567\n");
  capped.finish(out);
  EXPECT_EQ(out, "> 0123\n> 4567\n> 89\n");

  railshard::launcher::LinePrefixer plain("");
  std::string raw;
  plain.feed("x\ny", raw);
  plain.finish(raw);
  EXPECT_EQ(raw, "x\ny");
}

TEST(LinePrefixerTest, RemembersTheLastNonBlankLineWhenAsked) {
  railshard::launcher::LinePrefixer quiet("[1] ");
  std::string out;
  quiet.feed("x\n", out);
  EXPECT_EQ(quiet.lastLine(), "") << "off unless asked";

  railshard::launcher::LinePrefixer prefixer("[1] ");
  prefixer.keepLastLine();
  prefixer.feed("first\nsec", out);
  EXPECT_EQ(prefixer.lastLine(), "first");
  prefixer.feed("ond \r\n\n   \n", out);
  EXPECT_EQ(prefixer.lastLine(), "second") << "without blank lines, trailing blanks or prefix";
  prefixer.feed("partial", out);
  EXPECT_EQ(prefixer.lastLine(), "second");
  prefixer.finish(out);
  EXPECT_EQ(prefixer.lastLine(), "partial");

  railshard::launcher::LinePrefixer plain("");
  plain.keepLastLine();
  plain.feed("a\nb", out);
  plain.finish(out);
  EXPECT_EQ(plain.lastLine(), "b");
}

TEST(DescribeEndingTest, StatusOrSignalName) {
  EXPECT_EQ(railshard::launcher::describeEnding(3, 0), "exited with status 3");
  EXPECT_EQ(railshard::launcher::describeEnding(0, SIGKILL), "killed by SIGKILL");
  EXPECT_EQ(railshard::launcher::describeEnding(0, SIGSEGV), "killed by SIGSEGV");
}

TEST(JobTokenTest, ThirtyTwoHexDigitsAndFresh) {
  const std::string a = railshard::launcher::makeJobToken();
  const std::string b = railshard::launcher::makeJobToken();
  EXPECT_TRUE(isHexToken(a)) << a;
  EXPECT_NE(a, b);
}

TEST(RankEnvironmentTest, ReplacesLaunchVariablesAndKeepsTheRest) {
  const auto env = railshard::launcher::rankEnvironment(
      {"PATH=/bin", "RAILSHARD_RANK=9", "RAILSHARD_STORE_FD=5", "RAILSHARD_TIMEOUT=3"},
      {1, 2, 1, 2}, "127.0.0.1:5000", "tok", -1);
  EXPECT_EQ(env, (std::vector<std::string>{"PATH=/bin", "RAILSHARD_TIMEOUT=3", "RAILSHARD_RANK=1",
                                           "RAILSHARD_WORLD_SIZE=2", "RAILSHARD_LOCAL_RANK=1",
                                           "RAILSHARD_STORE_ADDR=127.0.0.1:5000",
                                           "RAILSHARD_TOKEN=tok"}));
  const auto rank0 =
      railshard::launcher::rankEnvironment({}, {0, 2, 0, 2}, "127.0.0.1:5000", "tok", 7);
  EXPECT_EQ(rank0.back(), "RAILSHARD_STORE_FD=7");
}

TEST(RankEnvironmentTest, TorchVariablesFollowTheRankAndKeepTheUsersMaster) {
  const auto env =
      railshard::launcher::torchEnvironment({"PATH=/bin"}, {2, 4, 2, 4}, "127.0.0.1", 41234);
  EXPECT_EQ(env, (std::vector<std::string>{"RANK=2", "WORLD_SIZE=4", "LOCAL_RANK=2",
                                           "LOCAL_WORLD_SIZE=4", "MASTER_ADDR=127.0.0.1",
                                           "MASTER_PORT=41234", "OMP_NUM_THREADS=1"}));
  const auto users = railshard::launcher::torchEnvironment(
      {"MASTER_ADDR=10.0.0.1", "MASTER_PORT=5555", "RANK=7", "OMP_NUM_THREADS=2"}, {0, 2, 0, 2},
      "127.0.0.1", 41234);
  EXPECT_EQ(users, (std::vector<std::string>{"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0",
                                             "LOCAL_WORLD_SIZE=2"}));
  // One rank on its host keeps torch's default pool.
  const auto alone = railshard::launcher::torchEnvironment({}, {1, 2, 0, 1}, "127.0.0.1", 41234);
  EXPECT_EQ(std::count(alone.begin(), alone.end(), "OMP_NUM_THREADS=1"), 0);
}

TEST(RankEnvironmentTest, ElasticRanksAreToldTheStoreIsExternal) {
  const auto env = railshard::launcher::rankEnvironment(
      {"RAILSHARD_STORE_EXTERNAL=1"}, {0, 2, 0, 2}, "127.0.0.1:5000", "tok", -1, true);
  EXPECT_EQ(std::count(env.begin(), env.end(), "RAILSHARD_STORE_EXTERNAL=1"), 1);
  EXPECT_EQ(env.back(), "RAILSHARD_STORE_EXTERNAL=1");
  const auto plain = railshard::launcher::rankEnvironment({"RAILSHARD_STORE_EXTERNAL=1"},
                                                          {0, 2, 0, 2}, "127.0.0.1:5000", "tok", 7);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), "RAILSHARD_STORE_EXTERNAL=1"), 0)
      << "an enclosing job's setting must not leak into a normal one";
}

TEST(RankEnvironmentTest, ElasticRanksAreToldSoAndOthersAreNot) {
  const auto elastic = railshard::launcher::rankEnvironment(
      {"RAILSHARD_ELASTIC=1"}, {0, 2, 0, 2}, "127.0.0.1:5000", "tok", -1, true, true);
  EXPECT_EQ(std::count(elastic.begin(), elastic.end(), "RAILSHARD_ELASTIC=1"), 1);
  const auto plain = railshard::launcher::rankEnvironment({"RAILSHARD_ELASTIC=1"}, {0, 2, 0, 2},
                                                          "127.0.0.1:5000", "tok", -1, true, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), "RAILSHARD_ELASTIC=1"), 0)
      << "an enclosing elastic job's setting must not leak into a normal one";
}

}  // namespace
