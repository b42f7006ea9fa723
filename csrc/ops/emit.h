/* Shorthands for lowerings (each .c file of csrc/ops includes this after lower.h/table.h):
 * builder calls on the lowering context `L` in scope. */
#ifndef TORCH_PJRT_EMIT_H
#define TORCH_PJRT_EMIT_H
#include "lower.h"

#define H (L->h)
#define ADD(a, b) pj_binary(H, "stablehlo.add", a, b)
#define SUB(a, b) pj_binary(H, "stablehlo.subtract", a, b)
#define MUL(a, b) pj_binary(H, "stablehlo.multiply", a, b)
#define DIV(a, b) pj_binary(H, "stablehlo.divide", a, b)
#define MAX(a, b) pj_binary(H, "stablehlo.maximum", a, b)
#define MIN(a, b) pj_binary(H, "stablehlo.minimum", a, b)
#define AND(a, b) pj_binary(H, "stablehlo.and", a, b)
#define OR(a, b) pj_binary(H, "stablehlo.or", a, b)
#define U(op, a) pj_unary(H, "stablehlo." op, a)
#define CMP(dir, a, b) pj_compare(H, dir, a, b)
#define SEL(p, a, b) pj_select(H, p, a, b)

#endif
