/* Plugin loading, client creation and device enumeration. One runtime per process, created on
 * first use under `init_lock` and never destroyed (PJRT clients are not safely destroyable while
 * buffers may still be referenced by PyTorch storages at interpreter exit). */
#define _GNU_SOURCE
#include "torch_pjrt/runtime.h"
#include "torch_pjrt/kv_store.h"
#include "torch_pjrt/exec.h"
#include "torch_pjrt/hlo.h" /* pj_hlo_f32_product_precision: part of the key identity */

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api_check.h"
#include "ffi_kernels.h"
#include "torch_pjrt_code_id.h" /* generated: build/include, see the Makefile */

#define PJ_MAX_DEVICES 64

struct pj_runtime {
  void *dl;
  const PJRT_Api *api;
  PJRT_Client *client;
  int ndev;
  PJRT_Device *devices[PJ_MAX_DEVICES];
  /* The plugin's global id of each addressable device (PJRT_DeviceDescription_Id): what a
   * compiled device assignment names, which need not equal the index in `devices`. */
  int64_t ids[PJ_MAX_DEVICES];
  /* Each device's description (owned by the client): its attributes, e.g. a TPU's `coords`
   * and `core_on_chip`, which topology-aware meshes order devices by. */
  PJRT_DeviceDescription *descs[PJ_MAX_DEVICES];
  char kinds[PJ_MAX_DEVICES][64];
  char platform[64];
  char platform_version[128];
  char path[1024];
  char identity[2048];
  /* digests of identity, one per float32 product precision (pj_runtime_key_identity) */
  char key_identity[PJ_PRECISION_COUNT][17];
};

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static pj_runtime_t *g_runtime;       /* set once, under init_lock */
static char g_init_error[2048];       /* sticky first failure, re-reported to later callers */
static pj_code_t g_init_code;
static char g_configured_path[1024];
/* Set in a child forked after the client existed: the plugin's threads did not survive the
 * fork, so the inherited client must never be used (calls could hang). Like CUDA, the child
 * gets an error and should use the spawn start method. */
static volatile int g_forked_child;
static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;

static void on_fork_child(void) {
  if (g_runtime) g_forked_child = 1;
}
static void install_atfork(void) { pthread_atfork(NULL, NULL, on_fork_child); }
static int g_cpu_device_count = 1;
/* The store the client is created with (kv_store.h), when one was set before it existed. */
static pj_kv_store_t g_kv_store;
static bool g_has_kv_store;

pj_status_t *pj_runtime_set_kv_store(const pj_kv_store_t *s) {
  pthread_mutex_lock(&init_lock);
  pj_status_t *st = NULL;
  if (g_runtime) {
    st = pj_status_new(PJ_ERR_RUNTIME,
                       "the PJRT runtime is already initialized: a key-value store must be set "
                       "before the first use of a tpu device");
  } else if (s && (!s->get || !s->try_get || !s->put)) {
    st = pj_status_new(PJ_ERR_VALUE, "a key-value store needs get, try_get and put");
  } else {
    g_has_kv_store = s != NULL;
    if (s) g_kv_store = *s;
  }
  pthread_mutex_unlock(&init_lock);
  return st;
}

pj_status_t *pj_runtime_take_error(const pj_runtime_t *rt, PJRT_Error *err, const char *what) {
  if (!err) return NULL;
  const PJRT_Api *api = rt->api;
  PJRT_Error_Message_Args m = {.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE, .error = err};
  api->PJRT_Error_Message(&m);
  pj_code_t code = PJ_ERR_RUNTIME;
  if (PJ_API_HAS(api, PJRT_Error_GetCode)) {
    PJRT_Error_GetCode_Args g = {.struct_size = PJRT_Error_GetCode_Args_STRUCT_SIZE, .error = err};
    if (!api->PJRT_Error_GetCode(&g) && g.code == PJRT_Error_Code_RESOURCE_EXHAUSTED)
      code = PJ_ERR_OOM;
  }
  pj_status_t *st = pj_status_new(code, "%s: %.*s", what, (int)m.message_size, m.message);
  PJRT_Error_Destroy_Args d = {.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE, .error = err};
  api->PJRT_Error_Destroy(&d);
  return st;
}

