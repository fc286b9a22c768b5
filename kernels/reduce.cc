// The public reduce()/divide(): validate, then call the chosen instruction set's kernel.
#include "kernels/reduce.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include "base/error.h"
#include "base/logging.h"
#include "base/trace.h"
#include "kernels/kernel_table.h"

namespace railshard::kernels {
namespace {

constexpr const char* kIsaVariable = "RAILSHARD_KERNEL_ISA";

const detail::KernelTable& tableFor(Isa isa, bool native_bf16) {
  switch (isa) {
    case Isa::kPortable:
      break;
    case Isa::kAvx2:
#ifdef RAILSHARD_KERNELS_HAVE_AVX2
      return detail::avx2Kernels();
#else
      break;
#endif
    case Isa::kAvx512:
#ifdef RAILSHARD_KERNELS_HAVE_AVX512
      return detail::avx512Kernels(native_bf16 && cpuFeatures().avx512bf16);
#else
      (void)native_bf16;
      break;
#endif
  }
  return detail::portableKernels();
}

// Set by the first reduce()/divide()/activeIsa() (from the environment) or by
// setIsaForTesting(); reduce() reads it on every call, so it is one relaxed-enough atomic
// load rather than a lock.
std::atomic<const detail::KernelTable*> g_active{nullptr};

const detail::KernelTable& chooseFromEnvironment() {
  const char* value = std::getenv(kIsaVariable);
  const Isa isa = isaFromSetting(value);
  RS_LOG_DEBUG("kernels: using {} ({}={}, cpu: {})", name(isa), kIsaVariable,
               value ? value : "(unset)", describe(cpuFeatures()));
  return tableFor(isa, true);
}

const detail::KernelTable& active() {
  if (const auto* table = g_active.load(std::memory_order_acquire)) return *table;
  // Initialised once, thread-safely; if the value is bad the exception propagates and the
  // next call reads the environment again (and throws again), so no call runs on a guess.
  static const detail::KernelTable& chosen = chooseFromEnvironment();
  const detail::KernelTable* expected = nullptr;
  g_active.compare_exchange_strong(expected, &chosen, std::memory_order_acq_rel);
  return *g_active.load(std::memory_order_acquire);
}

}  // namespace

Isa isaFromSetting(const char* value, const CpuFeatures& features) {
  const std::string text = value ? value : "";
  std::string lowered = text;
  for (char& c : lowered) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (lowered.empty() || lowered == "auto") return bestIsa(features);
  const auto isa = parseIsa(text);
  if (!isa) {
    throw ConfigError(std::string(kIsaVariable) + ": unknown instruction set '" + text +
                      "' (expected portable, avx2, avx512 or auto; this CPU runs " +
                      runnableIsas(features) + ")");
  }
  if (!canRun(*isa, features)) {
    throw ConfigError(std::string(kIsaVariable) + "=" + text + ": this CPU (or build) cannot run " +
                      std::string(name(*isa)) + " kernels (CPU has: " + describe(features) +
                      "; it runs " + runnableIsas(features) + ")");
  }
  return *isa;
}

std::string_view activeIsa() {
  return active().name;
}

bool setIsaForTesting(Isa isa, bool native_bf16) {
  if (!canRun(isa)) return false;
  g_active.store(&tableFor(isa, native_bf16), std::memory_order_release);
  return true;
}

void reduce(void* dst, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op) {
  if (!isValid(dtype)) {
    throw InvalidArgument("reduce: invalid dtype " + std::to_string(static_cast<int>(dtype)));
  }
  int column = 0;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      column = detail::kTableSum;
      break;
    case ReduceOp::kProd:
      column = detail::kTableProd;
      break;
    case ReduceOp::kMin:
      column = detail::kTableMin;
      break;
    case ReduceOp::kMax:
      column = detail::kTableMax;
      break;
    default:
      throw InvalidArgument("reduce: invalid op " + std::to_string(static_cast<int>(op)));
  }
  if (count == 0) return;
  // Collectives set the thread's trace rank; a reduction outside one is not recorded.
  trace::Span span(trace::Category::kReduce, "reduce");
  if (span.active()) {
    span.event().bytes = count * sizeOf(dtype);
    span.event().dtype = static_cast<uint8_t>(dtype);
    span.event().op = static_cast<uint8_t>(op);
  }
  active().reduce[static_cast<int>(dtype)][column](dst, a, b, count);
}

void divide(void* data, size_t count, DataType dtype, size_t divisor) {
  if (divisor == 0) throw InvalidArgument("divide: divisor is 0");
  if (divisor > static_cast<size_t>(std::numeric_limits<int64_t>::max())) {
    throw InvalidArgument("divide: divisor " + std::to_string(divisor) + " is too large");
  }
  if (!isValid(dtype)) {
    throw InvalidArgument("divide: invalid dtype " + std::to_string(static_cast<int>(dtype)));
  }
  if (count == 0) return;
  // The vector tables leave integer division to the portable loops (x86 has no vector
  // integer divide, and avg divides once per collective, not once per step).
  detail::DivideFn fn = active().divide[static_cast<int>(dtype)];
  if (fn == nullptr) fn = detail::portableKernels().divide[static_cast<int>(dtype)];
  fn(data, count, divisor);
}

}  // namespace railshard::kernels
