// Python bindings of whole-graph capture (torch_pjrt/capture.h) for the torch.compile backend
// (torch_pjrt/compile/): begin/end a capture over tensors, a Plan object that runs the captured
// program over new tensors, and the per-call path of a compiled graph (_GraphEntry: run a plan
// and rebuild the graph's outputs around its results; _GraphCache: find the entry for a call's
// arguments). The per-call path is here, not in Python, because it runs on every call of every
// compiled graph: in Python it cost more host time than the program launch itself.
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>
#include <pybind11/complex.h>  // py::cast of std::complex (a complex scalar argument)

#include <complex>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bridge.h"
extern "C" {
#include "torch_pjrt/capture.h"
}

namespace torch_pjrt {
namespace {

std::vector<pj_storage_t*> storages(const std::vector<at::Tensor>& ts, const char* what) {
  std::vector<pj_storage_t*> out;
  out.reserve(ts.size());
  for (const auto& t : ts) {
    pj_storage_t* s = storage_of(t);
    TORCH_CHECK(s != nullptr, "compiled graph: ", what, " tensor on ", t.device(),
                " is not a tpu tensor");
    out.push_back(s);
  }
  return out;
}

// The generator state a run of plan `p` draws from (nullptr when the captured graph draws no
// random numbers): taken from the default generator of the plan's device, which advances as far
// as the graph's random ops advanced it at capture. Every run thus draws what the same ops run
// eagerly would draw next, and eager ops after it continue the same stream.
const pj_plan_rng_t* take_rng(pj_plan_t* p, pj_plan_rng_t* state) {
  int device = 0;
  uint64_t increment = 0;
  if (pj_plan_draws(p, &device, &increment) == 0) return nullptr;
  auto [seed, offset] = rng_next(std::nullopt, device, increment);
  *state = pj_plan_rng_t{seed, offset};
  return state;
}

// Owns a pj_plan_t; Python holds it through a shared_ptr.
struct Plan {
  pj_plan_t* p;
  explicit Plan(pj_plan_t* plan) : p(plan) {}
  ~Plan() { pj_plan_free(p); }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
};

namespace py = pybind11;

// How a graph's output is rebuilt after a run: a Python value recorded at capture, or a view
// (sizes, strides, offset) of a result storage of the run or of an argument's storage.
struct OutputSpec {
  enum Kind { kValue, kResult, kArgument } kind;
  int where = 0;  // result storage index (kResult) or argument index (kArgument)
  py::object value;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
};

// A captured graph for one argument signature: its plan, the result storages each run
// allocates (numel, dtype), and its outputs' layout.
struct GraphEntry {
  std::shared_ptr<Plan> plan;
  std::vector<std::pair<int64_t, at::ScalarType>> results;
  std::vector<OutputSpec> outputs;
  bool as_tuple = true;
  std::optional<at::Device> device;