pj_status_t *pj_runtime_configure(const char *plugin_path, int cpu_device_count) {
  pthread_mutex_lock(&init_lock);
  pj_status_t *st = NULL;
  if (g_runtime) {
    st = pj_status_new(PJ_ERR_RUNTIME, "the PJRT runtime is already initialized");
  } else {
    snprintf(g_configured_path, sizeof g_configured_path, "%s", plugin_path ? plugin_path : "");
    if (cpu_device_count > 0) g_cpu_device_count = cpu_device_count;
  }
  pthread_mutex_unlock(&init_lock);
  return st;
}

pj_status_t *pj_runtime_refuse(pj_code_t code, const char *message) {
  pthread_mutex_lock(&init_lock);
  pj_status_t *st = NULL;
  if (g_runtime) {
    st = pj_status_new(PJ_ERR_RUNTIME, "the PJRT runtime is already initialized");
  } else {
    snprintf(g_init_error, sizeof g_init_error, "%s", message ? message : "refused");
    g_init_code = code;
  }
  pthread_mutex_unlock(&init_lock);
  return st;
}

static const char *named_string(const PJRT_NamedValue *v, size_t n, const char *name,
                                char *buf, size_t cap) {
  for (size_t i = 0; i < n; i++) {
    if (strlen(name) == v[i].name_size && memcmp(v[i].name, name, v[i].name_size) == 0) {
      if (v[i].type == PJRT_NamedValue_kString)
        snprintf(buf, cap, "%.*s", (int)v[i].value_size, v[i].string_value);
      else if (v[i].type == PJRT_NamedValue_kInt64)
        snprintf(buf, cap, "%lld", (long long)v[i].int64_value);
      return buf;
    }
  }
  return NULL;
}

static pj_status_t *load_plugin(pj_runtime_t *rt) {
  const char *path = g_configured_path[0] ? g_configured_path : getenv("TORCH_PJRT_PLUGIN");
  if (!path || !path[0] || !strchr(path, '/'))
    return pj_status_new(PJ_ERR_PLUGIN,
                         "no PJRT plugin file was given (TORCH_PJRT_PLUGIN=%s); install the CPU "
                         "plugin with `pip install lammps-jax-pjrt-cpu` or point "
                         "TORCH_PJRT_PLUGIN at a .so exporting GetPjrtApi",
                         path ? path : "");
  snprintf(rt->path, sizeof rt->path, "%s", path);
  /* RTLD_LOCAL: the plugin carries its own copies of LLVM/absl/protobuf symbols; keeping them
   * local avoids clashes with the copies inside libtorch. */
  rt->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!rt->dl)
    return pj_status_new(PJ_ERR_PLUGIN, "cannot load PJRT plugin %s: %s", path, dlerror());
  const PJRT_Api *(*get_api)(void) = (const PJRT_Api *(*)(void))dlsym(rt->dl, "GetPjrtApi");
  if (!get_api)
    return pj_status_new(PJ_ERR_PLUGIN, "%s does not export GetPjrtApi: not a PJRT plugin", path);
  const PJRT_Api *api = get_api();
  if (!api) return pj_status_new(PJ_ERR_PLUGIN, "GetPjrtApi() in %s returned NULL", path);
  rt->api = api;
  if (api->pjrt_api_version.major_version != PJRT_API_MAJOR)
    return pj_status_new(PJ_ERR_PLUGIN,
                         "PJRT plugin %s has C API major version %d; torch_pjrt supports %d",
                         path, api->pjrt_api_version.major_version, PJRT_API_MAJOR);
  /* The slots this runtime needs were all present by C API 0.54; refuse anything older with a
   * message rather than discovering a missing slot mid-run. Newer plugins are fine: we pass
   * our own struct sizes and the plugin accepts structs at least as large as it knows. */
  if (api->pjrt_api_version.minor_version < 54)
    return pj_status_new(PJ_ERR_PLUGIN,
                         "PJRT plugin %s has C API 0.%d, older than the 0.54 torch_pjrt needs",
                         path, api->pjrt_api_version.minor_version);
  PJ_API_SLOT(init, api, PJRT_Plugin_Initialize);
  PJRT_Plugin_Initialize_Args ia = {.struct_size = PJRT_Plugin_Initialize_Args_STRUCT_SIZE};
  return pj_runtime_take_error(rt, init(&ia), "PJRT_Plugin_Initialize");
}

