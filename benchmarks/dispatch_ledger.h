#pragma once

// dispatch_bench's per-sample ledger, built from what the ranks say they processed: each
// step every rank marks the sample ids it actually worked on, the marks are summed by an
// all-reduce that is part of the step (the step commits only after it), and every rank adds
// the summed counts of each committed step to its ledger. Nothing here comes from the plan,
// so a rank that processed samples it was not given, or skipped some, shows up.

#include <cstdint>
#include <span>
#include <vector>

#include "core/dispatch/dispatcher.h"

namespace railshard::bench {

class Ledger {
 public:
  // Per-sample marks of one step on one rank, for the all-reduce: 1 for each id in `ranges`.
  static std::vector<int32_t> marks(uint64_t epoch_size,
                                    const std::vector<dispatch::Range>& ranges);
  // A committed step: `counts` is the all-reduced sum of every rank's marks.
  void commit(uint64_t epoch, uint64_t step, std::span<const int32_t> counts);
  // Undoes the steps from `committed` on (a recovery rolled the model back).
  void rollback(uint64_t committed);
  // Equal on two ranks exactly when they committed and rolled back alike.
  uint64_t fingerprint() const;
  // As bytes, for a joiner (the first member's ledger after a grow), and back. decode throws
  // ProtocolError on bytes that are not a ledger.
  std::vector<uint8_t> encode() const;
  static Ledger decode(std::span<const uint8_t> bytes);

  struct Epoch {
    uint64_t epoch = 0;
    uint64_t expected = 0;  // samples that should be in it: [0, expected)
    uint64_t once = 0;
    uint64_t missing = 0;
    uint64_t duplicated = 0;  // samples processed in more than one committed step or rank
    uint64_t outside = 0;     // processed indices >= expected
    bool ok() const { return missing == 0 && duplicated == 0 && outside == 0 && once == expected; }
  };
  // Every epoch but the last must be whole; the last must be exactly the samples handed out
  // so far ([0, last_assigned)).
  std::vector<Epoch> check(uint64_t epoch_size, uint64_t last_epoch, uint64_t last_assigned) const;

 private:
  // Runs of equal nonzero counts of one step: [begin, end) each processed `count` times.
  struct Run {
    uint64_t begin = 0;
    uint64_t end = 0;
    uint64_t count = 0;
  };
  struct Entry {
    uint64_t epoch = 0;
    uint64_t step = 0;
    std::vector<Run> runs;
  };
  std::vector<Entry> entries_;
};

}  // namespace railshard::bench
