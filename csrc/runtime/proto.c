/* Minimal protocol-buffer writer (see proto.h for the wire facts it relies on). */
#include "proto.h"

#include <stdlib.h>
#include <string.h>

static void put(pj_pb_t *b, const void *data, size_t n) {
  if (b->failed || n == 0) return;
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + n) cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p) {
      b->failed = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, data, n);
  b->len += n;
}

void pj_pb_varint(pj_pb_t *b, uint64_t v) {
  uint8_t out[10]; /* seven bits a byte: 64 bits fit in ten */
  size_t n = 0;
  do {
    uint8_t byte = v & 0x7f;
    v >>= 7;
    out[n++] = (uint8_t)(byte | (v ? 0x80 : 0));
  } while (v);
  put(b, out, n);
}

void pj_pb_uint(pj_pb_t *b, unsigned field, uint64_t v) {
  pj_pb_varint(b, (uint64_t)field << 3 | 0);
  pj_pb_varint(b, v);
}

void pj_pb_bytes(pj_pb_t *b, unsigned field, const void *data, size_t n) {
  pj_pb_varint(b, (uint64_t)field << 3 | 2);
  pj_pb_varint(b, n);
  put(b, data, n);
}

void pj_pb_message(pj_pb_t *b, unsigned field, const pj_pb_t *sub) {
  if (sub->failed) b->failed = true;
  pj_pb_bytes(b, field, sub->p, sub->len);
}

void pj_pb_free(pj_pb_t *b) {
  free(b->p);
  *b = (pj_pb_t){0};
}