static pj_status_t *create_client(pj_runtime_t *rt) {
  const PJRT_Api *api = rt->api;
  PJ_API_SLOT(create, api, PJRT_Client_Create);
  PJRT_Client_Create_Args ca = {.struct_size = PJRT_Client_Create_Args_STRUCT_SIZE};
  /* Plugins validate option names against their own list and reject unknown ones, so each
   * option goes only to the plugin that knows it, told apart by the plugin file's name.
   * CPU: cpu_device_count. GPU (xla_cuda_plugin / ROCm): preallocate=false, so device memory
   * is taken as tensors need it, as PyTorch's CUDA allocator does, instead of XLA's default of
   * reserving 75% of the card at client creation, which starves a second process on the same
   * GPU (two DDP ranks, pytest-xdist workers, vLLM beside a trainer). */
  PJRT_NamedValue cpu_opt = {.struct_size = PJRT_NamedValue_STRUCT_SIZE,
                             .name = "cpu_device_count",
                             .name_size = strlen("cpu_device_count"),
                             .type = PJRT_NamedValue_kInt64,
                             .int64_value = g_cpu_device_count,
                             .value_size = 1};
  PJRT_NamedValue gpu_opt = {.struct_size = PJRT_NamedValue_STRUCT_SIZE,
                             .name = "preallocate",
                             .name_size = strlen("preallocate"),
                             .type = PJRT_NamedValue_kBool,
                             .bool_value = false,
                             .value_size = 1};
  const char *file = strrchr(rt->path, '/');
  file = file ? file + 1 : rt->path;
  if (strstr(file, "cpu")) {
    ca.create_options = &cpu_opt;
    ca.num_options = 1;
  } else if (strstr(file, "cuda") || strstr(file, "rocm")) {
    ca.create_options = &gpu_opt;
    ca.num_options = 1;
  }
  if (g_has_kv_store) pj_kv_fill_client_args(&g_kv_store, &ca); /* set under init_lock */
  PJ_TRY(pj_runtime_take_error(rt, create(&ca), "PJRT_Client_Create"));
  rt->client = ca.client;

  PJ_API_SLOT(pname, api, PJRT_Client_PlatformName);
  PJRT_Client_PlatformName_Args pa = {.struct_size = PJRT_Client_PlatformName_Args_STRUCT_SIZE,
                                      .client = rt->client};
  PJ_TRY(pj_runtime_take_error(rt, pname(&pa), "PJRT_Client_PlatformName"));
  snprintf(rt->platform, sizeof rt->platform, "%.*s", (int)pa.platform_name_size,
           pa.platform_name);
  PJ_API_SLOT(pver, api, PJRT_Client_PlatformVersion);
  PJRT_Client_PlatformVersion_Args va = {
      .struct_size = PJRT_Client_PlatformVersion_Args_STRUCT_SIZE, .client = rt->client};
  PJ_TRY(pj_runtime_take_error(rt, pver(&va), "PJRT_Client_PlatformVersion"));
  snprintf(rt->platform_version, sizeof rt->platform_version, "%.*s",
           (int)va.platform_version_size, va.platform_version);
  pj_ffi_kernels_register(api, rt->platform);

  PJ_API_SLOT(adev, api, PJRT_Client_AddressableDevices);
  PJRT_Client_AddressableDevices_Args da = {
      .struct_size = PJRT_Client_AddressableDevices_Args_STRUCT_SIZE, .client = rt->client};
  PJ_TRY(pj_runtime_take_error(rt, adev(&da), "PJRT_Client_AddressableDevices"));
  rt->ndev = (int)(da.num_addressable_devices < PJ_MAX_DEVICES ? da.num_addressable_devices
                                                              : PJ_MAX_DEVICES);
  if (rt->ndev == 0) return pj_status_new(PJ_ERR_PLUGIN, "the PJRT plugin reports no devices");
  PJ_API_SLOT(getdesc, api, PJRT_Device_GetDescription);
  PJ_API_SLOT(kind, api, PJRT_DeviceDescription_Kind);
  PJ_API_SLOT(devid, api, PJRT_DeviceDescription_Id);
  for (int i = 0; i < rt->ndev; i++) {
    rt->devices[i] = da.addressable_devices[i];
    PJRT_Device_GetDescription_Args ga = {
        .struct_size = PJRT_Device_GetDescription_Args_STRUCT_SIZE, .device = rt->devices[i]};
    PJ_TRY(pj_runtime_take_error(rt, getdesc(&ga), "PJRT_Device_GetDescription"));
    rt->descs[i] = ga.device_description;
    PJRT_DeviceDescription_Kind_Args ka = {
        .struct_size = PJRT_DeviceDescription_Kind_Args_STRUCT_SIZE,
        .device_description = ga.device_description};
    PJ_TRY(pj_runtime_take_error(rt, kind(&ka), "PJRT_DeviceDescription_Kind"));
    snprintf(rt->kinds[i], sizeof rt->kinds[i], "%.*s", (int)ka.device_kind_size,
             ka.device_kind);
    PJRT_DeviceDescription_Id_Args ia = {.struct_size = PJRT_DeviceDescription_Id_Args_STRUCT_SIZE,
                                         .device_description = ga.device_description};
    PJ_TRY(pj_runtime_take_error(rt, devid(&ia), "PJRT_DeviceDescription_Id"));
    rt->ids[i] = ia.id;
  }

  char xla[128] = "", shlo[64] = "";
  if (PJ_API_HAS(api, PJRT_Plugin_Attributes)) {
    PJRT_Plugin_Attributes_Args aa = {.struct_size = PJRT_Plugin_Attributes_Args_STRUCT_SIZE};
    pj_status_t *st = pj_runtime_take_error(rt, api->PJRT_Plugin_Attributes(&aa), "attributes");
    if (st) {
      pj_status_free(st); /* attributes are informational; identity falls back to the rest */
    } else {
      named_string(aa.attributes, aa.num_attributes, "xla_version", xla, sizeof xla);
      named_string(aa.attributes, aa.num_attributes, "stablehlo_current_version", shlo,
                   sizeof shlo);
    }
  }
  /* The identity goes into every cache key, including the on-disk cache that several hosts
   * may share: it names the plugin build by file name and size rather than by its path (which
   * differs between virtual environments) and by the versions the plugin reports; PJ_CODE_ID
   * (a digest of our sources, generated by the Makefile) names the lowerings that built it.
   * The compiler's flags (XLA_FLAGS, LIBTPU_INIT_ARGS, read by the plugin and by exec.c's
   * compile options) change what a program compiles to, so their digest is part of it too. */
  uint64_t flags = 0;
  const char *vars[] = {"XLA_FLAGS", "LIBTPU_INIT_ARGS"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    flags = pj_hash_bytes(v ? v : "", v ? strlen(v) : 0, flags + i + 1);
  }
  struct stat sb;
  long long plugin_size = stat(rt->path, &sb) == 0 ? (long long)sb.st_size : -1;
  const char *base = strrchr(rt->path, '/');
  snprintf(rt->identity, sizeof rt->identity,
           "%s|%s|api%d.%d|xla%s|shlo%s|%s|%lld|code%s|flags%016llx|native%d", rt->platform,
           rt->platform_version, api->pjrt_api_version.major_version,
           api->pjrt_api_version.minor_version, xla, shlo, base ? base + 1 : rt->path,
           plugin_size, PJ_CODE_ID, (unsigned long long)flags,
           /* programs name the native kernels' custom calls only where they are registered */
           pj_ffi_small_gemm_target(false) != NULL);
  /* The precision of float32 products (torch.set_float32_matmul_precision) is in every
   * program's text, so it is in the key too: a program built under one is never served under
   * another, in memory or from disk. */
  for (int p = 0; p < PJ_PRECISION_COUNT; p++)
    snprintf(rt->key_identity[p], sizeof rt->key_identity[p], "%016llx",
             (unsigned long long)pj_hash_bytes(rt->identity, strlen(rt->identity),
                                               (uint64_t)p));
  return NULL;
}

