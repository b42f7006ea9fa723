/* A small StableHLO text builder. Values are SSA names with a static type; every emitter checks
 * its operands and records the first error in the builder (sticky), after which emitters return
 * an invalid value (id < 0) and pj_hlo_finish reports the error. Lowerings therefore need no
 * error plumbing between calls: they build, and the status comes out at the end.
 * Text uses MLIR's generic op form ("stablehlo.add"(%a, %b) : (...) -> ...), which every
 * StableHLO op accepts, so one printer serves all ops. */
#ifndef TORCH_PJRT_HLO_H
#define TORCH_PJRT_HLO_H
#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>
#include "torch_pjrt/dtype.h"
#include "torch_pjrt/status.h"
#ifdef __cplusplus
extern "C" {
#endif

/* The highest tensor rank the runtime takes: PyTorch's own working limit (its reductions and
 * dim lists are 64-bit masks, "only tensors with up to 64 dims are supported"). Types and call
 * descriptors hold their dims inline at this size, so pj_type_t is 520 bytes: values are passed
 * by value only while a program is built (a cache miss), never on a cache hit. Every array
 * indexed by rank is sized by it, and every rank that an op derives (an unsqueeze, a gather's
 * index dim) is checked against it: a larger rank is an error status, never an overflow. */
#define PJ_MAX_RANK 64
/* Room for the text of any pj_type_t ("tensor<" + 64 dims of up to 20 digits + "xcomplex<f64>>"). */
#define PJ_TYPE_STR_CAP (22 * PJ_MAX_RANK + 32)

typedef struct {
  pj_dtype_t dtype;
  int rank;
  int64_t dims[PJ_MAX_RANK];
} pj_type_t;

typedef struct {
  int id;  /* < 0: invalid (an error was recorded) */
  int sub; /* result index of a multi-result op (printed %id#sub), or -1 */
  pj_type_t t;
} pj_val_t;

typedef struct pj_hlo pj_hlo_t;

pj_type_t pj_type(pj_dtype_t dt, int rank, const int64_t *dims);
pj_type_t pj_type_scalar(pj_dtype_t dt);
pj_type_t pj_type_with_dtype(pj_type_t t, pj_dtype_t dt);
int64_t pj_type_numel(const pj_type_t *t);
bool pj_type_same_shape(const pj_type_t *a, const pj_type_t *b);
/* Writes "tensor<2x3xf32>" into buf; returns buf. */
char *pj_type_str(const pj_type_t *t, char *buf, size_t cap);

pj_hlo_t *pj_hlo_new(void);
void pj_hlo_free(pj_hlo_t *h);
/* Records an error (first one wins); returns an invalid value for convenient `return`. */
pj_val_t pj_hlo_fail(pj_hlo_t *h, pj_code_t code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
bool pj_hlo_ok(const pj_hlo_t *h);
/* Adds a function parameter (only before any op is emitted outside a region). */
pj_val_t pj_hlo_param(pj_hlo_t *h, pj_type_t t);
/* A parameter placed after every pj_hlo_param one, whenever it is added (at most one per
 * function): a program input that a lowering discovers it needs while parameters of later ops
 * are still being added (the index-check state, torch_pjrt/index_checks.h). */
pj_val_t pj_hlo_param_last(pj_hlo_t *h, pj_type_t t);
#define PJ_HLO_ALIAS_LAST (-2)
/* Finishes the function returning `results`; alias[i] >= 0 marks result i as reusing (donating)
 * parameter alias[i], PJ_HLO_ALIAS_LAST the trailing parameter. The text is malloc'd and owned
 * by the caller. */
pj_status_t *pj_hlo_finish(pj_hlo_t *h, const pj_val_t *results, int n, const int *alias,
                           char **text, size_t *len);

/* Generic emitter: one result of type `out`. attrs is the text inside {...} or NULL. */
pj_val_t pj_hlo_op(pj_hlo_t *h, const char *op, const pj_val_t *ins, int n, const char *attrs,
                   pj_type_t out);
/* Generic emitter with several results and an optional region (text from pj_hlo_region_end). */
bool pj_hlo_op_multi(pj_hlo_t *h, const char *op, const pj_val_t *ins, int n, const char *region,
                     const char *attrs, const pj_type_t *outs, int nout, pj_val_t *results);

/* Regions: ops emitted between begin and end go into the region's body. begin returns the block
 * arguments (scalar types given); end returns the region text (malloc'd, pass to op_multi,
 * then free). Regions nest. */
void pj_hlo_region_begin(pj_hlo_t *h, const pj_type_t *arg_types, int nargs, pj_val_t *args);
char *pj_hlo_region_end(pj_hlo_t *h, const pj_val_t *rets, int nrets);

/* Module-level functions printed after @main (custom kernels, torch_pjrt/kernel.h): `text` is
 * one or more complete func.func definitions whose symbols the caller made unique to `key`.
 * Added once per key per program however often it is called (a kernel used twice is defined
 * once). Returns false after recording an error. */
bool pj_hlo_add_funcs(pj_hlo_t *h, const char *key, const char *text);
/* "func.call" of a module-level function `callee` (without the @) with results of types outs. */
bool pj_hlo_call(pj_hlo_t *h, const char *callee, const pj_val_t *ins, int n,
                 const pj_type_t *outs, int nout, pj_val_t *results);

/* ---- convenience emitters (hlo/ops.c) ---- */
pj_val_t pj_const(pj_hlo_t *h, pj_dtype_t dt, double v);        /* 0-d constant */
pj_val_t pj_const_i(pj_hlo_t *h, pj_dtype_t dt, int64_t v);     /* exact for 64-bit ints */
pj_val_t pj_full(pj_hlo_t *h, pj_type_t t, double v);           /* constant broadcast to t */
pj_val_t pj_convert(pj_hlo_t *h, pj_val_t x, pj_dtype_t dt);    /* identity if same dtype */
pj_val_t pj_unary(pj_hlo_t *h, const char *op, pj_val_t x);
pj_val_t pj_binary(pj_hlo_t *h, const char *op, pj_val_t a, pj_val_t b); /* same shape+dtype */
/* Compare: dir is EQ/NE/LT/LE/GT/GE; operands same type; result bool. */
pj_val_t pj_compare(pj_hlo_t *h, const char *dir, pj_val_t a, pj_val_t b);
pj_val_t pj_select(pj_hlo_t *h, pj_val_t pred, pj_val_t a, pj_val_t b);
pj_val_t pj_broadcast_in_dim(pj_hlo_t *h, pj_val_t x, pj_type_t out, const int64_t *dims);
/* NumPy-style right-aligned broadcast of x to shape dims[rank] (dtype kept). */
pj_val_t pj_broadcast_to(pj_hlo_t *h, pj_val_t x, int rank, const int64_t *dims);
pj_val_t pj_reshape(pj_hlo_t *h, pj_val_t x, int rank, const int64_t *dims);
pj_val_t pj_transpose(pj_hlo_t *h, pj_val_t x, const int64_t *perm);
pj_val_t pj_slice(pj_hlo_t *h, pj_val_t x, const int64_t *start, const int64_t *limit,
                  const int64_t *strides);
pj_val_t pj_concat(pj_hlo_t *h, const pj_val_t *xs, int n, int dim);
pj_val_t pj_pad(pj_hlo_t *h, pj_val_t x, pj_val_t padval, const int64_t *lo, const int64_t *hi,
                const int64_t *interior);
pj_val_t pj_iota(pj_hlo_t *h, pj_type_t t, int dim);
/* Reduction over dims with a named combiner: "add", "mul", "max", "min", "and", "or". */
pj_val_t pj_reduce(pj_hlo_t *h, pj_val_t x, const int64_t *dims, int ndims, const char *kind);
/* The precision of products of float32 (and complex64) operands, which dot_general and
 * convolution carry as their precision_config. torch.set_float32_matmul_precision maps onto it
 * (the bridge keeps the two in step): "highest" (PyTorch's default) -> HIGHEST, full float32
 * products as CPU computes them; "high" -> HIGH (TF32 on NVIDIA GPUs, 3-pass bfloat16 on
 * TPUs); "medium" -> DEFAULT, the plugin's fastest (TF32 on GPUs, 1-pass bfloat16 on TPUs).
 * Without it, XLA's GPU and TPU compilers take DEFAULT. Process-wide; part of every program
 * cache key (pj_runtime_key_identity). Other dtypes' products carry no precision_config. */
typedef enum {
  PJ_PRECISION_DEFAULT = 0,
  PJ_PRECISION_HIGH = 1,
  PJ_PRECISION_HIGHEST = 2,
  PJ_PRECISION_COUNT
} pj_precision_t;
void pj_hlo_set_f32_product_precision(pj_precision_t p);
pj_precision_t pj_hlo_f32_product_precision(void);
/* ", precision_config = [...]" for a product whose operands have dtype dt, or "" (no config:
 * other dtypes, or DEFAULT). */
const char *pj_hlo_precision_config(pj_dtype_t dt);
/* dot_general with batch and contracting dimension lists; result dtype `dt`. */
pj_val_t pj_dot_general(pj_hlo_t *h, pj_val_t a, pj_val_t b, const int64_t *lb, const int64_t *rb,
                        int nb, const int64_t *lc, const int64_t *rc, int nc, pj_dtype_t dt);
/* Gathers elements of a 1-D operand at integer indices of any shape (result has that shape). */
pj_val_t pj_gather_1d(pj_hlo_t *h, pj_val_t operand, pj_val_t indices);
/* Scatters (replace) updates into a 1-D operand at indices of the updates' shape. */
pj_val_t pj_scatter_1d(pj_hlo_t *h, pj_val_t operand, pj_val_t indices, pj_val_t updates,
                       const char *combiner /* NULL: replace; else "add" etc. */);
/* Smallest/largest finite or infinite value used as reduction identities. */
double pj_dtype_lowest(pj_dtype_t dt);
double pj_dtype_highest(pj_dtype_t dt);

#ifdef __cplusplus
}
#endif
#endif
