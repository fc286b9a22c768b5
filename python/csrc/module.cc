// railshard._C: the torch.distributed backend's creator, the dispatcher for the sampler, and
// railshard's exception types. The Python package (python/railshard/__init__.py) registers
// the backend and re-exports these.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "core/communicator.h"
#include "python/csrc/dispatch_bindings.h"
#include "python/csrc/elastic_group.h"
#include "python/csrc/named_group.h"
#include "python/csrc/process_group.h"
#include "python/csrc/shared_allocator.h"

namespace py = pybind11;

namespace railshard::python {
namespace {

// torch calls this as creator(prefix_store, rank, world_size, timeout). It blocks until every
// rank arrived, so the GIL goes while it waits.
c10::intrusive_ptr<BackendBase> createBackend(const c10::intrusive_ptr<c10d::Store>& store,
                                              int rank, int size,
                                              const std::chrono::duration<float>& timeout) {
  py::gil_scoped_release release;
  return c10::make_intrusive<ProcessGroupRailshard>(
      store, rank, size, std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
}

py::dict changeDict(const ElasticGroup::Change& c) {
  py::dict d;
  d["lost"] = c.lost;
  d["joined"] = c.joined;
  d["committed"] = c.committed;
  d["undo"] = c.undo;
  d["redo"] = c.redo;
  d["seconds"] = c.seconds;
  return d;
}

void bindElasticGroup(py::module_& m) {
  using G = ElasticGroup;
  using Release = py::call_guard<py::gil_scoped_release>;
  py::class_<G>(m, "ElasticGroup",
                "The communicator of an elastic job and the c10d process group over it "
                "(python/csrc/elastic_group.h); railshard.ElasticGroup wraps it.")
      .def(py::init([](const std::chrono::duration<float>& timeout, bool cuda, uint64_t epoch_size,
                       const std::string& policy, size_t micro_batch, size_t min_micro_batches) {
             G::Options o;
             o.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
             o.cuda = cuda;
             o.epoch_size = epoch_size;
             o.dispatch.policy = dispatch::parsePolicy(policy);
             o.dispatch.micro_batch = micro_batch;
             o.dispatch.min_micro_batches = min_micro_batches;
             py::gil_scoped_release release;
             return std::make_unique<G>(o);
           }),
           py::arg("timeout"), py::arg("cuda") = false, py::arg("epoch_size") = 0,
           py::arg("policy") = "proportional", py::arg("micro_batch") = 1,
           py::arg("min_micro_batches") = 0)
      .def_property_readonly("rank", &G::rank)
      .def_property_readonly("size", &G::size)
      .def_property_readonly("generation", &G::generation)
      .def_property_readonly("launch_rank", &G::launchRank)
      .def_property_readonly("launch_ranks", &G::launchRanks)
      .def_property_readonly("joined_running_job", &G::joinedRunningJob)
      .def_property_readonly("process_group", &G::processGroup)
      .def_property_readonly("has_dispatcher", &G::hasDispatcher)
      .def("joiners_waiting", &G::joinersWaiting, Release())
      .def("shrink",
           [](G& g) {
             G::Change c;
             {
               py::gil_scoped_release release;
               c = g.shrink();
             }
             return changeDict(c);
           })
      .def("grow",
           [](G& g) {
             G::Change c;
             {
               py::gil_scoped_release release;
               c = g.grow();
             }
             return changeDict(c);
           })
      .def("close", &G::close, Release())
      .def("next_step", &G::nextStep, py::arg("global_batch"), Release())
      .def("finish_step", &G::finishStep, py::arg("samples"), py::arg("seconds"))
      .def("commit_step", &G::commitStep)
      .def_property_readonly(
          "shares",
          [](const G& g) {
            std::vector<size_t> out;
            for (const auto& ranges : g.dispatcher().plan().ranges) {
              size_t n = 0;
              for (const auto& r : ranges) n += r.size();
              out.push_back(n);
            }
            return out;
          },
          "Samples of the current step per dispatcher rank (0 for failed ones).")
      .def_property_readonly("my_samples", [](const G& g) { return g.dispatcher().mySamples(); })
      .def_property_readonly("step_samples",
                             [](const G& g) { return g.dispatcher().stepSamples(); })
      .def_property_readonly("step", [](const G& g) { return g.dispatcher().plan().step; })
      .def_property_readonly("epoch",
                             [](const G& g) { return g.dispatcher().state().dispatcher().epoch(); })
      .def_property_readonly("epoch_done", [](const G& g) { return g.dispatcher().epochDone(); })
      .def_property_readonly("step_first_position",
                             [](const G& g) {
                               uint64_t first = UINT64_MAX;
                               for (const auto& ranges : g.dispatcher().plan().ranges) {
                                 for (const auto& r : ranges) {
                                   if (r.size() > 0) first = std::min(first, r.begin);
                                 }
                               }
                               return first == UINT64_MAX ? uint64_t{0} : first;
                             })
      .def_property_readonly("redo_pending",
                             [](const G& g) { return g.dispatcher().state().redoPending(); })
      .def_property_readonly("committed_steps",
                             [](const G& g) { return g.dispatcher().committedSteps(); })
      .def_property_readonly("dispatcher_rank", [](const G& g) { return g.dispatcher().myRank(); })
      .def_property_readonly("dispatcher_launch_ranks",
                             [](const G& g) { return g.dispatcher().launchRanks(); })
      .def_property_readonly("rates", [](const G& g) {
        return g.dispatcher().state().dispatcher().estimator().rates();
      });
}

}  // namespace
}  // namespace railshard::python

PYBIND11_MODULE(_C, m) {
  using namespace railshard;
  m.doc() = "railshard's C++ extension: torch.distributed backend and dispatcher";

  // One Python class per railshard error, under railshard.Error (a RuntimeError, which is
  // what torch.distributed callers already catch). Registered translators are global, so
  // errors raised inside torch's own bindings (work.wait(), future.wait()) map too.
  static py::exception<Error> error(m, "Error", PyExc_RuntimeError);
  // pybind tries translators newest first: the catch-all for Error goes in before the kinds.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(error.ptr(), e.what());
    }
  });
  py::register_exception<TimeoutError>(m, "TimeoutError", error.ptr());
  py::register_exception<PeerLostError>(m, "PeerLostError", error.ptr());
  py::register_exception<MismatchError>(m, "MismatchError", error.ptr());
  py::register_exception<InvalidArgument>(m, "InvalidArgument", error.ptr());
  py::register_exception<ConfigError>(m, "ConfigError", error.ptr());
  py::register_exception<ProtocolError>(m, "ProtocolError", error.ptr());

  m.def("create_backend", &railshard::python::createBackend, py::arg("store"), py::arg("rank"),
        py::arg("world_size"), py::arg("timeout"),
        "Creates the railshard process group / backend (torch.distributed's creator).");
