// A rank program for the mismatch tests: a short fixed sequence of collectives in which one
// rank (--bad-rank) calls something that disagrees with the others in one respect (--case).
// Every rank must raise MismatchError; which error each rank got, and its message, go to
// stderr as "rank R: MismatchError: <message>".
//
//   mismatch_check --case op|count|dtype|collective|order [--bad-rank R] [--expect-mismatch 1]
//
// Cases (the bad rank's second collective; everyone else runs allreduce float sum, count
// kCount):
//   op          allreduce float max
//   count       allreduce float sum, count 2 * kCount
//   dtype       allreduce int32 sum (same element size: only the header can tell)
//   collective  allgather float, send count kCount (same dtype and count: only the kind differs)
//   order       skips it and goes straight to the next collective (broadcast)
//
// Exit status: without --expect-mismatch, MismatchError is a failure (1) like any error, so
// ranks started by hand each show their own error and status. With --expect-mismatch 1 (under
// a launcher, which stops every rank once one fails) MismatchError is success (0). Either way
// 4 if the sequence finished without any error: the mismatch went unnoticed.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"
#include "launcher/init.h"

namespace {

constexpr size_t kCount = 1024;

}  // namespace

int main(int argc, char** argv) {
  std::string which;
  int bad_rank = 2;
  bool expect_mismatch = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    if (key == "--case") which = argv[i + 1];
    if (key == "--bad-rank") bad_rank = std::atoi(argv[i + 1]);
    if (key == "--expect-mismatch") expect_mismatch = std::atoi(argv[i + 1]) != 0;
  }
  if (which != "op" && which != "count" && which != "dtype" && which != "collective" &&
      which != "order") {
    std::fprintf(stderr, "mismatch_check: --case must be op|count|dtype|collective|order\n");
    return 64;
  }
  int rank = -1;
  try {
    auto comm = railshard::init();
    rank = comm->rank();
    const int size = comm->size();
    const bool bad = rank == bad_rank;
    std::vector<float> data(2 * kCount * static_cast<size_t>(size), 1.0f);
    std::vector<float> gathered(kCount * static_cast<size_t>(size));
    // 1: every rank agrees, so the mesh is up and the sequence numbers are in step before the
    // disagreement.
    comm->allreduce(data.data(), kCount, railshard::DataType::kFloat32, railshard::ReduceOp::kSum);
    if (data[0] != static_cast<float>(size)) {
      std::fprintf(stderr, "rank %d: wrong result of the agreed all-reduce\n", rank);
      return 2;
    }
    // 2: the disagreement.
    if (!bad) {
      comm->allreduce(data.data(), kCount, railshard::DataType::kFloat32,
                      railshard::ReduceOp::kSum);
    } else if (which == "op") {
      comm->allreduce(data.data(), kCount, railshard::DataType::kFloat32,
                      railshard::ReduceOp::kMax);
    } else if (which == "count") {
      comm->allreduce(data.data(), 2 * kCount, railshard::DataType::kFloat32,
                      railshard::ReduceOp::kSum);
    } else if (which == "dtype") {
      comm->allreduce(data.data(), kCount, railshard::DataType::kInt32, railshard::ReduceOp::kSum);
    } else if (which == "collective") {
      comm->allgather(data.data(), gathered.data(), kCount, railshard::DataType::kFloat32);
    }  // "order": the bad rank skips collective 2.
    // 3 and 4: agreed again, so a disagreement noticed late (or not at all) shows up as a
    // different error or as a normal finish.
    comm->broadcast(data.data(), kCount, railshard::DataType::kFloat32, 0);
    comm->barrier();
    std::fprintf(stderr, "rank %d: finished without any error (mismatch not detected)\n", rank);
    return 4;
  } catch (const railshard::MismatchError& e) {
    std::fprintf(stderr, "rank %d: MismatchError: %s\n", rank, e.what());
    return expect_mismatch ? 0 : 1;
  } catch (const railshard::PeerLostError& e) {
    std::fprintf(stderr, "rank %d: PeerLostError: %s\n", rank, e.what());
  } catch (const railshard::TimeoutError& e) {
    std::fprintf(stderr, "rank %d: TimeoutError: %s\n", rank, e.what());
  } catch (const railshard::Error& e) {
    std::fprintf(stderr, "rank %d: Error: %s\n", rank, e.what());
  }
  return 1;
}