pj_status_t *pj_runtime_get(pj_runtime_t **out) {
  if (g_forked_child)
    return pj_status_new(PJ_ERR_RUNTIME,
                         "Cannot use the tpu device in a forked subprocess: the PJRT client was "
                         "created before the fork. Use the 'spawn' start method.");
  /* Fast path without the lock: g_runtime is written once, before any reader can see it. */
  pj_runtime_t *rt = __atomic_load_n(&g_runtime, __ATOMIC_ACQUIRE);
  if (rt) {
    *out = rt;
    return NULL;
  }
  pthread_mutex_lock(&init_lock);
  pj_status_t *st = NULL;
  if (g_runtime) {
    *out = g_runtime;
  } else if (g_init_error[0]) {
    st = pj_status_new(g_init_code, "%s", g_init_error);
  } else {
    rt = calloc(1, sizeof *rt);
    if (!rt) {
      st = pj_status_new(PJ_ERR_OOM, "out of memory creating the runtime");
    } else {
      pthread_once(&g_atfork_once, install_atfork);
      st = load_plugin(rt);
      if (!st) st = create_client(rt);
      if (st) {
        /* Keep the plugin mapped (it may have started threads); remember the failure. */
        snprintf(g_init_error, sizeof g_init_error, "%s", pj_status_message(st));
        g_init_code = pj_status_code(st);
        free(rt);
      } else {
        __atomic_store_n(&g_runtime, rt, __ATOMIC_RELEASE);
        *out = rt;
      }
    }
  }
  pthread_mutex_unlock(&init_lock);
  return st;
}

