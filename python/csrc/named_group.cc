#include "python/csrc/named_group.h"

#if TORCH_VERSION_MAJOR >= 2
#include "python/csrc/process_group.h"

namespace railshard::python {
namespace {

class NamedProcessGroup : public c10d::ProcessGroup {
 public:
  NamedProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size)
      : c10d::ProcessGroup(store, rank, size) {}
  const std::string getBackendName() const override { return "railshard"; }
};

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> createNamedGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout, bool cuda) {
  return nameGroup(c10::make_intrusive<ProcessGroupRailshard>(store, rank, size, timeout), store,
                   cuda);
}

c10::intrusive_ptr<c10d::ProcessGroup> nameGroup(const c10::intrusive_ptr<c10d::Backend>& backend,
                                                 const c10::intrusive_ptr<c10d::Store>& store,
                                                 bool cuda) {
  auto group =
      c10::make_intrusive<NamedProcessGroup>(store, backend->getRank(), backend->getSize());
  const auto type = c10d::ProcessGroup::BackendType::CUSTOM;
  group->setBackend(c10::DeviceType::CPU, type, backend);
  if (cuda) group->setBackend(c10::DeviceType::CUDA, type, backend);
  group->setDefaultBackend(type);
  return group;
}

}  // namespace railshard::python
#endif
