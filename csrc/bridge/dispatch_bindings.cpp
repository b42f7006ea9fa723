// Python bindings for the dispatch layer: which ops have lowerings (so the Python front can
// register PyTorch decompositions for the others) and which ops fell back to the CPU.
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/extension.h>

#include "bridge.h"
#include "call_memo.h"
#include "eager_mode.h"
#include "meta_cache.h"
extern "C" {
#include "torch_pjrt/bucket.h"
#include "torch_pjrt/call.h"
#include "torch_pjrt/compile_async.h"
#include "torch_pjrt/disk_cache.h"
#include "torch_pjrt/metrics.h"
}

namespace torch_pjrt {

std::map<std::string, int64_t> fallback_ops();  // dispatch.cpp
// dispatch.cpp: the call to CPU's kernel through the fallback (complex32_ops.cpp says why)
void complex32_cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

void bind_dispatch(pybind11::module_& m) {
  m.def("_lowered_ops", [] {
    std::vector<std::string> names;
    pj_lowering_each([](const char* n, void* u) {
      static_cast<std::vector<std::string>*>(u)->push_back(n);
    }, &names);
    std::sort(names.begin(), names.end());
    return names;
  }, "Base names of the aten ops with a StableHLO lowering.");
  m.def("_in_meta_kernel", [] { return in_meta_kernel(); },
        "Whether this thread is inside a Meta kernel the dispatch layer called (meta_cache.h).");
  // A Python decomposition (torch_pjrt/_decompositions.py) called with complex32 operands:
  // the op goes to CPU's kernel, as the boxed fallback sends it (CPU has no complex32 kernel
  // for those ops, and the decomposition would compute what CPU refuses).
  m.def("_complex32_cpu_fallback", [](const std::string& name, const std::string& overload,
                                      pybind11::args args, pybind11::kwargs kwargs) {
    const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
    torch::jit::Stack stack =
        torch::jit::createStackForSchema(op.schema(), args, kwargs, std::nullopt);
    {
      pybind11::gil_scoped_release no_gil;
      complex32_cpu_fallback(op, &stack);
    }
    return torch::jit::createPyObjectForStack(std::move(stack));
  });
  m.def("fallback_ops", [] { return fallback_ops(); },
        "aten ops that ran on the CPU through the fallback, with their counts.");
  m.def("_set_default_eager_mode", [](int m) {
    TORCH_CHECK(m >= 0 && m <= 2, "bad eager mode ", m);
    check(pj_defer_flush());  // ops recorded under the old mode run before the switch
    set_default_eager_mode(static_cast<EagerMode>(m));
  });
  m.def("_set_thread_eager_mode", [](int m) {
    check(pj_defer_flush());
    set_thread_eager_mode(m);
  },
        "Overrides the mode for the calling thread (-1: follow the default).");
  m.def("_thread_eager_mode", [] { return thread_eager_mode(); });
  m.def("_default_eager_mode", [] { return static_cast<int>(default_eager_mode()); });
  m.def("_set_index_checks", [](bool on) { pj_checks_set_enabled(on); },
        "Device-side index checks for the ops called from now on (TORCH_PJRT_CHECK_BOUNDS sets "
        "the start value); programs of both kinds stay cached under their own keys.");
  m.def("_index_checks", [] { return pj_checks_enabled(); });
  m.def("_set_call_memo", [](bool on) { set_call_memo_enabled(on); },
        "Whether repeated eager calls run from the call memo (call_memo.h); on by default.");
  m.def("_call_memo", [] { return call_memo_enabled(); });
  m.def("_set_compile_threads", [](int n) {
    check(pj_defer_flush_queued());  // calls queued behind compiles run first
    pj_async_compile_set_threads(n);
  }, "Threads compiling Strict mode's new programs in the background (0: compile in the op; "
     "TORCH_PJRT_COMPILE_THREADS sets the start value).");
  m.def("_compile_threads", [] { return pj_async_compile_threads(); });
  m.def("_set_size_buckets", [](bool on) { pj_bucket_set_enabled(on); },
        "Whether small elementwise ops, scans and reductions run their size bucket's program "
        "(bucket.h; on by default). Storages padded before stay padded.");
  m.def("_size_buckets", [] { return pj_bucket_enabled(); });
  m.def("_set_source_lines", [](const std::string& file, std::unordered_map<int, std::string> lines) {
    set_source_lines(file, std::move(lines));
  }, "A compiled graph's generated-code lines -> its nodes' user source lines (index-check "
     "errors name those).");
  m.def("_eager_mode", [] { return static_cast<int>(eager_mode()); });
  m.def("_defer_flush", [] { check(pj_defer_flush()); },
        "Runs the ops recorded by the defer_and_fuse mode.");
  m.def("_defer_pending_ops", [] { return pj_defer_pending_ops(); });
  m.def("_defer_graph_text", [] {
    char* t = pj_defer_graph_text();
    std::string s = t ? t : "";
    std::free(t);
    return s;
  });
  m.def("_defer_set_max_ops", [](int n) { pj_defer_set_max_ops(n); });
  m.def("_defer_max_ops", [] { return pj_defer_max_ops(); });
  m.def("_defer_reset_detector", [] { pj_defer_reset_detector(); });
  m.def("_set_check_nan", [](bool on) { set_check_nan(on); });
  m.def("_configure_cache", [](const std::string& dir, int64_t max_bytes, bool shared,
                               bool readonly, const std::string& secret) {
    // The cache's warnings (refused entries, naming the file) become PyTorch warnings: a
    // Python UserWarning when the lookup runs under an op called from Python, c10's log line
    // on other threads. TORCH_WARN only records (the Python handler raises, if warnings are
    // errors, when the op returns), so nothing unwinds through the C runtime; catch anyway.
    pj_disk_cache_set_warning_handler([](const char* message) {
      try {
        TORCH_WARN("torch_pjrt: ", message);
      } catch (...) {
      }
    });
    pj_disk_cache_options_t o{};
    o.dir = dir.c_str();
    o.max_bytes = max_bytes;
    o.shared = shared;
    o.readonly = readonly;
    o.secret = secret.data();
    o.secret_len = secret.size();
    check(pj_disk_cache_configure_options(&o));
  }, pybind11::arg("dir"), pybind11::arg("max_bytes"), pybind11::arg("shared") = false,
     pybind11::arg("readonly") = false, pybind11::arg("secret") = pybind11::bytes(""),
     "Sets the persistent compile cache directory ('' disables it), its size bound and its "
     "trust settings (csrc/include/torch_pjrt/disk_cache.h).");
  m.def("cache_stats", [] {
    std::map<std::string, pybind11::object> out;
    out["dir"] = pybind11::str(pj_disk_cache_dir());
    for (pj_metric_t k : {PJ_METRIC_DISK_HITS, PJ_METRIC_DISK_MISSES, PJ_METRIC_DISK_STORES,
                          PJ_METRIC_DISK_BYTES_READ, PJ_METRIC_DISK_BYTES_WRITTEN,
                          PJ_METRIC_DISK_CORRUPT, PJ_METRIC_DISK_EVICTIONS,
                          PJ_METRIC_DISK_REFUSED})
      out[pj_metric_name(k)] = pybind11::int_(pj_metric_get(k));
    bool shared, readonly, keyed;
    pj_disk_cache_mode(&shared, &readonly, &keyed);
    out["shared"] = pybind11::bool_(shared);
    out["readonly"] = pybind11::bool_(readonly);
    out["keyed"] = pybind11::bool_(keyed);
    char last[1024];
    pj_disk_cache_last_warning(last, sizeof last);
    out["last_warning"] = pybind11::str(last);
    return out;
  }, "Persistent compile cache statistics of this process.");
}

}  // namespace torch_pjrt
