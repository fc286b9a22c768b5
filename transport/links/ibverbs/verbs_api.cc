#include "transport/links/ibverbs/verbs_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#include "base/logging.h"

namespace railshard::transport::links::ibverbs {

namespace {

struct Loaded {
  VerbsApi api;
  bool ok = false;
  std::string reason;
};

// Resolves `name` into `slot`; false (and the reason) when a required symbol is missing.
template <typename Fn>
bool resolve(void* handle, const char* name, Fn& slot, bool required, std::string& reason) {
  slot = reinterpret_cast<Fn>(::dlsym(handle, name));
  if (slot == nullptr && required) {
    reason = "symbol " + std::string(name) + " is missing from the library";
    return false;
  }
  return true;
}

Loaded load(const std::string& path) {
  Loaded result;
  // RTLD_LOCAL: the symbols stay ours; nothing else in the process binds to them by accident.
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    result.reason = "cannot load " + path + ": " + (why != nullptr ? why : "unknown error") +
                    " (install rdma-core/libibverbs1, or set RAILSHARD_IBVERBS_LIBRARY)";
    return result;
  }
  // The library stays loaded for the life of the process: providers keep threads and
  // fork handlers that must not outlive their code.
  VerbsApi& a = result.api;
  a.path = path;
  std::string& r = result.reason;
  const bool ok = resolve(handle, "ibv_get_device_list", a.get_device_list, true, r) &&
                  resolve(handle, "ibv_free_device_list", a.free_device_list, true, r) &&
                  resolve(handle, "ibv_get_device_name", a.get_device_name, true, r) &&
                  resolve(handle, "ibv_open_device", a.open_device, true, r) &&
                  resolve(handle, "ibv_close_device", a.close_device, true, r) &&
                  resolve(handle, "ibv_query_device", a.query_device, true, r) &&
                  resolve(handle, "ibv_query_port", a.query_port, true, r) &&
                  resolve(handle, "ibv_query_gid", a.query_gid, true, r) &&
                  resolve(handle, "ibv_alloc_pd", a.alloc_pd, true, r) &&
                  resolve(handle, "ibv_dealloc_pd", a.dealloc_pd, true, r) &&
                  resolve(handle, "ibv_reg_mr", a.reg_mr, true, r) &&
                  resolve(handle, "ibv_reg_dmabuf_mr", a.reg_dmabuf_mr, false, r) &&
                  resolve(handle, "ibv_dereg_mr", a.dereg_mr, true, r) &&
                  resolve(handle, "ibv_create_comp_channel", a.create_comp_channel, true, r) &&
                  resolve(handle, "ibv_destroy_comp_channel", a.destroy_comp_channel, true, r) &&
                  resolve(handle, "ibv_create_cq", a.create_cq, true, r) &&
                  resolve(handle, "ibv_destroy_cq", a.destroy_cq, true, r) &&
                  resolve(handle, "ibv_get_cq_event", a.get_cq_event, true, r) &&
                  resolve(handle, "ibv_ack_cq_events", a.ack_cq_events, true, r) &&
                  resolve(handle, "ibv_create_qp", a.create_qp, true, r) &&
                  resolve(handle, "ibv_modify_qp", a.modify_qp, true, r) &&
                  resolve(handle, "ibv_destroy_qp", a.destroy_qp, true, r) &&
                  resolve(handle, "ibv_get_async_event", a.get_async_event, true, r) &&
                  resolve(handle, "ibv_ack_async_event", a.ack_async_event, true, r) &&
                  resolve(handle, "ibv_wc_status_str", a.wc_status_str, true, r) &&
                  resolve(handle, "ibv_event_type_str", a.event_type_str, true, r) &&
                  resolve(handle, "ibv_fork_init", a.fork_init, false, r);
  if (!ok) {
    result.reason = path + ": " + result.reason;
    return result;
  }
  result.ok = true;
  RS_LOG_DEBUG("ibverbs: loaded {}", path);
  return result;
}

// One entry per library path: RAILSHARD_IBVERBS_LIBRARY is read at each call, so a process
// (a test) may switch to another library; each is loaded once and never unloaded.
const Loaded& loaded() {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<Loaded>> libraries;
  const char* override_path = std::getenv("RAILSHARD_IBVERBS_LIBRARY");
  const std::string path =
      override_path != nullptr && *override_path != '\0' ? override_path : "libibverbs.so.1";
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = libraries[path];
  if (!slot) slot = std::make_unique<Loaded>(load(path));
  return *slot;
}

}  // namespace

const VerbsApi* VerbsApi::get() {
  const Loaded& l = loaded();
  return l.ok ? &l.api : nullptr;
}

std::string VerbsApi::unavailableReason() {
  return loaded().reason;
}

std::string VerbsApi::statusText(ibv_wc_status status) const {
  const char* text = wc_status_str != nullptr ? wc_status_str(status) : nullptr;
  return std::string(text != nullptr ? text : "status") + " (" +
         std::to_string(static_cast<int>(status)) + ")";
}

}  // namespace railshard::transport::links::ibverbs
