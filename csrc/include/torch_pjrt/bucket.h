/* Size buckets: one program serves every size of a small elementwise op (or scan) up to its
 * bucket, instead of one compile per size. A test suite, a notebook or a loop over sizes
 * otherwise spends its time compiling the same op for sizes 1, 2, 3, ...
 *
 * How: a call whose tensors are all whole, contiguous storages of n elements (and 0-d values)
 * is rewritten, before its key, to run over n rounded up to its bucket (C elements): every such
 * tensor becomes [C] and its storage's buffer a padded one of C elements (storage.h `capacity`).
 * The first n elements are the call's results, bit for bit what the exact program computes (the
 * op's class, call.h pj_shape_class_t, says why); the padding holds values no tensor can reach.
 * A padded storage stays padded while bucketed calls write it; an op of another kind reads it
 * through a view of its first n elements (its program is keyed on C and n); what needs the
 * exact buffer (a compiled graph's inputs, collectives) trims it first (pj_bucket_trim). */
#ifndef TORCH_PJRT_BUCKET_H
#define TORCH_PJRT_BUCKET_H
#include <stdbool.h>
#include <stdint.h>
#include "torch_pjrt/call.h"
#include "torch_pjrt/status.h"
#include "torch_pjrt/storage.h"
#ifdef __cplusplus
extern "C" {
#endif

/* The padded element count for n elements: the next power of two, at least 16, for
 * 1 <= n <= PJ_BUCKET_MAX_NUMEL; n itself otherwise (larger tensors keep exact programs, where
 * the compute of padding would start to cost more than a compile saves). */
#define PJ_BUCKET_MAX_NUMEL 16384
int64_t pj_bucket_numel(int64_t n);

/* Rewrites c (a Strict or Debug call about to run) to its bucket when it qualifies; returns
 * whether it did. A rewritten call's key and program are the bucket's. */
bool pj_bucket_rewrite(pj_call_t *c);
/* What a Strict or Debug call about to be keyed gets: pj_bucket_rewrite; or, for a call of class
 * PJ_SHAPE_EXACT_INPUTS and when may_trim (no queued call ahead read the padded buffers), the
 * trim of the padded storages it reads (none with a write pending), its slots made exact. */
pj_status_t *pj_bucket_prepare(pj_call_t *c, bool may_trim);
/* On by default; off, no call is rewritten (padded storages stay readable). Process-wide. */
void pj_bucket_set_enabled(bool on);
bool pj_bucket_enabled(void);

/* Makes a padded storage's buffer exact again (a device slice, one cached program per size);
 * nothing for an exact one. The storage must not be pending (defer_and_fuse: flush first).
 * The _locked form is for a caller that holds the run lock (call_internal.h). */
pj_status_t *pj_bucket_trim(pj_storage_t *s);
pj_status_t *pj_bucket_trim_locked(pj_storage_t *s);
/* The storage made a program's input buffer of `bytes` (run lock held): a padded one trimmed
 * when the program takes it exact (a graph captured or recorded with exact storages), a
 * never-written one zeros of that size (pj_storage_materialize_padded). */
pj_status_t *pj_bucket_input_locked(pj_storage_t *s, pj_dtype_t dt, size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
