/* The PJRT key-value callbacks over a store (torch_pjrt/kv_store.h), called as a plugin calls
 * them at PJRT_Client_Create, over an in-memory store: a get waits for a put made later by
 * another thread; keys carry the store's prefix; a try_get of a missing key is NOT_FOUND at
 * once, a get that times out DEADLINE_EXCEEDED, a failing store INTERNAL with its message;
 * values are the caller's copies, freed through the deleter handed back. And the runtime
 * refuses a store once it exists. No plugin is needed. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctest.h"
#include "pjrt_c_api.h"
#include "torch_pjrt/kv_store.h"
#include "torch_pjrt/runtime.h"

/* ---- an in-memory store ---- */
#define SLOTS 16
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  char *keys[SLOTS], *vals[SLOTS];
  size_t vlens[SLOTS];
  int n;
  bool broken; /* every operation fails */
} mem_t;

static int find(mem_t *m, const char *k) {
  for (int i = 0; i < m->n; i++)
    if (!strcmp(m->keys[i], k)) return i;
  return -1;
}

static pj_kv_result_t take(mem_t *m, int i, char **v, size_t *len) {
  *v = malloc(m->vlens[i] + 1);
  memcpy(*v, m->vals[i], m->vlens[i]);
  *len = m->vlens[i];
  return PJ_KV_OK;
}

static pj_kv_result_t mem_get(void *ctx, const char *k, size_t kl, int timeout_ms, char **v,
                              size_t *len, char *err, size_t cap) {
  (void)kl;
  mem_t *m = ctx;
  if (m->broken) {
    snprintf(err, cap, "store is down");
    return PJ_KV_ERROR;
  }
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += timeout_ms / 1000;
  until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&m->mu);
  int i;
  while ((i = find(m, k)) < 0)
    if (pthread_cond_timedwait(&m->cv, &m->mu, &until)) break;
  pj_kv_result_t r = i >= 0 ? take(m, i, v, len) : PJ_KV_MISSING;
  pthread_mutex_unlock(&m->mu);
  return r;
}

static pj_kv_result_t mem_try_get(void *ctx, const char *k, size_t kl, char **v, size_t *len,
                                  char *err, size_t cap) {
  (void)kl;
  (void)err;
  (void)cap;
  mem_t *m = ctx;
  pthread_mutex_lock(&m->mu);
  int i = find(m, k);
  pj_kv_result_t r = i >= 0 ? take(m, i, v, len) : PJ_KV_MISSING;
  pthread_mutex_unlock(&m->mu);
  return r;
}

static pj_kv_result_t mem_put(void *ctx, const char *k, size_t kl, const char *v, size_t len,
                              char *err, size_t cap) {
  (void)kl;
  mem_t *m = ctx;
  if (m->broken) {
    snprintf(err, cap, "store is down");
    return PJ_KV_ERROR;
  }
  pthread_mutex_lock(&m->mu);
  int i = find(m, k);
  if (i < 0) {
    i = m->n++;
    m->keys[i] = strdup(k);
  } else {
    free(m->vals[i]);
  }
  m->vals[i] = malloc(len + 1);
  memcpy(m->vals[i], v, len);
  m->vlens[i] = len;
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
  return PJ_KV_OK;
}

/* ---- PJRT's side: a callback_error that records what it was given ---- */
static PJRT_Error_Code last_code;
static char last_msg[512];
static PJRT_Error *record_error(PJRT_Error_Code code, const char *msg, size_t len) {
  last_code = code;
  snprintf(last_msg, sizeof last_msg, "%.*s", (int)len, msg);
  return (PJRT_Error *)&last_code; /* any non-NULL error */
}
static PJRT_CallbackError cb = record_error;

static PJRT_Client_Create_Args args;

static PJRT_Error *put(const char *k, const char *v) {
  PJRT_KeyValuePutCallback_Args a = {.struct_size = PJRT_KeyValuePutCallback_Args_STRUCT_SIZE,
                                     .key = k, .key_size = strlen(k), .value = v,
                                     .value_size = strlen(v), .callback_error = &cb,
                                     .user_arg = args.kv_put_user_arg};
  return args.kv_put_callback(&a);
}

/* get (timeout_ms >= 0) or try_get (timeout_ms < 0); the value (freed through the deleter)
 * compared with want, or the error's code returned. */
