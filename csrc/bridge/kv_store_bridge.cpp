// The PJRT client's key-value store from a c10d Store (issue 36 item 3): a process group's
// rendezvous store (TCPStore under torchrun) serves the plugin's PJRT_Client_Create kv
// callbacks (csrc/include/torch_pjrt/kv_store.h), so that a plugin running one process per
// chip (libtpu, the CUDA plugin) can create its client after rendezvous and see the job's
// global devices. torch_pjrt.distributed.use_kv_store(store) sets it before the runtime
// starts. _KvStoreBridge also calls the PJRT callbacks themselves, as a plugin would, so the
// bridge is tested here without such a plugin (tests/test_kv_store_bridge.py).
#include "bridge.h"

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

extern "C" {
#include "pjrt_c_api.h"
#include "torch_pjrt/kv_store.h"
}

namespace py = pybind11;

namespace torch_pjrt {
namespace {

struct StoreBridge {
  c10::intrusive_ptr<c10d::Store> store;
  pj_kv_store_t kv{};
};

pj_kv_result_t copy_out(const std::vector<uint8_t>& v, char** value, size_t* len) {
  *value = static_cast<char*>(std::malloc(v.size() + 1));
  if (!*value) return PJ_KV_ERROR;
  if (!v.empty()) std::memcpy(*value, v.data(), v.size());
  *len = v.size();
  return PJ_KV_OK;
}

pj_kv_result_t error(const std::exception& e, char* err, size_t cap) {
  std::snprintf(err, cap, "%s", e.what());
  return PJ_KV_ERROR;
}

pj_kv_result_t store_get(void* ctx, const char* key, size_t key_len, int timeout_ms,
                         char** value, size_t* len, char* err, size_t cap) {
  auto* b = static_cast<StoreBridge*>(ctx);
  const std::string k(key, key_len);
  try {
    try {
      if (timeout_ms >= 0) b->store->wait({k}, std::chrono::milliseconds(timeout_ms));
      else b->store->wait({k});
    } catch (const c10::DistStoreError&) {
      // a wait that ran out; anything else that failed is the store's error
      if (!b->store->check({k})) return PJ_KV_MISSING;
      throw;
    }
    return copy_out(b->store->get(k), value, len);
  } catch (const std::exception& e) {
    return error(e, err, cap);
  }
}

pj_kv_result_t store_try_get(void* ctx, const char* key, size_t key_len, char** value,
                             size_t* len, char* err, size_t cap) {
  auto* b = static_cast<StoreBridge*>(ctx);
  const std::string k(key, key_len);
  try {
    if (!b->store->check({k})) return PJ_KV_MISSING;
    return copy_out(b->store->get(k), value, len);
  } catch (const std::exception& e) {
    return error(e, err, cap);
  }
}

pj_kv_result_t store_put(void* ctx, const char* key, size_t key_len, const char* value,
                         size_t len, char* err, size_t cap) {
  auto* b = static_cast<StoreBridge*>(ctx);
  try {
    b->store->set(std::string(key, key_len),
                  std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(value),
                                       reinterpret_cast<const uint8_t*>(value) + len));
    return PJ_KV_OK;
  } catch (const std::exception& e) {
    return error(e, err, cap);
  }
}

std::shared_ptr<StoreBridge> make_bridge(c10::intrusive_ptr<c10d::Store> store,
                                         const std::string& prefix) {
  TORCH_CHECK_VALUE(store, "a key-value store bridge needs a c10d Store");
  TORCH_CHECK_VALUE(prefix.size() < sizeof(pj_kv_store_t::prefix), "kv store prefix longer than ",
                    sizeof(pj_kv_store_t::prefix) - 1, " bytes");
  auto b = std::make_shared<StoreBridge>();
  b->store = std::move(store);
  b->kv.get = store_get;
  b->kv.try_get = store_try_get;
  b->kv.put = store_put;
  b->kv.ctx = b.get();
  std::snprintf(b->kv.prefix, sizeof b->kv.prefix, "%s", prefix.c_str());
  return b;
}

// ---- calling the PJRT callbacks as a plugin does ----

thread_local PJRT_Error_Code t_code;
thread_local std::string t_message;

PJRT_Error* record_error(PJRT_Error_Code code, const char* msg, size_t len) {
  t_code = code;
  t_message.assign(msg, len);
  return reinterpret_cast<PJRT_Error*>(&t_code);  // non-NULL: an error
}
PJRT_CallbackError g_record_error = record_error;

[[noreturn]] void raise_recorded() {
  if (t_code == PJRT_Error_Code_NOT_FOUND) throw py::key_error(t_message);
  if (t_code == PJRT_Error_Code_DEADLINE_EXCEEDED) {
    PyErr_SetString(PyExc_TimeoutError, t_message.c_str());
    throw py::error_already_set();
  }
  throw std::runtime_error(t_message);
}

PJRT_Client_Create_Args callbacks(const StoreBridge& b) {
  PJRT_Client_Create_Args a{};
  pj_kv_fill_client_args(&b.kv, &a);
  return a;
}

py::bytes call_get(const StoreBridge& b, const std::string& key, int timeout_ms, bool try_only) {
  PJRT_Client_Create_Args c = callbacks(b);
  char* value = nullptr;
  size_t size = 0;
  void (*deleter)(char*) = nullptr;
  PJRT_Error* e;
  {
    py::gil_scoped_release no_gil;  // a Python store (HashStore's waiters) may need the GIL
    if (try_only) {
      PJRT_KeyValueTryGetCallback_Args a{};
      a.struct_size = PJRT_KeyValueTryGetCallback_Args_STRUCT_SIZE;
      a.key = key.data();
      a.key_size = key.size();
      a.callback_error = &g_record_error;
      a.user_arg = c.kv_try_get_user_arg;
      e = c.kv_try_get_callback(&a);
      value = a.value, size = a.value_size, deleter = a.value_deleter_callback;
    } else {
      PJRT_KeyValueGetCallback_Args a{};
      a.struct_size = PJRT_KeyValueGetCallback_Args_STRUCT_SIZE;
      a.key = key.data();
      a.key_size = key.size();
      a.timeout_in_ms = timeout_ms;
      a.callback_error = &g_record_error;
      a.user_arg = c.kv_get_user_arg;
      e = c.kv_get_callback(&a);
      value = a.value, size = a.value_size, deleter = a.value_deleter_callback;
    }
  }
  if (e) raise_recorded();
  py::bytes out(value, size);
  deleter(value);
  return out;
}

void call_put(const StoreBridge& b, const std::string& key, const std::string& value) {
  PJRT_Client_Create_Args c = callbacks(b);
  PJRT_KeyValuePutCallback_Args a{};
  a.struct_size = PJRT_KeyValuePutCallback_Args_STRUCT_SIZE;
  a.key = key.data();
  a.key_size = key.size();
  a.value = value.data();
  a.value_size = value.size();
  a.callback_error = &g_record_error;
  a.user_arg = c.kv_put_user_arg;
  PJRT_Error* e;
  {
    py::gil_scoped_release no_gil;
    e = c.kv_put_callback(&a);
  }
  if (e) raise_recorded();
}

}  // namespace

