/* PJRT_Client_Create's key-value callbacks over a pj_kv_store_t (torch_pjrt/kv_store.h). */
#include "torch_pjrt/kv_store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pjrt_c_api.h"

/* prefix + key, malloc'd; NULL when out of memory. */
static char *full_key(const pj_kv_store_t *s, const char *key, size_t key_len, size_t *len) {
  const size_t p = strlen(s->prefix);
  char *k = malloc(p + key_len + 1);
  if (!k) return NULL;
  memcpy(k, s->prefix, p);
  memcpy(k + p, key, key_len);
  k[p + key_len] = 0;
  *len = p + key_len;
  return k;
}

static PJRT_Error *fail(PJRT_CallbackError *cb, PJRT_Error_Code code, const char *msg) {
  return (*cb)(code, msg, strlen(msg));
}

static void free_value(char *value) { free(value); }

/* The outcome of a get or try_get, as PJRT wants it. */
static PJRT_Error *got(pj_kv_result_t r, PJRT_CallbackError *cb, const char *what,
                       const char *key, const char *err, bool waited) {
  char msg[512];
  if (r == PJ_KV_MISSING) {
    snprintf(msg, sizeof msg, "torch_pjrt kv store: %s of key '%s': %s", what, key,
             waited ? "not set within the timeout" : "not set");
    return fail(cb, waited ? PJRT_Error_Code_DEADLINE_EXCEEDED : PJRT_Error_Code_NOT_FOUND, msg);
  }
  snprintf(msg, sizeof msg, "torch_pjrt kv store: %s of key '%s' failed: %s", what, key, err);
  return fail(cb, PJRT_Error_Code_INTERNAL, msg);
}

/* A get (waiting: up to timeout_ms) or a try_get of key through s: on success *value (freed
 * through *deleter) of *size bytes, else PJRT's error. */
static PJRT_Error *fetch(const pj_kv_store_t *s, PJRT_CallbackError *cb, const char *key,
                         size_t key_size, bool waiting, int timeout_ms, char **value,
                         size_t *size, void (**deleter)(char *)) {
  size_t klen;
  char *k = full_key(s, key, key_size, &klen);
  if (!k) return fail(cb, PJRT_Error_Code_RESOURCE_EXHAUSTED, "out of memory");
  char err[256] = "";
  char *v = NULL;
  size_t vlen = 0;
  pj_kv_result_t r = waiting ? s->get(s->ctx, k, klen, timeout_ms, &v, &vlen, err, sizeof err)
                             : s->try_get(s->ctx, k, klen, &v, &vlen, err, sizeof err);
  PJRT_Error *e =
      r == PJ_KV_OK ? NULL : got(r, cb, waiting ? "get" : "try_get", k, err, waiting);
  free(k);
  if (e) return e;
  *value = v;
  *size = vlen;
  *deleter = free_value;
  return NULL;
}

static PJRT_Error *kv_get(PJRT_KeyValueGetCallback_Args *a) {
  return fetch(a->user_arg, a->callback_error, a->key, a->key_size, true, a->timeout_in_ms,
               &a->value, &a->value_size, &a->value_deleter_callback);
}

static PJRT_Error *kv_try_get(PJRT_KeyValueTryGetCallback_Args *a) {
  return fetch(a->user_arg, a->callback_error, a->key, a->key_size, false, 0, &a->value,
               &a->value_size, &a->value_deleter_callback);
}

static PJRT_Error *kv_put(PJRT_KeyValuePutCallback_Args *a) {
  const pj_kv_store_t *s = a->user_arg;
  size_t klen;
  char *k = full_key(s, a->key, a->key_size, &klen);
  if (!k) return fail(a->callback_error, PJRT_Error_Code_RESOURCE_EXHAUSTED, "out of memory");
  char err[256] = "";
  pj_kv_result_t r = s->put(s->ctx, k, klen, a->value, a->value_size, err, sizeof err);
  PJRT_Error *e = NULL;
  if (r != PJ_KV_OK) {
    char msg[512];
    snprintf(msg, sizeof msg, "torch_pjrt kv store: put of key '%s' failed: %s", k, err);
    e = fail(a->callback_error, PJRT_Error_Code_INTERNAL, msg);
  }
  free(k);
  return e;
}

void pj_kv_fill_client_args(const pj_kv_store_t *s, PJRT_Client_Create_Args *a) {
  void *arg = (void *)s; /* PJRT hands it back as each callback's user_arg */
  a->kv_get_callback = kv_get;
  a->kv_get_user_arg = arg;
  a->kv_try_get_callback = kv_try_get;
  a->kv_try_get_user_arg = arg;
  a->kv_put_callback = kv_put;
  a->kv_put_user_arg = arg;
}