  // Runs the plan over `plan_inputs` (None: the tensors among `args`, in order) and returns the
  // outputs; outputs that alias an argument are views of that argument.
  py::object run(const py::sequence& args, const py::object& plan_inputs) const {
    py::tuple argt = py::tuple(args);  // no copy when args is a tuple
    std::vector<pj_storage_t*> in;
    if (plan_inputs.is_none()) {
      in.reserve(argt.size());
      for (const auto& a : argt)
        if (THPVariable_Check(a.ptr())) in.push_back(input_storage(THPVariable_Unpack(a.ptr())));
    } else {
      for (const auto& a : plan_inputs) in.push_back(input_storage(py::cast<at::Tensor>(a)));
    }
    std::vector<at::Tensor> bases;
    std::vector<pj_storage_t*> out;
    bases.reserve(results.size());
    out.reserve(results.size());
    for (const auto& [numel, dtype] : results) {
      bases.push_back(at::empty({numel}, at::TensorOptions().dtype(dtype).device(*device)));
      out.push_back(storage_of(bases.back()));
    }
    pj_plan_rng_t state;
    const pj_plan_rng_t* rng = take_rng(plan->p, &state);
    pj_status_t* st;
    {
      py::gil_scoped_release nogil;
      st = pj_plan_run(plan->p, in.data(), static_cast<int>(in.size()), out.data(),
                       static_cast<int>(out.size()), rng);
    }
    check(st);
    py::list outs(outputs.size());
    for (size_t i = 0; i < outputs.size(); i++) {
      const OutputSpec& o = outputs[i];
      if (o.kind == OutputSpec::kValue) {
        outs[i] = o.value;
        continue;
      }
      if (o.kind == OutputSpec::kResult) {
        // A result is a tensor of its own on the fresh storage, not a view of a base tensor:
        // a view would carry view metadata the graph's eager output did not have, and
        // AOTAutograd's autograd.Function refuses in-place updates of an output that is a view
        // (Transformers' Trainer scales the loss with `loss *= scale`). Outputs sharing one
        // result storage still share it.
        const at::Tensor& base = bases[static_cast<size_t>(o.where)];
        at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
            c10::Storage(base.storage()), base.key_set(), base.dtype());
        t.unsafeGetTensorImpl()->set_sizes_and_strides(o.sizes, o.strides, o.offset);
        outs[i] = py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t)));
        continue;
      }
      // an output aliasing an input is a view of it, as the graph's eager output was
      const at::Tensor& src = THPVariable_Unpack(argt[static_cast<size_t>(o.where)].ptr());
      outs[i] = py::reinterpret_steal<py::object>(
          THPVariable_Wrap(src.as_strided(o.sizes, o.strides, o.offset)));
    }
    if (as_tuple) return py::tuple(outs);
    return std::move(outs);
  }

  static pj_storage_t* input_storage(const at::Tensor& t) {
    pj_storage_t* s = storage_of(t);
    TORCH_CHECK(s != nullptr, "compiled graph: input tensor on ", t.device(),
                " is not a tpu tensor");
    return s;
  }
};

