/* The interface between the call machinery (csrc/graph/call.c) and the op lowerings (one file
 * per family). A lowering reads its arguments by schema name, builds values with the HLO
 * builder, and sets one value per destination (pj_set_result). Tensor arguments arrive already
 * materialized from their views; destinations, dtype conversion of results and in-place/out=
 * handling are done by call.c. Errors are recorded in the builder (pj_fail) and surface as the
 * call's status. */
#ifndef TORCH_PJRT_LOWER_H
#define TORCH_PJRT_LOWER_H
#include "torch_pjrt/call.h"
#include "torch_pjrt/hlo.h"
#include "torch_pjrt/index_checks.h"

/* A program's running index-check state while its ops are lowered (index_check.c; the state
 * and its protocol: torch_pjrt/index_checks.h). Owned by the program builder, one per program;
 * NULL in pj_lower_t when checks are off. */
typedef struct pj_check_emit {
  pj_val_t state; /* id < 0 until the program's first check adds the state parameter */
  pj_val_t seq;   /* this execution's sequence number: the incoming state's counter + 1 */
  int op_index;   /* the op being lowered, within the program (the builder sets it) */
} pj_check_emit_t;

struct pj_lower {
  pj_hlo_t *h;
  const pj_call_t *c;
  pj_val_t *slot_vals;    /* parameter per read slot (1-D), indexed by slot */
  pj_val_t *scalar_vals;  /* parameter per scalar, 0-d */
  pj_val_t *tensor_vals;  /* materialized tensor args (cache), indexed like c->tensors */
  pj_val_t *results;      /* indexed like c->outs */
  bool *has_result;
  pj_check_emit_t *chk;   /* NULL: no index checks in this program */
};

/* Argument access. Missing arguments (not in the schema) behave as None. */
const pj_arg_t *pj_arg(pj_lower_t *L, const char *name);
bool pj_has(pj_lower_t *L, const char *name); /* present and not None */
pj_val_t pj_tensor(pj_lower_t *L, const char *name);
/* List element i of a Tensor[] / Tensor?[] argument (invalid value if that element is None). */
pj_val_t pj_tensor_at(pj_lower_t *L, const char *name, int i);
bool pj_tensor_present_at(pj_lower_t *L, const char *name, int i);
int pj_list_len(pj_lower_t *L, const char *name);
const pj_tensor_desc_t *pj_tensor_desc(pj_lower_t *L, const char *name);
/* A Scalar argument as a 0-d value of its own dtype (f64/i64/bool), or a 0-d tensor argument. */
pj_val_t pj_scalar(pj_lower_t *L, const char *name);
/* Element i of a Scalar[] argument as a 0-d value. */
pj_val_t pj_scalar_at(pj_lower_t *L, const char *name, int i);
/* dtype of a tensor or Scalar argument (for type promotion). */
pj_dtype_t pj_arg_dtype(pj_lower_t *L, const char *name);
int64_t pj_int(pj_lower_t *L, const char *name, int64_t dflt);
double pj_float(pj_lower_t *L, const char *name, double dflt);
bool pj_bool(pj_lower_t *L, const char *name, bool dflt);
/* Copies an int list into out (at most max); returns its length, or -1 if None/absent. */
int pj_ints(pj_lower_t *L, const char *name, int64_t *out, int max);
int pj_floats(pj_lower_t *L, const char *name, double *out, int max);
const char *pj_str(pj_lower_t *L, const char *name, const char *dflt);

/* PyTorch's result_type over the named tensor/scalar arguments (None ones skipped), with its
 * rules for 0-d tensors and wrapped Python numbers. */
pj_dtype_t pj_result_type(pj_lower_t *L, const char *const *names, int n);
pj_dtype_t pj_promote(pj_dtype_t a, pj_dtype_t b);

/* Destinations. */
int pj_nout(pj_lower_t *L);
pj_type_t pj_out_type(pj_lower_t *L, int k);
/* Sets destination k; the value is converted to the destination dtype and broadcast to its
 * shape if needed. */
void pj_set_result(pj_lower_t *L, int k, pj_val_t v);

/* Records an error; lowerings `return NULL` after it (the builder reports it). */
#define pj_fail(L, code, ...) pj_hlo_fail((L)->h, code, __VA_ARGS__)

/* Index checks (index_check.c): elements of the integer tensor value idx outside
 * [negative_ok ? -size : 0, size) fail the program's check with CPU's error of `kind`, naming
 * the value, `dim` and `size` (reported at the next synchronization, index_checks.h). Returns
 * whether this check failed (0-d bool), or an invalid value when nothing was emitted (checks
 * off, idx empty). Lowerings check the indices their user gave, never ones they computed. */
pj_val_t pj_check_index(pj_lower_t *L, pj_val_t idx, int64_t size, int dim, bool negative_ok,
                        pj_check_kind_t kind);
/* The same with the kind computed by the program: kind is a 0-d int64 value holding a
 * pj_check_kind_t (for ops whose exception CPU picks by a Scalar argument's value, which a
 * program takes as an argument: index_add's alpha). */
pj_val_t pj_check_index_kind(pj_lower_t *L, pj_val_t idx, int64_t size, int dim,
                             bool negative_ok, pj_val_t kind);
/* The same, with `ignore` exempt (nll_loss's ignore_index). */
pj_val_t pj_check_index_except(pj_lower_t *L, pj_val_t idx, int64_t size, int dim,
                               bool negative_ok, pj_check_kind_t kind, int64_t ignore);
/* All or nothing for indexed writes: idx with every element replaced by `size` (out of range,
 * so XLA's scatter drops every update) when `bad` (a pj_check_index result) holds; idx itself
 * when bad is invalid. CPU raises before writing anything; this keeps the destination whole
 * at the cost of a select over the indices, not over the destination. */
pj_val_t pj_check_drop_all(pj_lower_t *L, pj_val_t bad, pj_val_t idx, int64_t size);
/* The program's final check state (its last result, aliasing the trailing state parameter),
 * or an invalid value when no op checked anything. */
pj_val_t pj_check_finish(pj_hlo_t *h, pj_check_emit_t *chk);

/* torch.maximum (max) or torch.minimum of a and b (same type): NaN in either operand gives
 * NaN (elementwise.c). Bare stablehlo.maximum/minimum keep the first operand where only the
 * second is NaN on the CPU plugin. */
pj_val_t pj_max_min_nan(pj_lower_t *L, pj_val_t a, pj_val_t b, bool max);

/* Normalizes a possibly negative dim against rank; records IndexError if out of range. */
int pj_norm_dim(pj_lower_t *L, int64_t dim, int rank);

#endif
