// Python bindings of whole-graph capture (torch_pjrt/capture.h) for the torch.compile backend
// (torch_pjrt/compile/): begin/end a capture over tensors, and a Plan object that runs the
// captured program over new tensors.
#include <torch/extension.h>

#include <complex>
#include <memory>
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

// Owns a pj_plan_t; Python holds it through a shared_ptr.
struct Plan {
  pj_plan_t* p;
  explicit Plan(pj_plan_t* plan) : p(plan) {}
  ~Plan() { pj_plan_free(p); }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
};

}  // namespace

void bind_capture(pybind11::module_& m) {
  namespace py = pybind11;
  py::class_<Plan, std::shared_ptr<Plan>>(m, "_Plan")
      .def("run", [](Plan& self, const std::vector<at::Tensor>& inputs,
                     const std::vector<at::Tensor>& outputs) {
             auto in = storages(inputs, "input");
             auto out = storages(outputs, "output");
             pj_status_t* st;
             {
               py::gil_scoped_release nogil;
               st = pj_plan_run(self.p, in.data(), static_cast<int>(in.size()), out.data(),
                                static_cast<int>(out.size()));
             }
             check(st);
           },
           "Runs the captured program: inputs as at capture, outputs fresh tpu storages.")
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
      });
  m.def("_capture_begin", [] { check(pj_capture_begin()); },
        "Starts recording every lowered op into one graph (see capture.h).");
  m.def("_capture_active", [] { return pj_capture_active(); });
  m.def("_capture_abort", [] { check(pj_capture_abort()); },
        "Ends a capture without a plan; what was recorded runs.");
  m.def("_capture_end", [](const std::vector<at::Tensor>& inputs,
                           const std::vector<at::Tensor>& outputs) -> py::object {
    auto in = storages(inputs, "input");
    auto out = storages(outputs, "output");
    pj_plan_t* plan = nullptr;
    check(pj_capture_end(in.data(), static_cast<int>(in.size()), out.data(),
                         static_cast<int>(out.size()), &plan));
    if (!plan) return py::none();
    return py::cast(std::make_shared<Plan>(plan));
  }, "Ends the capture and runs the graph once; returns a _Plan, or None when the capture was "
     "broken (the graph then ran as defer_and_fuse runs it).");
}

}  // namespace torch_pjrt