template <typename T>
void append(std::string& sig, const T& v) {
  sig.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// Everything a plan depends on, as bytes: per tensor argument its dtype, device, sizes,
// strides, offset, storage size and which earlier argument shares its storage; per other
// argument its type and value. nullopt when the call cannot use a plan (a tensor on another
// device, an argument of another type).
bool is_device_mesh(py::handle obj) {
  static PyObject* mesh_type = [] {
    try {
      py::object t = py::module_::import("torch.distributed.device_mesh").attr("DeviceMesh");
      return t.release().ptr();
    } catch (const py::error_already_set&) {
      return static_cast<PyObject*>(nullptr);  // torch without distributed: no meshes
    }
  }();
  return mesh_type && PyObject_IsInstance(obj.ptr(), mesh_type) == 1;
}

std::optional<std::string> signature(const py::tuple& args) {
  std::string sig;
  sig.reserve(args.size() * 64);
  std::vector<const c10::StorageImpl*> seen;
  seen.reserve(args.size());
  for (size_t i = 0; i < args.size(); i++) {
    PyObject* a = args[i].ptr();
    if (THPVariable_Check(a)) {
      const at::Tensor& t = THPVariable_Unpack(a);
      if (t.device().type() != c10::DeviceType::PrivateUse1) return std::nullopt;
      const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
      int64_t first = static_cast<int64_t>(i);
      for (size_t j = 0; j < seen.size(); j++)
        if (seen[j] == impl) {
          first = static_cast<int64_t>(j);
          break;
        }
      seen.push_back(impl);
      sig.push_back('T');
      append(sig, static_cast<int16_t>(t.scalar_type()));
      append(sig, static_cast<int16_t>(t.device().index()));
      append(sig, static_cast<int64_t>(t.dim()));
      for (int64_t d : t.sizes()) append(sig, d);
      for (int64_t d : t.strides()) append(sig, d);
      append(sig, t.storage_offset());
      append(sig, static_cast<int64_t>(t.storage().nbytes()));
      append(sig, first);
      continue;
    }
    seen.push_back(nullptr);
    if (a == Py_None) {
      sig.push_back('N');
    } else if (PyBool_Check(a)) {
      sig.push_back(a == Py_True ? 'Y' : 'n');
    } else if (PyLong_CheckExact(a)) {
      int overflow = 0;
      long long v = PyLong_AsLongLongAndOverflow(a, &overflow);
      if (overflow) return std::nullopt;
      sig.push_back('I');
      append(sig, v);
    } else if (PyFloat_CheckExact(a)) {
      double v = PyFloat_AS_DOUBLE(a);
      sig.push_back('F');
      append(sig, v);  // bit pattern: 0.0 and -0.0 (and NaN payloads) stay distinct
    } else if (PyUnicode_CheckExact(a)) {
      Py_ssize_t n = 0;
      const char* u = PyUnicode_AsUTF8AndSize(a, &n);
      if (!u) throw py::error_already_set();
      sig.push_back('S');
      append(sig, static_cast<int64_t>(n));
      sig.append(u, static_cast<size_t>(n));
    } else if (THPDtype_Check(a)) {
      sig.push_back('D');
      append(sig, static_cast<int16_t>(reinterpret_cast<THPDtype*>(a)->scalar_type));
    } else if (THPDevice_Check(a)) {
      const at::Device& d = reinterpret_cast<THPDevice*>(a)->device;
      sig.push_back('V');
      append(sig, static_cast<int16_t>(d.type()));
      append(sig, static_cast<int16_t>(d.index()));
    } else if (is_device_mesh(args[i])) {
      // A DeviceMesh (the group argument of the functional collectives tensor parallelism
      // puts into graphs) stands for its dimensions' process groups, by name: a graph
      // captured with it runs its collectives over those groups (native_dist.cpp).
      py::object names = py::getattr(args[i], "_dim_group_names", py::none());
      if (names.is_none()) return std::nullopt;
      std::string key = py::str(py::tuple(names));
      sig.push_back('M');
      append(sig, static_cast<int64_t>(key.size()));
      sig.append(key);
    } else {
      return std::nullopt;  // SymInts and other objects: not specialized here
    }
  }
  return sig;
}

// The captured entries of one graph, by argument signature.
struct GraphCache {
  std::unordered_map<std::string, std::shared_ptr<GraphEntry>> entries;

  // The outputs of running the entry for these arguments, or None when there is none.
  py::object run(const py::tuple& args) const {
    auto sig = signature(args);
    if (!sig) return py::none();
    auto it = entries.find(*sig);
    if (it == entries.end()) return py::none();
    return it->second->run(args, py::none());
  }
};

}  // namespace

