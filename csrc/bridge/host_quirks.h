// CPU results that depend on the host CPU, found by asking CPU itself (so tpu equals CPU on the
// host beside it by construction): the convolution memory-format rule reads
// cpu_onednn_takes; configure_host_quirks hands the numeric ones to the lowerings
// (torch_pjrt/host_quirks.h). Both are called only after torch is loaded.
#pragma once

#include <ATen/ATen.h>

namespace torch_pjrt {

// Whether CPU runs reduced-precision (bfloat16, float16) convolutions in oneDNN on this host.
bool cpu_onednn_takes(at::ScalarType dt);

// Asks CPU for the host-dependent results the lowerings reproduce and sets them; at module
// start-up, before any program is built.
void configure_host_quirks();

}  // namespace torch_pjrt
