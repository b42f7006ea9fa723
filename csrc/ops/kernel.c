/* tpu::kernel_call(Tensor[] args, str kernel) -> Tensor[]: a call of a registered custom kernel
 * (torch_pjrt/kernel.h) inlined into the program: the kernel's functions are added to the module
 * once per program and the op becomes one func.call, so the kernel fuses with its neighbours in
 * defer_and_fuse and torch.compile programs instead of running as a separate execution. The
 * result types are the destinations' (from the kernel's Meta function in torch_pjrt/kernels/,
 * which the front end checked against the kernel's declared result types). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "table.h"
#include "torch_pjrt/kernel.h"

typedef struct kernel {
  char *id, *callee, *text;
  struct kernel *next;
} kernel_t;

/* The registry: a list that only grows, pushed under `mu`. Entries are immutable once linked
 * and never freed (kernels live as long as the process), so a reader that found one may use it
 * without holding the lock. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static kernel_t *kernels;

static const kernel_t *find_locked(const char *id) {
  for (const kernel_t *k = kernels; k; k = k->next)
    if (strcmp(k->id, id) == 0) return k;
  return NULL;
}

static const kernel_t *find(const char *id) {
  pthread_mutex_lock(&mu);
  const kernel_t *k = find_locked(id);
  pthread_mutex_unlock(&mu);
  return k;
}

bool pj_kernel_known(const char *id) { return id && find(id) != NULL; }

pj_status_t *pj_kernel_register(const char *id, const char *callee, const char *text) {
  if (!id || !id[0] || !callee || !callee[0] || !text)
    return pj_status_new(PJ_ERR_VALUE, "kernel registration needs an id, a callee and a text");
  pj_status_t *st = NULL;
  pthread_mutex_lock(&mu);
  const kernel_t *old = find_locked(id);
  if (old) {
    if (strcmp(old->callee, callee) != 0 || strcmp(old->text, text) != 0)
      st = pj_status_new(PJ_ERR_VALUE, "kernel id %s is already registered with another text",
                         id);
  } else {
    kernel_t *k = calloc(1, sizeof *k);
    if (k) {
      k->id = strdup(id);
      k->callee = strdup(callee);
      k->text = strdup(text);
    }
    if (!k || !k->id || !k->callee || !k->text) {
      if (k) {
        free(k->id);
        free(k->callee);
        free(k->text);
      }
      free(k);
      st = pj_status_new(PJ_ERR_OOM, "out of memory registering kernel %s", id);
    } else {
      k->next = kernels;
      kernels = k;
    }
  }
  pthread_mutex_unlock(&mu);
  return st;
}

static pj_status_t *lower_kernel_call(pj_lower_t *L) {
  const char *id = pj_str(L, "kernel", NULL);
  const kernel_t *k = id ? find(id) : NULL;
  if (!k)
    return pj_status_new(PJ_ERR_VALUE, "tpu::kernel_call: no kernel registered as '%s'",
                         id ? id : "");
  const int n = pj_list_len(L, "args"), nout = pj_nout(L);
  pj_val_t *ins = malloc(sizeof *ins * (size_t)(n > 0 ? n : 1));
  pj_val_t *res = malloc(sizeof *res * (size_t)(nout > 0 ? nout : 1));
  pj_type_t *types = malloc(sizeof *types * (size_t)(nout > 0 ? nout : 1));
  pj_status_t *st = NULL;
  if (!ins || !res || !types) {
    st = pj_status_new(PJ_ERR_OOM, "out of memory lowering kernel %s", id);
    goto done;
  }
  for (int i = 0; i < n; i++) {
    if (!pj_tensor_present_at(L, "args", i)) {
      st = pj_status_new(PJ_ERR_VALUE, "tpu::kernel_call: argument %d is None", i);
      goto done;
    }
    ins[i] = pj_tensor_at(L, "args", i);
  }
  for (int r = 0; r < nout; r++) types[r] = pj_out_type(L, r);
  if (pj_hlo_add_funcs(L->h, k->id, k->text) &&
      pj_hlo_call(L->h, k->callee, ins, n, types, nout, res))
    for (int r = 0; r < nout; r++) pj_set_result(L, r, res[r]);
done:
  free(ins);
  free(res);
  free(types);
  return st;
}

const pj_lowering_entry_t pj_lowerings_kernel[] = {
    {"tpu::kernel_call", lower_kernel_call, PJ_SHAPE_EXACT},
    {NULL, NULL, PJ_SHAPE_EXACT},
};
