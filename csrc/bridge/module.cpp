// torch_pjrt._C: the Python bindings. Thin: each function converts arguments, calls the runtime
// or another bridge file, and lets torch's wrapper turn c10 exceptions into Python ones.
// Functions that may wait for the device release the GIL (the runtime never takes it).
#include "host_quirks.h"
#include "bridge.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <mutex>
#include <string>
#include <tuple>

extern "C" {
#include "pjrt_c_api.h"
#include "torch_pjrt/exec_profile.h"
#include "torch_pjrt/host_heap.h"
#include "torch_pjrt/metrics.h"
#include "torch_pjrt/memory_info.h"
}

namespace py = pybind11;

namespace torch_pjrt {

void bind_dispatch(py::module_& m);  // dispatch_bindings.cpp: lowered ops, fallback counts
void bind_capture(py::module_& m);   // capture_bindings.cpp: whole-graph capture and plans
void bind_distributed(py::module_& m);  // distributed.cpp: the tpu_dist c10d backend
void bind_native_dist(py::module_& m);  // native_dist.cpp: its native transport (rank threads)
void bind_kv_store_bridge(py::module_& m);  // kv_store_bridge.cpp: the client's kv store
void bind_kernels(py::module_& m);   // kernel_bindings.cpp: the custom-kernel registry

namespace {

using torch::wrap_pybind_function;
using torch::wrap_pybind_function_no_gil;

// An event snapshot (stream.h) owned by Python; unrecorded until record() is called. Shared so
// that a wait running without the GIL keeps its snapshot alive while another thread re-records.
struct Marker {
  std::shared_ptr<pj_marker_t> m;
};

void bind_runtime(py::module_& m) {
  m.def("_configure", wrap_pybind_function([](const std::string& plugin_path,
                                              int cpu_device_count) {
          check(pj_runtime_configure(plugin_path.c_str(), cpu_device_count));
        }),
        py::arg("plugin_path"), py::arg("cpu_device_count") = 1,
        "Chooses the plugin file and the CPU plugin's device count; before _init only.");
  m.def("_refuse", wrap_pybind_function([](const std::string& message) {
          check(pj_runtime_refuse(PJ_ERR_PLUGIN, message.c_str()));
        }),
        py::arg("message"),
        "Makes the runtime refuse to start, with this message; before _init only.");
  m.def("_init", wrap_pybind_function_no_gil([] { runtime(); }),
        "Loads the plugin and creates the client; raises why it cannot.");
  m.def("is_initialized", [] { return pj_runtime_ready(); });
  m.def("device_count", wrap_pybind_function_no_gil([] { return int(device_count()); }),
        "Number of devices; 0 when the runtime cannot start.");
  m.def("get_device_name", wrap_pybind_function([](int device) {
          return std::string(pj_runtime_device_kind(runtime(), checked_device(device)));
        }),
        py::arg("device") = -1);
  // The plugin's own attributes of a device (a TPU's coords, core_on_chip, ...): what
  // topology-aware meshes order devices by (torch_pjrt/distributed/topology.py).
  m.def("device_attributes", wrap_pybind_function([](int device) {
          const PJRT_NamedValue* attrs = nullptr;
          size_t n = 0;
          check(pj_runtime_device_attributes(runtime(), checked_device(device), &attrs, &n));
          py::dict d;
          for (size_t i = 0; i < n; i++) {
            const PJRT_NamedValue& a = attrs[i];
            py::str name(a.name, a.name_size);
            switch (a.type) {
              case PJRT_NamedValue_kString:
                d[name] = py::str(a.string_value, a.value_size);
                break;
              case PJRT_NamedValue_kInt64: d[name] = a.int64_value; break;
              case PJRT_NamedValue_kInt64List: {
                py::list l;
                for (size_t k = 0; k < a.value_size; k++) l.append(a.int64_array_value[k]);
                d[name] = l;
                break;
              }
              case PJRT_NamedValue_kFloat: d[name] = a.float_value; break;
              case PJRT_NamedValue_kBool: d[name] = a.bool_value; break;
              default: break;  // a type newer than this header: left out
            }
          }
          d["id"] = pj_runtime_device_id(runtime(), checked_device(device));
          return d;
        }),
        py::arg("device") = -1,
        "The plugin's attributes of a device (name -> value), and its global `id`.");
  m.def("mem_get_info", wrap_pybind_function([](int device) {
          int64_t free_bytes = 0, total_bytes = 0;
          check(pj_device_memory_info(checked_device(device), &free_bytes, &total_bytes));
          return std::make_pair(free_bytes, total_bytes);
        }),
        py::arg("device") = -1, "(free, total) bytes of the device's memory.");
  m.def("platform_name",
        wrap_pybind_function([] { return std::string(pj_runtime_platform_name(runtime())); }));
  // whether programs may call the native few-row matrix product (csrc/runtime/ffi_kernels.c)
  m.def("native_kernels_status", wrap_pybind_function([] {
    runtime();
    return std::string(pj_ffi_kernels_status());
  }));
  m.def("native_small_gemm_calls", [] { return pj_ffi_small_gemm_calls(); });
  m.def("native_attention_calls", [] { return pj_ffi_paged_attention_calls(); });
  m.def("platform_version", wrap_pybind_function([] {
          return std::string(pj_runtime_platform_version(runtime()));
        }));
  m.def("plugin_path",
        wrap_pybind_function([] { return std::string(pj_runtime_plugin_path(runtime())); }));
  m.def("api_version", wrap_pybind_function([] {
          int major = 0, minor = 0;
          pj_runtime_api_version(runtime(), &major, &minor);
          return std::make_tuple(major, minor);
        }));
  m.def("identity",
        wrap_pybind_function([] { return std::string(pj_runtime_identity(runtime())); }));
  m.def("set_device", wrap_pybind_function([](int device) { set_device(device); }));
  m.def("check_device", wrap_pybind_function([](int device) { return checked_device(device); }),
        py::arg("device") = -1,
        "The index (-1: the current device) after checking the runtime has it; raises "
        "torch.AcceleratorError otherwise.");
  m.def("current_device", [] { return int(current_device()); });
}

// A device index for per-device counters: before the runtime exists every counter is 0 and any
// index is accepted (as torch.cuda's memory functions answer before CUDA is initialized); after,
// an index the client does not have raises RuntimeError, as CUDA's allocator does.
int stats_device(int device) {
  if (!pj_runtime_ready()) return device;
  if (device < 0) device = current_device();
  const int count = device_count();
  TORCH_CHECK(device < count, "Invalid device argument ", device, ": the tpu runtime has ", count,
              " device(s)");
  return device;
}

void bind_memory(py::module_& m) {
  // Counters are kept per device index by the runtime; these do not start it.
  m.def("memory_allocated",
        wrap_pybind_function([](int device) {
          check(pj_defer_flush_queued());  // queued Strict calls hold their storages
          return pj_storage_bytes_in_use(stats_device(device));
        }),
        py::arg("device"));
  m.def("max_memory_allocated",
        wrap_pybind_function([](int device) { return pj_storage_peak_bytes(stats_device(device)); }),
        py::arg("device"));
  m.def("reset_peak_memory_stats",
        wrap_pybind_function([](int device) { pj_storage_reset_peak(stats_device(device)); }),
        py::arg("device"));
  m.def("set_memory_limit",
        wrap_pybind_function([](int device, int64_t bytes) {
          pj_storage_set_limit(stats_device(device), bytes);
        }),
        py::arg("device"), py::arg("bytes"));
  m.def("memory_limit",
        wrap_pybind_function([](int device) { return pj_storage_limit(stats_device(device)); }),
        py::arg("device"));
  m.def("oom_count",
        wrap_pybind_function([](int device) { return pj_storage_oom_count(stats_device(device)); }),
        py::arg("device"));
  m.def("live_storages",
        wrap_pybind_function([](int device) {
          check(pj_defer_flush_queued());
          return device < 0 ? pj_storage_live_count()
                            : pj_storage_live_count_on(stats_device(device));
        }),
        py::arg("device") = -1, "Live tpu storages on the device (-1: all devices).");
}

// torch.Event keeps its backend event (a pj_marker_t*, see guard.cpp) as `event_id`.
// torch.Event.elapsed_time only accepts an exact torch.Event as its argument, so the device
// module's Event subclass times through here. Both events must be alive and recorded; the GIL
// stays held so no Python thread can re-record (and free) either marker meanwhile.
double event_elapsed_ms(int64_t start_id, int64_t end_id) {
  return elapsed_ms(reinterpret_cast<pj_marker_t*>(static_cast<intptr_t>(start_id)),
                    reinterpret_cast<pj_marker_t*>(static_cast<intptr_t>(end_id)));
}

void bind_sync(py::module_& m) {
  m.def("synchronize",
        wrap_pybind_function_no_gil([](int device) {
          if (device >= 0) checked_device(device);  // as CUDA: a missing device raises
          check(pj_defer_flush());
          check(pj_stream_synchronize(device));
          check(pj_checks_report(device));  // a failed device-side index check raises here
        }),
        py::arg("device") = -1, "Waits for the device's executions (-1: all devices).");
  m.def("pending_executions",
        wrap_pybind_function([](int device) {
          return pj_stream_pending(device < 0 ? device : stats_device(device));
        }),
        py::arg("device") = -1, "Executions in flight on the device (-1: all devices).");
  py::class_<Marker>(m, "Marker")
      .def(py::init<>())
      .def("record", wrap_pybind_function([](Marker& self, int device) {
             pj_marker_t* fresh = nullptr;
             check(pj_marker_record(checked_device(device), &fresh));
             self.m.reset(fresh, &pj_marker_free);
           }),
           py::arg("device") = -1)
      .def("query", [](Marker& self) { return !self.m || pj_marker_query(self.m.get()); })
      .def("wait", wrap_pybind_function([](Marker& self) {
             std::shared_ptr<pj_marker_t> keep = self.m;
             py::gil_scoped_release no_gil;
             if (keep) check(pj_marker_wait(keep.get()));
           }))
      .def("elapsed_ms", wrap_pybind_function([](Marker& self, Marker& end) {
             std::shared_ptr<pj_marker_t> a = self.m, b = end.m;
             py::gil_scoped_release no_gil;
             return elapsed_ms(a.get(), b.get());
           }));
  m.def("_event_elapsed_ms", wrap_pybind_function(event_elapsed_ms), py::arg("start_event_id"),
        py::arg("end_event_id"));
  // Execution timeline (exec_profile.h), read by torch_pjrt/compile/attribution.py.
  // The heap policy for the CPU plugin (host_heap.h), applied at import: glibc fixes its
  // arena count when a second thread first allocates, so later would be too late.
  m.def("_configure_host_heap", [] { return pj_host_heap_configure() != 0; });
  m.def("_exec_profile_enable", [](bool on) { pj_exec_profile_enable(on); }, py::arg("on"));
  m.def("_exec_profile_label", [](const std::string& label) { pj_exec_profile_label(label.c_str()); },
        py::arg("label"), "Names the programs this thread issues from now on ('': eager).");
  m.def("_exec_profile_take", [] {
    size_t n = 0;
    uint64_t dropped = 0;
    pj_exec_record_t* recs = pj_exec_profile_take(&n, &dropped);
    py::list out;
    for (size_t i = 0; i < n; i++)
      out.append(py::make_tuple(recs[i].device, std::string(recs[i].label), recs[i].issued_ns,
                                recs[i].done_ns));
    free(recs);
    return py::make_tuple(out, dropped);
  }, "(records [(device, label, issued_ns, done_ns)], dropped): the records since the last take.");
}

void bind_metrics(py::module_& m) {
  m.def("metrics", [] {
    check(pj_defer_flush_queued());  // Strict calls queued behind compiles count as run
    py::dict d;
    for (int i = 0; i < PJ_NUM_METRICS; i++) {
      const auto metric = static_cast<pj_metric_t>(i);
      d[py::str(pj_metric_name(metric))] = pj_metric_get(metric);
    }
    return d;
  });
  m.def("device_metrics", wrap_pybind_function([](int device) {
          device = stats_device(device);
          py::dict d;
          for (int i = 0; i < PJ_NUM_DEVICE_METRICS; i++) {
            const auto metric = static_cast<pj_device_metric_t>(i);
            d[py::str(pj_device_metric_name(metric))] = pj_device_metric_get(device, metric);
          }
          return d;
        }),
        py::arg("device"), "The counters of one device (executions, transfers).");
  m.def("reset_metrics", [] { pj_metrics_reset(); });
}

void bind_random(py::module_& m) {
  // A new Python wrapper around the device's default generator each call; torch_pjrt.device
  // caches one per device (torch.Generator identity matters to users comparing them).
  m.def("default_generator", wrap_pybind_function([](int device) {
          return py::reinterpret_steal<py::object>(
              THPGenerator_initDefaultGenerator(default_generator(device)));
        }),
        py::arg("device") = -1);
  m.def("get_rng_state", wrap_pybind_function([](int device) {
          at::Generator g = default_generator(device);
          std::lock_guard<std::mutex> lock(g.mutex());
          return g.get_state();
        }),
        py::arg("device") = -1);
  m.def("set_rng_state", wrap_pybind_function([](const at::Tensor& state, int device) {
          at::Generator g = default_generator(device);
          std::lock_guard<std::mutex> lock(g.mutex());
          g.set_state(state);
        }),
        py::arg("state"), py::arg("device") = -1);
  m.def("manual_seed", wrap_pybind_function([](uint64_t seed) {
          for (int i = 0, n = device_count(); i < n; i++) {
            at::Generator g = default_generator(i);
            std::lock_guard<std::mutex> lock(g.mutex());
            g.set_current_seed(seed);
          }
        }),
        py::arg("seed"), "Seeds every device's default generator.");
}

}  // namespace
}  // namespace torch_pjrt

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "torch_pjrt native bindings (runtime, device state, events, RNG)";
  torch_pjrt::configure_host_quirks();  // before any program is built
  torch_pjrt::bind_runtime(m);
  torch_pjrt::bind_memory(m);
  torch_pjrt::bind_sync(m);
  torch_pjrt::bind_metrics(m);
  torch_pjrt::bind_random(m);
  torch_pjrt::bind_dispatch(m);
  torch_pjrt::bind_kernels(m);
  torch_pjrt::bind_capture(m);
  torch_pjrt::bind_distributed(m);
  torch_pjrt::bind_native_dist(m);
  torch_pjrt::bind_kv_store_bridge(m);
}