/* Also true in a forked child (the runtime existed; pj_runtime_get refuses it there): the
 * Python front tells a bad fork from this. */
bool pj_runtime_ready(void) { return __atomic_load_n(&g_runtime, __ATOMIC_ACQUIRE) != NULL; }
int pj_runtime_device_count(const pj_runtime_t *rt) { return rt->ndev; }
const char *pj_runtime_platform_name(const pj_runtime_t *rt) { return rt->platform; }
const char *pj_runtime_platform_version(const pj_runtime_t *rt) { return rt->platform_version; }
const char *pj_runtime_device_kind(const pj_runtime_t *rt, int device) {
  return device >= 0 && device < rt->ndev ? rt->kinds[device] : "";
}
const char *pj_runtime_plugin_path(const pj_runtime_t *rt) { return rt->path; }
void pj_runtime_api_version(const pj_runtime_t *rt, int *major, int *minor) {
  *major = rt->api->pjrt_api_version.major_version;
  *minor = rt->api->pjrt_api_version.minor_version;
}
const char *pj_runtime_identity(const pj_runtime_t *rt) { return rt->identity; }
const char *pj_runtime_key_identity(const pj_runtime_t *rt) {
  return rt->key_identity[pj_hlo_f32_product_precision()];
}
const PJRT_Api *pj_runtime_api(const pj_runtime_t *rt) { return rt->api; }
PJRT_Client *pj_runtime_client(const pj_runtime_t *rt) { return rt->client; }
PJRT_Device *pj_runtime_device(const pj_runtime_t *rt, int device) {
  return device >= 0 && device < rt->ndev ? rt->devices[device] : NULL;
}
pj_status_t *pj_runtime_device_attributes(pj_runtime_t *rt, int device,
                                          const struct PJRT_NamedValue **attrs, size_t *n) {
  *attrs = NULL;
  *n = 0;
  if (device < 0 || device >= rt->ndev)
    return pj_status_new(PJ_ERR_VALUE, "no device %d (the plugin has %d)", device, rt->ndev);
  if (!PJ_API_HAS(rt->api, PJRT_DeviceDescription_Attributes)) return NULL; /* none to give */
  PJRT_DeviceDescription_Attributes_Args a = {
      .struct_size = PJRT_DeviceDescription_Attributes_Args_STRUCT_SIZE,
      .device_description = rt->descs[device]};
  PJ_TRY(pj_runtime_take_error(rt, rt->api->PJRT_DeviceDescription_Attributes(&a),
                               "PJRT_DeviceDescription_Attributes"));
  *attrs = a.attributes;
  *n = a.num_attributes;
  return NULL;
}

int64_t pj_runtime_device_id(const pj_runtime_t *rt, int device) {
  return device >= 0 && device < rt->ndev ? rt->ids[device] : -1;
}

int pj_runtime_device_index(const pj_runtime_t *rt, const PJRT_Device *dev) {
  for (int i = 0; i < rt->ndev; i++)
    if (rt->devices[i] == dev) return i;
  return -1;
}
