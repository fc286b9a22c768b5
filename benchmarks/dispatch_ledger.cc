#include "benchmarks/dispatch_ledger.h"

#include <algorithm>
#include <string>

#include "base/error.h"
#include "base/fnv.h"

namespace railshard::bench {

std::vector<int32_t> Ledger::marks(uint64_t epoch_size,
                                   const std::vector<dispatch::Range>& ranges) {
  std::vector<int32_t> out(static_cast<size_t>(epoch_size), 0);
  for (const auto& range : ranges) {
    for (uint64_t i = range.begin; i < range.end && i < epoch_size; ++i) ++out[i];
  }
  return out;
}

void Ledger::commit(uint64_t epoch, uint64_t step, std::span<const int32_t> counts) {
  Entry entry{epoch, step, {}};
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] == 0) continue;
    const auto count = static_cast<uint64_t>(counts[i]);
    if (!entry.runs.empty() && entry.runs.back().end == i && entry.runs.back().count == count) {
      ++entry.runs.back().end;
    } else {
      entry.runs.push_back({i, i + 1, count});
    }
  }
  entries_.push_back(std::move(entry));
}

void Ledger::rollback(uint64_t committed) {
  std::erase_if(entries_, [&](const Entry& e) { return e.step >= committed; });
}

uint64_t Ledger::fingerprint() const {
  Fnv1a h;
  for (const Entry& e : entries_) {
    h.add(e.epoch).add(e.step);
    for (const Run& r : e.runs) h.add(r.begin).add(r.end).add(r.count);
  }
  return h.value();
}

namespace {

void put(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

uint64_t take(std::span<const uint8_t> bytes, size_t& at) {
  if (bytes.size() - at < 8) {
    throw ProtocolError("ledger: truncated at byte " + std::to_string(at) + " of " +
                        std::to_string(bytes.size()));
  }
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{bytes[at + static_cast<size_t>(i)]} << (8 * i);
  at += 8;
  return v;
}

}  // namespace

std::vector<uint8_t> Ledger::encode() const {
  std::vector<uint8_t> out;
  put(out, entries_.size());
  for (const Entry& e : entries_) {
    put(out, e.epoch);
    put(out, e.step);
    put(out, e.runs.size());
    for (const Run& r : e.runs) {
      put(out, r.begin);
      put(out, r.end);
      put(out, r.count);
    }
  }
  return out;
}

Ledger Ledger::decode(std::span<const uint8_t> bytes) {
  Ledger ledger;
  size_t at = 0;
  const uint64_t entries = take(bytes, at);
  for (uint64_t n = 0; n < entries; ++n) {
    Entry e;
    e.epoch = take(bytes, at);
    e.step = take(bytes, at);
    const uint64_t runs = take(bytes, at);
    if (runs > (bytes.size() - at) / 24) throw ProtocolError("ledger: run count too large");
    for (uint64_t r = 0; r < runs; ++r) {
      Run run;
      run.begin = take(bytes, at);
      run.end = take(bytes, at);
      run.count = take(bytes, at);
      e.runs.push_back(run);
    }
    ledger.entries_.push_back(std::move(e));
  }
  if (at != bytes.size()) throw ProtocolError("ledger: bytes left over");
  return ledger;
}

std::vector<Ledger::Epoch> Ledger::check(uint64_t epoch_size, uint64_t last_epoch,
                                         uint64_t last_assigned) const {
  std::vector<Epoch> out;
  for (uint64_t epoch = 0; epoch <= last_epoch; ++epoch) {
    Epoch e;
    e.epoch = epoch;
    e.expected = epoch == last_epoch ? last_assigned : epoch_size;
    std::vector<uint64_t> count(static_cast<size_t>(epoch_size), 0);
    for (const Entry& entry : entries_) {
      if (entry.epoch != epoch) continue;
      for (const Run& run : entry.runs) {
        for (uint64_t i = run.begin; i < run.end; ++i) {
          if (i < e.expected) {
            count[i] += run.count;
          } else {
            e.outside += run.count;
          }
        }
      }
    }
    for (uint64_t i = 0; i < e.expected; ++i) {
      e.once += count[i] == 1;
      e.missing += count[i] == 0;
      e.duplicated += count[i] > 1;
    }
    out.push_back(e);
  }
  return out;
}

}  // namespace railshard::bench
