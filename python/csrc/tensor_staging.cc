#include "python/csrc/tensor_staging.h"

#include <chrono>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "kernels/cuda/device_runtime.h"

namespace railshard::python {

std::optional<DataType> nativeType(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return DataType::kFloat32;
    case at::kDouble:
      return DataType::kFloat64;
    case at::kHalf:
      return DataType::kFloat16;
    case at::kBFloat16:
      return DataType::kBFloat16;
    case at::kInt:
      return DataType::kInt32;
    case at::kLong:
      return DataType::kInt64;
    case at::kByte:
      return DataType::kUInt8;
    default:
      return std::nullopt;
  }
}

at::ScalarType wireType(at::ScalarType type, const char* collective) {
  if (nativeType(type)) return type;
  switch (type) {
    case at::kChar:
    case at::kShort:
    case at::kBool:
      return at::kInt;
    default:
      throw InvalidArgument(std::string("railshard ") + collective + ": dtype " +
                            c10::toString(type) +
                            " is not supported (float16/32/64, bfloat16, uint8, int8/16/32/64 "
                            "and bool are)");
  }
}

ReduceOp reduceOpFor(const c10d::ReduceOp& op, at::ScalarType type, const char* collective) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return ReduceOp::kSum;
    case c10d::ReduceOp::PRODUCT:
      return ReduceOp::kProd;
    case c10d::ReduceOp::MIN:
      return ReduceOp::kMin;
    case c10d::ReduceOp::MAX:
      return ReduceOp::kMax;
    case c10d::ReduceOp::AVG:
      if (type == at::kBool) {
        throw InvalidArgument(std::string("railshard ") + collective +
                              ": ReduceOp.AVG of a bool tensor has no meaning");
      }
      return ReduceOp::kAvg;
    default:
      break;
  }
  static const char* const kNames[] = {"SUM",  "AVG", "PRODUCT", "MIN",        "MAX",
                                       "BAND", "BOR", "BXOR",    "PREMUL_SUM", "UNUSED"};
  const auto index = static_cast<size_t>(op.op_);
  throw InvalidArgument(std::string("railshard ") + collective + ": ReduceOp." +
                        (index < 10 ? kNames[index] : "?") +
                        " is not supported (SUM, AVG, PRODUCT, MIN and MAX are)");
}

bool deviceCollectivesAvailable() {
  static const bool available = kernels::cuda::available();
  return available;
}

Staged::Staged(const at::Tensor& tensor, const char* collective, bool copy_in, bool device_ok)
    : original_(tensor) {
  const at::ScalarType wire = wireType(tensor.scalar_type(), collective);
  dtype_ = *nativeType(wire);
  const bool native = tensor.is_contiguous() && wire == tensor.scalar_type();
  if (tensor.device().is_cpu() && native) {
    buffer_ = tensor;
    return;
  }
  if (device_ok && tensor.device().is_cuda() && native && deviceCollectivesAvailable()) {
    buffer_ = tensor;
    // c10::Event goes through the CUDA device guard torch registers, so this compiles
    // against CPU-only torch headers too and needs no libc10_cuda link.
    device_ = tensor.device().index();
    ready_.emplace(c10::DeviceType::CUDA);
    const auto* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    ready_->record(guard->getStream(tensor.device()));
    return;
  }
  staged_ = true;
  if (copy_in) {
    buffer_ = tensor.to(at::kCPU, wire, /*non_blocking=*/false, /*copy=*/true).contiguous();
  } else {
    buffer_ = at::empty(tensor.sizes(), at::TensorOptions().dtype(wire).device(at::kCPU));
  }
}

Communicator::Placement Staged::placement() const {
  Communicator::Placement placement;
  // Explicit kinds spare the communicator a pointer query per call. The stream is the legacy
  // default stream: ready() already ordered the call after the tensor's producers, and
  // finish() waits for the default stream, which the collective's device work joins.
  placement.memory = onDevice() ? MemoryKind::kDevice : MemoryKind::kHost;
  placement.stream = nullptr;
  return placement;
}

void Staged::ready(std::chrono::milliseconds timeout) {
  if (!ready_) return;
  // The worker thread starts on device 0 in railshard's CUDA runtime: the collective, its
  // streams and the final wait belong on the tensor's device.
  kernels::cuda::setDevice(device_);
  // Polled (torch 1.13's Event has no synchronize()), yielding: ranks may outnumber cores.
  const auto start = std::chrono::steady_clock::now();
  int polls = 0;
  while (!ready_->query()) {
    if (std::chrono::steady_clock::now() - start > timeout) {
      throw TimeoutError(
          "railshard: the CUDA work that produces the tensor did not finish within " +
          std::to_string(timeout.count() / 1000.0) + " s");
    }
    if (++polls < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

void Staged::finish(Communicator* comm, std::chrono::milliseconds timeout) {
  if (onDevice()) {
    if (comm == nullptr) {
      throw InvalidArgument(
          "railshard: internal error: a device buffer finished without its "
          "communicator");
    }
    comm->waitForDevice(nullptr, device_, timeout);
  } else if (staged_) {
    original_.copy_(buffer_);
  }
}

std::string describe(const at::Tensor& tensor) {
  std::ostringstream out;
  out << c10::toString(tensor.scalar_type()) << tensor.sizes() << " on " << tensor.device();
  return out.str();
}

// A contiguous CPU tensor of `tensors` end to end, in their wire type.
at::Tensor flattenTensors(const std::vector<at::Tensor>& tensors, const char* collective) {
  const at::ScalarType wire = wireType(tensors.front().scalar_type(), collective);
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto& t : tensors) flat.push_back(t.reshape({-1}).to(at::kCPU, wire));
  return at::cat(flat);
}

// Copies consecutive blocks of `flat` back into `tensors`.
void unflattenTensors(const at::Tensor& flat, std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (auto& t : tensors) {
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

bool realViews(const std::vector<at::Tensor>& tensors, std::vector<at::Tensor>& real,
               const std::optional<c10d::ReduceOp>& op, const char* collective) {
  bool any = false;
  real.clear();
  real.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (t.is_complex()) {
      any = true;
      real.push_back(at::view_as_real(t));
    } else {
      real.push_back(t);
    }
  }
  if (any && op && op->op_ != c10d::ReduceOp::SUM && op->op_ != c10d::ReduceOp::AVG) {
    throw InvalidArgument(std::string("railshard ") + collective +
                          ": only SUM and AVG reduce complex tensors (componentwise); got "
                          "another ReduceOp");
  }
  return any;
}

void checkOne(const std::vector<at::Tensor>& tensors, const char* collective) {
  if (tensors.size() != 1) {
    throw InvalidArgument(std::string("railshard ") + collective +
                          ": takes exactly one tensor per rank, got " +
                          std::to_string(tensors.size()));
  }
}

}  // namespace railshard::python
