// --backend mpi: MPI_Allreduce on MPI_COMM_WORLD, the reference every HPC user knows. Runs
// under mpirun only; the backend owns MPI_Init and MPI_Finalize.
#include <climits>
#include <cstdlib>
#include <memory>
#include <string>

#include "base/error.h"
#include "benchmarks/perf_backend.h"
#include "kernels/reduce.h"

// C bindings only: the C++ ones are deprecated and would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

namespace railshard::bench {
namespace {

void check(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(std::string(call) + " failed: " + std::string(text, static_cast<size_t>(length)));
}

// float16 and bfloat16 have no MPI datatype (MPI 4.1 has none; Open MPI 4.1 no extension).
MPI_Datatype mpiType(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return MPI_FLOAT;
    case DataType::kFloat64:
      return MPI_DOUBLE;
    case DataType::kInt32:
      return MPI_INT32_T;
    case DataType::kInt64:
      return MPI_INT64_T;
    case DataType::kUInt8:
      return MPI_UINT8_T;
    case DataType::kFloat16:
    case DataType::kBFloat16:
      break;
  }
  return MPI_DATATYPE_NULL;
}

// MPI has no average: avg runs as MPI_SUM and each rank then divides its result locally
// (railshard's kernels::divide, the same rounding railshard's avg uses). The divide is
// inside the timed call, as it is inside railshard's.
MPI_Op mpiOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return MPI_SUM;
    case ReduceOp::kProd:
      return MPI_PROD;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kMax:
      return MPI_MAX;
  }
  return MPI_OP_NULL;
}

// "Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4".
std::string libraryVersion() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string version(text, static_cast<size_t>(length));
  const auto end = version.find_first_of(",\n");
  return end == std::string::npos ? version : version.substr(0, end);
}

class MpiBackend : public PerfBackend {
 public:
  MpiBackend() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      check(MPI_Init(nullptr, nullptr), "MPI_Init");
      owns_mpi_ = true;
    }
    // Return codes instead of aborting, so failures become a message from allreduce_perf.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // Started by railshard-launch instead of mpirun, every rank would be an MPI singleton
    // and each would time a one-rank "all-reduce": refuse rather than print nonsense.
    const char* launched = std::getenv("RAILSHARD_WORLD_SIZE");
    if (size_ == 1 && launched != nullptr && std::atoi(launched) > 1) {
      finalize();
      throw ConfigError(
          "--backend mpi must run under mpirun (this process is one of RAILSHARD_WORLD_SIZE=" +
          std::string(launched) + " ranks, but MPI_COMM_WORLD has 1): use mpirun -np N");
    }
    version_ = libraryVersion();
  }
  ~MpiBackend() override { finalize(); }

  std::string_view name() const override { return "mpi"; }
  std::string describe() const override {
    return "mpi (" + version_ + "), MPI_Allreduce on MPI_COMM_WORLD, " + std::to_string(size_) +
           " ranks; avg = MPI_SUM then a local divide";
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void checkSupported(DataType dtype, ReduceOp) const override {
    if (mpiType(dtype) == MPI_DATATYPE_NULL) {
      throwUnsupported(name(), "datatype " + std::string(railshard::name(dtype)),
                       "MPI has no 16-bit floating-point type");
    }
  }

  void allreduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op) override {
    if (count > static_cast<size_t>(INT_MAX)) {
      throw InvalidArgument("mpi backend: count " + std::to_string(count) +
                            " exceeds MPI's int count");
    }
    check(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(count),
                        mpiType(dtype), mpiOp(op), MPI_COMM_WORLD),
          "MPI_Allreduce");
    if (op == ReduceOp::kAvg) kernels::divide(recv, count, dtype, static_cast<size_t>(size_));
  }
  void barrier() override { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

  double combine(double value, Combine how) override {
    MPI_Op op = MPI_SUM;
    if (how == Combine::kRoot && rank_ != 0) value = 0;  // the sum is then rank 0's value
    if (how == Combine::kMin) op = MPI_MIN;
    if (how == Combine::kMax) op = MPI_MAX;
    check(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, op, MPI_COMM_WORLD), "MPI_Allreduce");
    return how == Combine::kAvg ? value / size_ : value;
  }
  int64_t sumInt64(int64_t value) override {
    check(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD),
          "MPI_Allreduce");
    return value;
  }

 private:
  void finalize() {
    if (!owns_mpi_) return;
    owns_mpi_ = false;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }

  bool owns_mpi_ = false;
  int rank_ = 0;
  int size_ = 1;
  std::string version_;
};

}  // namespace

std::unique_ptr<PerfBackend> makeMpiBackend(const PerfOptions&) {
  return std::make_unique<MpiBackend>();
}

}  // namespace railshard::bench