void bind_kv_store_bridge(py::module_& m) {
  py::class_<StoreBridge, std::shared_ptr<StoreBridge>>(m, "_KvStoreBridge")
      .def(py::init([](py::object store, const std::string& prefix) {
             return make_bridge(store.cast<c10::intrusive_ptr<c10d::Store>>(), prefix);
           }),
           py::arg("store"), py::arg("prefix"))
      .def("get", [](const StoreBridge& b, const std::string& key, int timeout_ms) {
             return call_get(b, key, timeout_ms, false);
           }, py::arg("key"), py::arg("timeout_ms"),
           "PJRT's kv_get callback: the value, TimeoutError when it does not come in time.")
      .def("try_get", [](const StoreBridge& b, const std::string& key) {
             return call_get(b, key, 0, true);
           }, py::arg("key"), "PJRT's kv_try_get callback: the value, KeyError when missing.")
      .def("put", [](const StoreBridge& b, const std::string& key, const py::bytes& value) {
             call_put(b, key, std::string(value));
           }, py::arg("key"), py::arg("value"), "PJRT's kv_put callback.")
      .def("install", [](std::shared_ptr<StoreBridge> b) {
             check(pj_runtime_set_kv_store(&b->kv));
             static std::vector<std::shared_ptr<StoreBridge>> kept;  // the client's for good
             kept.push_back(std::move(b));
           }, "The runtime's client will be created with this store (before the runtime "
              "starts; RuntimeError after).");
}

}  // namespace torch_pjrt
