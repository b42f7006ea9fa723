/* Private to the runtime: a minimal protocol-buffer writer, enough to serialize the few XLA
 * messages the PJRT C API takes as bytes (compile options). Wire format facts used: a field is
 * a key varint (field_number << 3 | wire_type) and a payload; wire type 0 is a varint (ints,
 * bools, enums; a negative int64 is its 64-bit two's complement, ten bytes), wire type 2 is a
 * varint length followed by that many bytes (strings, nested messages, packed repeated
 * scalars). Fields may come in any order; a singular scalar field seen twice keeps the last
 * value, and a singular message field seen twice is merged. */
#ifndef TORCH_PJRT_PROTO_H
#define TORCH_PJRT_PROTO_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A growing byte buffer. `failed` is sticky: after an allocation failure every write is a
 * no-op, so callers check once at the end instead of after every field. Zero-initialize. */
typedef struct {
  uint8_t *p;
  size_t len, cap;
  bool failed;
} pj_pb_t;

void pj_pb_varint(pj_pb_t *b, uint64_t v);
/* Field `field` with wire type 0 (written even when v is 0: a oneof member needs presence). */
void pj_pb_uint(pj_pb_t *b, unsigned field, uint64_t v);
/* Field `field` with wire type 2 holding `n` bytes. */
void pj_pb_bytes(pj_pb_t *b, unsigned field, const void *data, size_t n);
/* A nested message: its serialized bytes as a wire type 2 field (sub->failed propagates). */
void pj_pb_message(pj_pb_t *b, unsigned field, const pj_pb_t *sub);
void pj_pb_free(pj_pb_t *b);
#endif
