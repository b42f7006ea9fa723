/* Free and total memory of a device, for torch.accelerator.get_memory_info /
 * torch.tpu.mem_get_info and the device properties' total_memory.
 *
 * Source, in order:
 *  1. the plugin's own memory statistics (PJRT_Device_MemoryStats with bytes_limit set: GPU and
 *     TPU plugins report their allocator's limit and what is in use);
 *  2. on the CPU plugin, device memory *is* host memory: total is the machine's physical memory
 *     and free what the kernel reports as available (MemAvailable), so a user sizing a batch
 *     from get_memory_info sees the memory the buffers will actually come from;
 *  3. otherwise the plugin does not say: PJ_ERR_UNIMPLEMENTED, as PyTorch's allocators answer. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "api_check.h"
#include "pjrt_c_api.h"
#include "torch_pjrt/memory_info.h"
#include "torch_pjrt/runtime.h"

/* MemAvailable from /proc/meminfo in bytes, or -1 when it cannot be read. */
static int64_t host_available_bytes(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  int64_t kb = -1;
  while (fgets(line, sizeof line, f)) {
    long long v;
    if (sscanf(line, "MemAvailable: %lld kB", &v) == 1) {
      kb = v;
      break;
    }
  }
  fclose(f);
  return kb < 0 ? -1 : kb * 1024;
}

static pj_status_t *plugin_stats(const pj_runtime_t *rt, int device, int64_t *free_b,
                                 int64_t *total_b, bool *found) {
  *found = false;
  const PJRT_Api *api = pj_runtime_api(rt);
  if (!PJ_API_HAS(api, PJRT_Device_MemoryStats)) return NULL;
  PJRT_Device_MemoryStats_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Device_MemoryStats_Args_STRUCT_SIZE;
  a.device = pj_runtime_device(rt, device);
  pj_status_t *st = pj_runtime_take_error(rt, api->PJRT_Device_MemoryStats(&a), "memory stats");
  if (st) { /* a plugin that does not implement the statistics: fall through to the next source */
    pj_status_free(st);
    return NULL;
  }
  if (!a.bytes_limit_is_set || a.bytes_limit <= 0) return NULL;
  *total_b = a.bytes_limit;
  *free_b = a.bytes_limit > a.bytes_in_use ? a.bytes_limit - a.bytes_in_use : 0;
  *found = true;
  return NULL;
}

pj_status_t *pj_device_memory_info(int device, int64_t *free_bytes, int64_t *total_bytes) {
  pj_runtime_t *rt;
  PJ_TRY(pj_runtime_get(&rt));
  if (device < 0 || device >= pj_runtime_device_count(rt))
    return pj_status_new(PJ_ERR_RUNTIME, "Invalid device argument %d: the tpu runtime has %d "
                         "device(s)", device, pj_runtime_device_count(rt));
  bool found;
  PJ_TRY(plugin_stats(rt, device, free_bytes, total_bytes, &found));
  if (found) return NULL;
  if (strcmp(pj_runtime_platform_name(rt), "cpu") == 0) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    int64_t avail = host_available_bytes();
    if (pages > 0 && page > 0 && avail >= 0) {
      *total_bytes = (int64_t)pages * page;
      *free_bytes = avail < *total_bytes ? avail : *total_bytes;
      return NULL;
    }
  }
  return pj_status_new(PJ_ERR_UNIMPLEMENTED, "the %s plugin reports no memory limit for device %d",
                       pj_runtime_platform_name(rt), device);
}