#if TORCH_VERSION_MAJOR >= 2
  m.def(
      "create_named_group",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
         const std::chrono::duration<float>& timeout, bool cuda) {
        py::gil_scoped_release release;
        return railshard::python::createNamedGroup(
            store, rank, size, std::chrono::duration_cast<std::chrono::milliseconds>(timeout),
            cuda);
      },
      py::arg("store"), py::arg("rank"), py::arg("world_size"), py::arg("timeout"), py::arg("cuda"),
      "The railshard backend inside a ProcessGroup named \"railshard\" (torch 2.x creator).");
#endif
  m.def("_shutdown_all", &railshard::python::ProcessGroupRailshard::shutdownAll,
        py::call_guard<py::gil_scoped_release>(),
        "Shuts every railshard process group of this process down (registered with atexit).");
  // railshard.empty_shared's storage: `nbytes` of host memory the other ranks of this host map
  // once (Communicator::allocateSharedBuffer), freed with the tensor's storage.
  m.def(
      "_empty_shared_bytes",
      [](int64_t nbytes) {
        if (nbytes <= 0) {
          throw InvalidArgument("empty_shared: expected a positive size in bytes, got " +
                                std::to_string(nbytes));
        }
        void* memory = Communicator::allocateSharedBuffer(static_cast<size_t>(nbytes));
        return at::from_blob(
            memory, {nbytes}, [](void* p) { Communicator::freeSharedBuffer(p); },
            at::TensorOptions().dtype(at::kByte));
      },
      py::arg("nbytes"));
  m.def("_shared_allocator_stats", [] {
    const auto stats = railshard::python::sharedAllocatorStats();
    py::dict out;
    out["installed"] = railshard::python::sharedAllocatorInstalled();
    out["live_bytes"] = stats.live_bytes;
    out["live_regions"] = stats.live_regions;
    out["kept_bytes"] = stats.kept_bytes;
    out["kept_regions"] = stats.kept_regions;
    out["peak_live_bytes"] = stats.peak_live_bytes;
    out["allocations"] = stats.taken;
    out["reused"] = stats.reused;
    return out;
  });
  m.def("_release_shared_cache", &railshard::python::releaseSharedCache,
        py::call_guard<py::gil_scoped_release>());
  m.def(
      "_is_shared",
      [](const at::Tensor& tensor) {
        return tensor.device().is_cpu() && tensor.numel() > 0 &&
               railshard::python::isShared(tensor.data_ptr(), static_cast<size_t>(tensor.nbytes()));
      },
      py::arg("tensor"));
  m.attr("torch_version") = TORCH_VERSION;
  railshard::python::bindDispatcher(m);
  railshard::python::bindElasticGroup(m);
}
