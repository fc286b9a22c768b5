#pragma once

// The collective checks shared by the one-host and the several-hosts tests: every dtype x op x
// count, in place and out of place alternately, against the scalar reference of reference.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/types.h"
#include "core/communicator.h"
#include "tests/reference.h"

namespace railshard::test {

inline const std::vector<DataType>& allDataTypes() {
  static const std::vector<DataType> kAll = {
      DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
      DataType::kInt32,   DataType::kInt64,   DataType::kUInt8};
  return kAll;
}

inline const std::vector<ReduceOp>& allOps() {
  static const std::vector<ReduceOp> kAll = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin,
                                             ReduceOp::kMax, ReduceOp::kAvg};
  return kAll;
}

// The first few elements of `buffer` that differ from the reduction over `size` ranks of
// inputValue ("" when none); avg of floats within 1%.
inline std::string firstDifferences(const void* buffer, size_t count, int size, DataType dtype,
                                    ReduceOp op) {
  std::string failures;
  int reported = 0;
  for (size_t i = 0; i < count; ++i) {
    const double expected = expectedValue(size, i, dtype, op);
    const double got = loadValue(buffer, i, dtype);
    const double tolerance =
        (op == ReduceOp::kAvg && isFloat(dtype)) ? 1e-2 * std::fabs(expected) + 1e-6 : 0.0;
    if (std::fabs(got - expected) > tolerance && reported++ < 3) {
      failures += " [" + std::to_string(i) + "] got " + std::to_string(got) + " expected " +
                  std::to_string(expected) + ";";
    }
  }
  return failures;
}

// `count` elements of inputValue for `rank` (at least one byte, so data() is never null).
inline void fillInput(std::vector<uint8_t>& buffer, int rank, size_t count, DataType dtype,
                      ReduceOp op) {
  buffer.assign(std::max<size_t>(1, count * sizeOf(dtype)), 0);
  for (size_t i = 0; i < count; ++i) {
    storeValue(buffer.data(), i, dtype, inputValue(rank, i, dtype, op));
  }
}

// Every count x dtype x op on `comm`; throws naming the rank, the call and the differences.
// `ran(algorithm)` is called after each call with comm.lastAlgorithm() and throws when that is
// not what the test forced.
inline void checkEveryAllreduce(Communicator& comm, const std::vector<size_t>& counts,
                                const std::function<void(const std::string&)>& ran) {
  std::vector<uint8_t> input;
  std::vector<uint8_t> output;
  int variant = 0;
  for (size_t count : counts) {
    for (DataType dtype : allDataTypes()) {
      for (ReduceOp op : allOps()) {
        fillInput(input, comm.rank(), count, dtype, op);
        const bool in_place = (variant++ % 2) == 0;
        if (in_place) {
          comm.allreduce(input.data(), count, dtype, op);
        } else {
          output.assign(input.size(), 0xee);
          comm.allreduce(input.data(), output.data(), count, dtype, op);
        }
        const std::string failures = firstDifferences(in_place ? input.data() : output.data(),
                                                      count, comm.size(), dtype, op);
        if (!failures.empty()) {
          throw std::runtime_error("rank " + std::to_string(comm.rank()) + " count " +
                                   std::to_string(count) + " " + std::string(name(dtype)) + " " +
                                   std::string(name(op)) + (in_place ? " in-place" : "") + ":" +
                                   failures);
        }
        ran(std::string(comm.lastAlgorithm()));
      }
    }
  }
}

// Reduce-scatter of `block` elements per rank, every dtype x op, in place (recv inside send at
// this rank's block) and out of place alternately; throws naming the rank, the call and the
// first wrong element.
inline void checkEveryReduceScatter(Communicator& comm, const std::vector<size_t>& blocks) {
  const int size = comm.size();
  for (size_t block : blocks) {
    for (DataType dtype : allDataTypes()) {
      for (ReduceOp op : allOps()) {
        const size_t total = block * static_cast<size_t>(size);
        std::vector<uint8_t> input;
        fillInput(input, comm.rank(), total, dtype, op);
        std::vector<uint8_t> output(std::max<size_t>(1, block * sizeOf(dtype)), 0xee);
        const bool in_place = (block + static_cast<size_t>(dtype)) % 2 == 0;
        void* result =
            in_place ? input.data() + comm.rank() * block * sizeOf(dtype) : output.data();
        comm.reduceScatter(input.data(), result, block, dtype, op);
        for (size_t i = 0; i < block; ++i) {
          const size_t global = static_cast<size_t>(comm.rank()) * block + i;
          const double expected = expectedValue(size, global, dtype, op);
          const double got = loadValue(result, i, dtype);
          const double tolerance =
              (op == ReduceOp::kAvg && isFloat(dtype)) ? 1e-2 * std::fabs(expected) + 1e-6 : 0;
          if (std::fabs(got - expected) > tolerance) {
            throw std::runtime_error("reduce_scatter rank " + std::to_string(comm.rank()) +
                                     " block " + std::to_string(block) + " " +
                                     std::string(name(dtype)) + " " + std::string(name(op)) +
                                     (in_place ? " in-place" : "") + " element " +
                                     std::to_string(i) + ": got " + std::to_string(got) +
                                     " expected " + std::to_string(expected));
          }
        }
      }
    }
  }
}

// All-gather of `block` elements per rank, every dtype, in place (send inside recv at this
// rank's block) and out of place alternately: every rank's block lands at its place.
inline void checkEveryAllgather(Communicator& comm, const std::vector<size_t>& blocks) {
  const int size = comm.size();
  for (size_t block : blocks) {
    for (DataType dtype : allDataTypes()) {
      const size_t element = sizeOf(dtype);
      std::vector<uint8_t> mine(std::max<size_t>(1, block * element));
      for (size_t i = 0; i < block; ++i) {
        storeValue(mine.data(), i, dtype, inputValue(comm.rank(), i, dtype, ReduceOp::kMax));
      }
      std::vector<uint8_t> all(std::max<size_t>(1, block * element * static_cast<size_t>(size)),
                               0xee);
      const bool in_place = (block + static_cast<size_t>(dtype)) % 2 == 1;
      if (in_place) {
        std::memcpy(all.data() + comm.rank() * block * element, mine.data(), block * element);
        comm.allgather(all.data() + comm.rank() * block * element, all.data(), block, dtype);
      } else {
        comm.allgather(mine.data(), all.data(), block, dtype);
      }
      for (int r = 0; r < size; ++r) {
        for (size_t i = 0; i < block; ++i) {
          const double expected = inputValue(r, i, dtype, ReduceOp::kMax);
          const double got = loadValue(all.data(), static_cast<size_t>(r) * block + i, dtype);
          if (got != expected) {
            throw std::runtime_error("allgather rank " + std::to_string(comm.rank()) + " block " +
                                     std::to_string(block) + " " + std::string(name(dtype)) +
                                     (in_place ? " in-place" : "") + " from rank " +
                                     std::to_string(r) + " element " + std::to_string(i) +
                                     ": got " + std::to_string(got));
          }
        }
      }
    }
  }
}

}  // namespace railshard::test
