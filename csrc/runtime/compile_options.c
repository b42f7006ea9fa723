/* Serialized xla.CompileOptionsProto (compile_options.h). Field numbers, from XLA's public
 * proto definitions (xla/pjrt/proto/compile_options.proto, xla/xla_data.proto):
 *   CompileOptionsProto: executable_build_options = 3, compile_portable_executable = 4,
 *     env_option_overrides = 7 (map<string, OptionOverrideProto>: entries with key = 1,
 *     value = 2);
 *   ExecutableBuildOptionsProto: num_replicas = 4, num_partitions = 5, device_assignment = 9;
 *   DeviceAssignmentProto: replica_count = 1, computation_count = 2, computation_devices = 3
 *     (ComputationDevice: replica_device_ids = 1, repeated int64);
 *   OptionOverrideProto: bool_field = 2 (a oneof member).
 * Empty options are unsafe: the default replica count is 0. A device assignment is a
 * computation_count x replica_count table of global device ids stored per computation
 * (partition); with one partition it is one ComputationDevice listing replica 0's device,
 * replica 1's, and so on. */
#include "torch_pjrt/compile_options.h"

#include <stdlib.h>
#include <string.h>

#include "proto.h"

bool pj_compile_options_round_each_op(void) {
  const char *flags = getenv("XLA_FLAGS");
  return !(flags && strstr(flags, "xla_allow_excess_precision"));
}

pj_status_t *pj_compile_options_build(int nreplicas, const int64_t *device_ids,
                                      bool round_each_op, void **bytes, size_t *len) {
  *bytes = NULL;
  *len = 0;
  if (nreplicas < 0 || (nreplicas > 0 && !device_ids))
    return pj_status_new(PJ_ERR_VALUE, "compile options: %d replicas need %d device ids",
                         nreplicas, nreplicas);
  pj_pb_t build = {0}, assignment = {0}, computation = {0}, ids = {0}, out = {0};
  pj_pb_uint(&build, 4, nreplicas > 0 ? (uint64_t)nreplicas : 1); /* num_replicas */
  pj_pb_uint(&build, 5, 1);                                       /* num_partitions */
  if (nreplicas > 0) {
    for (int r = 0; r < nreplicas; r++) pj_pb_varint(&ids, (uint64_t)device_ids[r]);
    pj_pb_bytes(&computation, 1, ids.p, ids.len); /* packed replica_device_ids */
    if (ids.failed) computation.failed = true;
    pj_pb_uint(&assignment, 1, (uint64_t)nreplicas); /* replica_count */
    pj_pb_uint(&assignment, 2, 1);                   /* computation_count */
    pj_pb_message(&assignment, 3, &computation);
    pj_pb_message(&build, 9, &assignment);
  }
  pj_pb_message(&out, 3, &build);
  /* Portable only for one unbound replica: a bound program runs where its assignment says. */
  if (nreplicas == 0) pj_pb_uint(&out, 4, 1);
  if (round_each_op) {
    /* By default XLA keeps half-precision intermediates unrounded between the ops it fuses,
     * so a fused program (DeferAndFuse, torch.compile) computes sin(a + b) of bfloat16
     * tensors from the unrounded sum; PyTorch rounds every op's result to its dtype. */
    static const char flag[] = "xla_allow_excess_precision";
    pj_pb_t entry = {0}, value = {0};
    pj_pb_uint(&value, 2, 0); /* bool_field = false, written: a oneof member needs presence */
    pj_pb_bytes(&entry, 1, flag, sizeof flag - 1);
    pj_pb_message(&entry, 2, &value);
    pj_pb_message(&out, 7, &entry);
    pj_pb_free(&entry);
    pj_pb_free(&value);
  }
  bool failed = out.failed;
  pj_pb_free(&build);
  pj_pb_free(&assignment);
  pj_pb_free(&computation);
  pj_pb_free(&ids);
  if (failed) {
    pj_pb_free(&out);
    return pj_status_new(PJ_ERR_OOM, "out of host memory");
  }
  *bytes = out.p;
  *len = out.len;
  return NULL;
}