static int get(const char *k, int timeout_ms, const char *want) {
  char *value;
  size_t size;
  PJRT_Error *e;
  void (*deleter)(char *);
  if (timeout_ms >= 0) {
    PJRT_KeyValueGetCallback_Args a = {.struct_size = PJRT_KeyValueGetCallback_Args_STRUCT_SIZE,
                                       .key = k, .key_size = strlen(k),
                                       .timeout_in_ms = timeout_ms, .callback_error = &cb,
                                       .user_arg = args.kv_get_user_arg};
    e = args.kv_get_callback(&a);
    value = a.value, size = a.value_size, deleter = a.value_deleter_callback;
  } else {
    PJRT_KeyValueTryGetCallback_Args a = {
        .struct_size = PJRT_KeyValueTryGetCallback_Args_STRUCT_SIZE, .key = k,
        .key_size = strlen(k), .callback_error = &cb, .user_arg = args.kv_try_get_user_arg};
    e = args.kv_try_get_callback(&a);
    value = a.value, size = a.value_size, deleter = a.value_deleter_callback;
  }
  if (e) return (int)last_code;
  EXPECT(deleter != NULL);
  EXPECT(size == strlen(want) && !memcmp(value, want, size));
  if (deleter) deleter(value);
  return 0;
}

static void *late_put(void *arg) {
  (void)arg;
  usleep(100 * 1000);
  EXPECT(put("late", "arrived") == NULL);
  return NULL;
}

int main(void) {
  static mem_t m = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  pj_kv_store_t s = {.get = mem_get, .try_get = mem_try_get, .put = mem_put, .ctx = &m};
  snprintf(s.prefix, sizeof s.prefix, "torch_pjrt/test/");
  pj_kv_fill_client_args(&s, &args);

  /* a round trip; the key the store sees carries the prefix */
  EXPECT(put("topology", "2x2") == NULL);
  EXPECT(get("topology", 1000, "2x2") == 0);
  EXPECT(get("topology", -1, "2x2") == 0);
  EXPECT(m.n == 1 && !strcmp(m.keys[0], "torch_pjrt/test/topology"));
  /* a binary value with a zero byte */
  PJRT_KeyValuePutCallback_Args bin = {.struct_size = PJRT_KeyValuePutCallback_Args_STRUCT_SIZE,
                                       .key = "bin", .key_size = 3, .value = "a\0b",
                                       .value_size = 3, .callback_error = &cb,
                                       .user_arg = args.kv_put_user_arg};
  EXPECT(args.kv_put_callback(&bin) == NULL);
  EXPECT(m.vlens[1] == 3 && !memcmp(m.vals[1], "a\0b", 3));

  /* a blocking get waits for a put from another thread */
  pthread_t t;
  EXPECT(pthread_create(&t, NULL, late_put, NULL) == 0);
  EXPECT(get("late", 5000, "arrived") == 0);
  pthread_join(t, NULL);

  /* missing keys */
  EXPECT(get("nothing", -1, "") == PJRT_Error_Code_NOT_FOUND);
  EXPECT(strstr(last_msg, "torch_pjrt/test/nothing") != NULL);
  EXPECT(get("nothing", 50, "") == PJRT_Error_Code_DEADLINE_EXCEEDED);
  EXPECT(strstr(last_msg, "timeout") != NULL);

  /* a failing store */
  m.broken = true;
  EXPECT(put("x", "y") != NULL && last_code == PJRT_Error_Code_INTERNAL);
  EXPECT(strstr(last_msg, "store is down") != NULL);
  EXPECT(get("topology", 10, "") == PJRT_Error_Code_INTERNAL);
  m.broken = false;

  /* the runtime takes a complete store before it starts, and refuses one after */
  pj_kv_store_t half = s;
  half.put = NULL;
  pj_status_t *st = pj_runtime_set_kv_store(&half);
  EXPECT(st && pj_status_code(st) == PJ_ERR_VALUE);
  pj_status_free(st);
  EXPECT(pj_runtime_set_kv_store(NULL) == NULL);
  pj_runtime_t *rt;
  st = pj_runtime_get(&rt);
  if (!st) { /* with a plugin: the runtime now exists */
    pj_status_t *late = pj_runtime_set_kv_store(&s);
    EXPECT(late && strstr(pj_status_message(late), "already initialized"));
    pj_status_free(late);
  }
  pj_status_free(st);

  for (int i = 0; i < m.n; i++) {
    free(m.keys[i]);
    free(m.vals[i]);
  }
  CTEST_DONE();
}
