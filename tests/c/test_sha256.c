/* SHA-256 and HMAC-SHA256 (csrc/runtime/sha256.c) against the published test vectors:
 * FIPS 180-4's examples (NIST's "abc", the 448-bit two-block message, one million 'a') and
 * RFC 4231's HMAC-SHA256 test cases 1-4, 6 and 7 (case 5 tests truncated output, not used
 * here). Also: updates split at every offset give the one-shot digest, and the
 * constant-time comparison. */
#include <string.h>

#include "ctest.h"
#include "torch_pjrt/sha256.h"

static void hex(const uint8_t *d, char out[65]) {
  for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void expect_digest(const uint8_t d[32], const char *want, const char *what) {
  char got[65];
  hex(d, got);
  if (strcmp(got, want) != 0) {
    fprintf(stderr, "%s: got %s, want %s\n", what, got, want);
    ctest_failures++;
  }
}

static void sha(const char *msg, const char *want) {
  uint8_t d[32];
  pj_sha256(msg, strlen(msg), d);
  expect_digest(d, want, msg);
}

static void hmac(const uint8_t *key, size_t keylen, const uint8_t *data, size_t n,
                 const char *want, const char *what) {
  uint8_t d[32];
  pj_hmac_sha256(key, keylen, data, n, d);
  expect_digest(d, want, what);
}

int main(void) {
  /* FIPS 180-4 / NIST CSRC examples (SHA256.pdf), and the empty message. */
  sha("abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
      "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  sha("", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  {
    /* one million 'a', fed in uneven pieces so partial blocks are exercised */
    pj_sha256_t s;
    pj_sha256_init(&s);
    char a[1000];
    memset(a, 'a', sizeof a);
    size_t left = 1000000, piece = 1;
    while (left) {
      size_t n = piece < left ? piece : left;
      pj_sha256_update(&s, a, n);
      left -= n;
      piece = piece % 977 + 13; /* at most 989 < sizeof a */
    }
    uint8_t d[32];
    pj_sha256_final(&s, d);
    expect_digest(d, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
                  "million a");
  }
  {
    /* every split point of a 3-block message gives the one-shot digest */
    uint8_t msg[150], want[32], got[32];
    for (int i = 0; i < 150; i++) msg[i] = (uint8_t)(i * 7 + 3);
    pj_sha256(msg, sizeof msg, want);
    for (size_t cut = 0; cut <= sizeof msg; cut++) {
      pj_sha256_t s;
      pj_sha256_init(&s);
      pj_sha256_update(&s, msg, cut);
      pj_sha256_update(&s, msg + cut, sizeof msg - cut);
      pj_sha256_final(&s, got);
      EXPECT(memcmp(got, want, 32) == 0);
    }
  }

  /* RFC 4231 section 4 */
  uint8_t key[131], data[200];
  memset(key, 0x0b, 20);
  hmac(key, 20, (const uint8_t *)"Hi There", 8,
       "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7", "RFC 4231 case 1");
  hmac((const uint8_t *)"Jefe", 4, (const uint8_t *)"what do ya want for nothing?", 28,
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", "RFC 4231 case 2");
  memset(key, 0xaa, 20);
  memset(data, 0xdd, 50);
  hmac(key, 20, data, 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe",
       "RFC 4231 case 3");
  for (int i = 0; i < 25; i++) key[i] = (uint8_t)(i + 1);
  memset(data, 0xcd, 50);
  hmac(key, 25, data, 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
       "RFC 4231 case 4");
  memset(key, 0xaa, 131);
  const char *t6 = "Test Using Larger Than Block-Size Key - Hash Key First";
  hmac(key, 131, (const uint8_t *)t6, strlen(t6),
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54", "RFC 4231 case 6");
  const char *t7 =
      "This is a test using a larger than block-size key and a larger than block-size data. "
      "The key needs to be hashed before being used by the HMAC algorithm.";
  hmac(key, 131, (const uint8_t *)t7, strlen(t7),
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2", "RFC 4231 case 7");
  {
    /* incremental HMAC from a copied context equals the one-shot one */
    pj_hmac_sha256_t base, c;
    pj_hmac_sha256_init(&base, "Jefe", 4);
    c = base;
    pj_hmac_sha256_update(&c, "what do ya ", 11);
    pj_hmac_sha256_update(&c, "want for nothing?", 17);
    uint8_t d[32];
    pj_hmac_sha256_final(&c, d);
    expect_digest(d, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
                  "RFC 4231 case 2, incremental");
  }

  uint8_t x[32] = {0}, y[32] = {0};
  EXPECT(pj_equal_consttime(x, y, 32));
  y[31] = 1;
  EXPECT(!pj_equal_consttime(x, y, 32));
  y[31] = 0;
  y[0] = 0x80;
  EXPECT(!pj_equal_consttime(x, y, 32));
  EXPECT(pj_equal_consttime(x, y, 0));
  CTEST_DONE();
}