void bind_capture(pybind11::module_& m) {
  py::class_<Plan, std::shared_ptr<Plan>>(m, "_Plan")
      .def("run", [](Plan& self, const std::vector<at::Tensor>& inputs,
                     const std::vector<at::Tensor>& outputs) {
             auto in = storages(inputs, "input");
             auto out = storages(outputs, "output");
             pj_plan_rng_t state;
             const pj_plan_rng_t* rng = take_rng(self.p, &state);
             pj_status_t* st;
             {
               py::gil_scoped_release nogil;
               st = pj_plan_run(self.p, in.data(), static_cast<int>(in.size()), out.data(),
                                static_cast<int>(out.size()), rng);
             }
             check(st);
           },
           "Runs the captured program: inputs as at capture, outputs fresh tpu storages; its "
           "random ops draw from the device's default tpu generator.")
      .def("text", [](Plan& self) {
             char* t = nullptr;
             check(pj_plan_text(self.p, &t));
             std::string s = t ? t : "";
             std::free(t);
             return s;
           },
           "The StableHLO text of the captured program.")
      .def("params", [](Plan& self) {
             std::vector<int> v(static_cast<size_t>(pj_plan_params(self.p, nullptr, 0)));
             pj_plan_params(self.p, v.data(), static_cast<int>(v.size()));
             return v;
           },
           "Source of each program parameter in argument order: the input index, or -1 for a "
           "constant the plan holds.")
      .def("results", [](Plan& self) {
             std::vector<int> v(static_cast<size_t>(pj_plan_results(self.p, nullptr, 0)));
             pj_plan_results(self.p, v.data(), static_cast<int>(v.size()));
             return v;
           },
           "Destination of each program result: the input index (updated in place), -1 for a "
           "constant, or -2 - j for output j.")
      .def("scalars", [](Plan& self) {
             int n = pj_plan_scalars(self.p, nullptr, 0);
             std::vector<pj_scalar_t> v(static_cast<size_t>(n));
             pj_plan_scalars(self.p, v.data(), n);
             py::list out;
             for (const auto& sc : v) {
               if (sc.dtype == PJ_C128 || pj_dtype_info(sc.dtype)->is_complex)
                 out.append(py::cast(std::complex<double>(sc.f, sc.imag)));
               else if (pj_dtype_info(sc.dtype)->is_float)
                 out.append(py::float_(sc.f));
               else if (sc.dtype == PJ_BOOL)
                 out.append(py::bool_(sc.i != 0));
               else
                 out.append(py::int_(sc.i));
             }
             return out;
           },
           "Values of the program's scalar arguments (after the parameters), as recorded.")
      .def("stats", [](Plan& self) {
             int ops, params, results, scalars;
             pj_plan_stats(self.p, &ops, &params, &results, &scalars);
             return py::dict(py::arg("ops") = ops, py::arg("params") = params,
                             py::arg("results") = results, py::arg("scalars") = scalars);
           })
      .def("draws", [](Plan& self) {
             int device = 0;
             uint64_t increment = 0;
             int n = pj_plan_draws(self.p, &device, &increment);
             return py::make_tuple(n, n ? py::object(py::int_(device)) : py::object(py::none()),
                                   py::int_(n ? increment : 0));
           },
           "(draws, device, increment): how many generator draws a run makes, from which "
           "device's default tpu generator, advancing it by how much in total.");
  py::class_<GraphEntry, std::shared_ptr<GraphEntry>>(m, "_GraphEntry")
      .def(py::init([](std::shared_ptr<Plan> plan, const py::list& results,
                       const py::list& layout, bool as_tuple, std::optional<at::Device> device) {
             auto e = std::make_shared<GraphEntry>();
             e->plan = std::move(plan);
             e->as_tuple = as_tuple;
             e->device = device;
             for (const auto& r : results) {
               auto t = r.cast<std::pair<int64_t, at::ScalarType>>();
               e->results.push_back(t);
             }
             for (const auto& item : layout) {
               auto t = item.cast<py::tuple>();
               OutputSpec o;
               auto kind = t[0].cast<std::string>();
               if (kind == "value") {
                 o.kind = OutputSpec::kValue;
                 o.value = t[1];
               } else {
                 TORCH_CHECK(kind == "out" || kind == "input", "_GraphEntry: bad kind ", kind);
                 o.kind = kind == "out" ? OutputSpec::kResult : OutputSpec::kArgument;
                 o.where = t[1].cast<int>();
                 auto meta = t[2].cast<py::tuple>();
                 o.sizes = meta[0].cast<std::vector<int64_t>>();
                 o.strides = meta[1].cast<std::vector<int64_t>>();
                 o.offset = meta[2].cast<int64_t>();
               }
               e->outputs.push_back(std::move(o));
             }
             TORCH_CHECK(e->results.empty() || e->device.has_value(),
                         "_GraphEntry: result storages need a device");
             return e;
           }),
           py::arg("plan"), py::arg("results"), py::arg("layout"), py::arg("as_tuple"),
           py::arg("device"),
           "results: (numel, dtype) of each storage a run allocates; layout: per output "
           "('value', v, None), ('out', result index, (sizes, strides, offset)) or ('input', "
           "argument index, (sizes, strides, offset)).")
      .def_property_readonly("plan", [](const GraphEntry& e) { return e.plan; })
      .def("run", &GraphEntry::run, py::arg("args"), py::arg("plan_inputs") = py::none(),
           "Runs the plan over plan_inputs (default: the tensors among args, as captured) and "
           "returns the outputs.");
  py::class_<GraphCache, std::shared_ptr<GraphCache>>(m, "_GraphCache")
      .def(py::init<>())
      .def("signature", [](const GraphCache&, const py::tuple& args) -> py::object {
             auto sig = signature(args);
             if (!sig) return py::none();
             return py::bytes(*sig);
           },
           "The bytes a plan for these arguments is keyed on, or None when no plan can serve "
           "them.")
      .def("run", &GraphCache::run,
           "The outputs of the entry for these arguments, or None when there is none.")
      .def("add", [](GraphCache& c, const py::bytes& sig, std::shared_ptr<GraphEntry> e) {
        c.entries[std::string(sig)] = std::move(e);
      })
      .def("__len__", [](const GraphCache& c) { return c.entries.size(); });
  m.def("_capture_begin", [](bool thread_only) {
    // in step before recording starts: a change noticed at the graph's first op would flush
    // (product_precision.cpp), and a flush inside a capture breaks it
    sync_product_precision();
    check(thread_only ? pj_capture_begin_thread() : pj_capture_begin());
  }, py::arg("thread_only") = false,
        "Starts recording every lowered op into one graph (see capture.h): every thread's, or "
        "with thread_only the calling thread's alone.");
  m.def("_capture_active", [] { return pj_capture_active(); });
  m.def("_capture_abort", [] {
    pj_status_t* st;
    {
      py::gil_scoped_release nogil;  // what was recorded may hold collectives (as above)
      st = pj_capture_abort();
    }
    check(st);
  },
        "Ends a capture without a plan; what was recorded runs.");
  // Ends the capture through `end` (pj_capture_end or pj_capture_end_unrun): a _Plan or None.
  using EndFn = pj_status_t* (*)(pj_storage_t* const*, int, pj_storage_t* const*, int,
                                 pj_plan_t**);
  auto end_capture = [](EndFn end, const std::vector<at::Tensor>& inputs,
                        const std::vector<at::Tensor>& outputs) -> py::object {
    auto in = storages(inputs, "input");
    auto out = storages(outputs, "output");
    pj_plan_t* plan = nullptr;
    pj_status_t* st;
    {
      // a graph holding collectives runs through its group's rendezvous: the other ranks may
      // need the GIL to get there
      py::gil_scoped_release nogil;
      st = end(in.data(), static_cast<int>(in.size()), out.data(), static_cast<int>(out.size()),
               &plan);
    }
    check(st);
    if (!plan) return py::none();
    return py::cast(std::make_shared<Plan>(plan));
  };
  m.def("_capture_end", [end_capture](const std::vector<at::Tensor>& inputs,
                                      const std::vector<at::Tensor>& outputs) {
    return end_capture(&pj_capture_end, inputs, outputs);
  }, "Ends the capture and runs the graph once; returns a _Plan, or None when the capture was "
     "broken (the graph then ran as defer_and_fuse runs it).");
  m.def("_capture_end_unrun", [end_capture](const std::vector<at::Tensor>& inputs,
                                            const std::vector<at::Tensor>& outputs) {
    return end_capture(&pj_capture_end_unrun, inputs, outputs);
  }, "Ends the capture without running it (torch.tpu.TPUGraph); returns a _Plan, or None when "
     "the capture was broken (what it recorded then ran as defer_and_fuse runs it).");
}

}  // namespace torch_pjrt
