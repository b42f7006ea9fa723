/* The serialized compile options (no plugin needed): the single-device form is byte for byte
 * the message the runtime has always sent, and the bound form carries the replica count and
 * the device assignment where XLA's proto definitions put them. */
#include <stdlib.h>
#include <string.h>

#include "ctest.h"
#include "torch_pjrt/compile_options.h"

/* executable_build_options (3) { num_replicas (4) = 1, num_partitions (5) = 1 },
 * compile_portable_executable (4) = true. */
static const unsigned char kPortable[] = {0x1a, 0x04, 0x20, 0x01, 0x28, 0x01, 0x20, 0x01};
/* ... then env_option_overrides (7) { key (1): "xla_allow_excess_precision",
 * value (2): { bool_field (2) = false } }. */
static const unsigned char kPortableRounded[] = {
    0x1a, 0x04, 0x20, 0x01, 0x28, 0x01, 0x20, 0x01, 0x3a, 0x20, 0x0a, 0x1a, 'x', 'l',
    'a',  '_',  'a',  'l',  'l',  'o',  'w',  '_',  'e',  'x',  'c',  'e',  's',  's',
    '_',  'p',  'r',  'e',  'c',  'i',  's',  'i',  'o',  'n',  0x12, 0x02, 0x10, 0x00};
/* executable_build_options (3) { num_replicas (4) = 2, num_partitions (5) = 1,
 * device_assignment (9) { replica_count (1) = 2, computation_count (2) = 1,
 * computation_devices (3) { replica_device_ids (1) = packed [3, 300] } } }: no portable flag. */
static const unsigned char kTwo[] = {0x1a, 0x11, 0x20, 0x02, 0x28, 0x01, 0x4a, 0x0b, 0x08, 0x02,
                                     0x10, 0x01, 0x1a, 0x05, 0x0a, 0x03, 0x03, 0xac, 0x02};

static int same(const void *a, size_t alen, const void *b, size_t blen) {
  return alen == blen && memcmp(a, b, alen) == 0;
}

int main(void) {
  void *bytes;
  size_t len;
  OK(pj_compile_options_build(0, NULL, false, &bytes, &len));
  EXPECT(same(bytes, len, kPortable, sizeof kPortable));
  free(bytes);
  OK(pj_compile_options_build(0, NULL, true, &bytes, &len));
  EXPECT(same(bytes, len, kPortableRounded, sizeof kPortableRounded));
  free(bytes);

  const int64_t ids[] = {3, 300}; /* 300: a two-byte varint (0xac 0x02) */
  OK(pj_compile_options_build(2, ids, false, &bytes, &len));
  EXPECT(same(bytes, len, kTwo, sizeof kTwo));
  free(bytes);
  /* Rounded: the same build options, the override appended. */
  OK(pj_compile_options_build(2, ids, true, &bytes, &len));
  EXPECT(len == sizeof kTwo + (sizeof kPortableRounded - sizeof kPortable));
  EXPECT(memcmp(bytes, kTwo, sizeof kTwo) == 0);
  EXPECT(memcmp((char *)bytes + sizeof kTwo, kPortableRounded + sizeof kPortable,
                sizeof kPortableRounded - sizeof kPortable) == 0);
  free(bytes);

  pj_status_t *st = pj_compile_options_build(2, NULL, false, &bytes, &len);
  EXPECT(st && pj_status_code(st) == PJ_ERR_VALUE && bytes == NULL);
  pj_status_free(st);
  st = pj_compile_options_build(-1, ids, false, &bytes, &len);
  EXPECT(st != NULL);
  pj_status_free(st);
  CTEST_DONE();
}
