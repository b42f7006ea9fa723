/* The key-value store a PJRT client is created with (issue 36 item 3): plugins that run one
 * process per chip across hosts (libtpu, the CUDA plugin) exchange their topology and
 * collective ids through it at PJRT_Client_Create. torch_pjrt bridges it from the c10d Store
 * of the process group's rendezvous (csrc/bridge/kv_store_bridge.cpp), so the client is created
 * after rendezvous with global device ids.
 *
 * A store is three blocking operations over byte strings. This module turns one into the
 * PJRT_Client_Create kv callbacks: every key gets the store's prefix (PJRT leaves avoiding
 * collisions between users of one store to the caller), values are copied into malloc'd buffers
 * PJRT frees through the deleter it is handed, and outcomes become PJRT errors through the
 * callback_error PJRT passes: a key that does not come within the timeout is
 * DEADLINE_EXCEEDED, a try_get of a missing key NOT_FOUND, a store failure INTERNAL with the
 * store's message. Thread-safe as the store's operations are. */
#ifndef TORCH_PJRT_KV_STORE_H
#define TORCH_PJRT_KV_STORE_H
#include <stdbool.h>
#include <stddef.h>

#include "torch_pjrt/status.h"
#ifdef __cplusplus
extern "C" {
#endif
struct PJRT_Client_Create_Args;

/* What a store operation reports. */
typedef enum { PJ_KV_OK = 0, PJ_KV_MISSING, PJ_KV_ERROR } pj_kv_result_t;

typedef struct {
  /* Waits up to timeout_ms for key (timeout_ms < 0: the store's own timeout); on PJ_KV_OK sets
   * *value to a malloc'd copy (the caller frees it) of *len bytes. PJ_KV_MISSING: the key did
   * not come in time. PJ_KV_ERROR: err holds a message. */
  pj_kv_result_t (*get)(void *ctx, const char *key, size_t key_len, int timeout_ms,
                        char **value, size_t *len, char *err, size_t err_cap);
  /* The same without waiting (PJ_KV_MISSING at once for a key not there). */
  pj_kv_result_t (*try_get)(void *ctx, const char *key, size_t key_len, char **value,
                            size_t *len, char *err, size_t err_cap);
  pj_kv_result_t (*put)(void *ctx, const char *key, size_t key_len, const char *value,
                        size_t len, char *err, size_t err_cap);
  void *ctx;
  char prefix[128]; /* prepended to every key PJRT uses */
} pj_kv_store_t;

/* Sets a's kv_get / kv_put / kv_try_get callbacks to go through s (which must outlive every
 * use of the client created with a). */
void pj_kv_fill_client_args(const pj_kv_store_t *s, struct PJRT_Client_Create_Args *a);

/* The store the runtime's client is created with (pj_runtime_get); NULL: none. Refused once
 * the runtime exists. The runtime keeps its own copy of *s (ctx is the caller's, and must live
 * as long as the process uses the runtime). */
pj_status_t *pj_runtime_set_kv_store(const pj_kv_store_t *s);

#ifdef __cplusplus
}
#endif
#endif
