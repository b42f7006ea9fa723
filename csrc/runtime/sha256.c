/* SHA-256 per FIPS 180-4 (sections 4.1.2, 4.2.2, 5.1.1, 5.3.3, 6.2) and HMAC per RFC 2104,
 * see sha256.h. Big-endian word order throughout, as the standard specifies. */
#include "torch_pjrt/sha256.h"

#include <string.h>

/* FIPS 180-4 4.2.2: the first 32 bits of the fractional parts of the cube roots of the first
 * 64 primes. */
static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

static inline uint32_t rotr(uint32_t x, unsigned n) { return (x >> n) | (x << (32 - n)); }

/* One block of the compression function (FIPS 180-4 6.2.2). */
static void compress(uint32_t h[8], const uint8_t blk[64]) {
  uint32_t w[64];
  for (int t = 0; t < 16; t++)
    w[t] = (uint32_t)blk[4 * t] << 24 | (uint32_t)blk[4 * t + 1] << 16 |
           (uint32_t)blk[4 * t + 2] << 8 | (uint32_t)blk[4 * t + 3];
  for (int t = 16; t < 64; t++) {
    uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
  for (int t = 0; t < 64; t++) {
    uint32_t S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    uint32_t ch = (e & f) ^ (~e & g);
    uint32_t t1 = hh + S1 + ch + K[t] + w[t];
    uint32_t S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    uint32_t t2 = S0 + maj;
    hh = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a; h[1] += b; h[2] += c; h[3] += d;
  h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
}

void pj_sha256_init(pj_sha256_t *s) {
  /* FIPS 180-4 5.3.3: fractional parts of the square roots of the first 8 primes. */
  static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, H0, sizeof H0);
  s->total = 0;
}

void pj_sha256_update(pj_sha256_t *s, const void *data, size_t n) {
  const uint8_t *p = data;
  size_t have = (size_t)(s->total % PJ_SHA256_BLOCK);
  s->total += n;
  if (have) { /* fill the partial block first */
    size_t take = PJ_SHA256_BLOCK - have < n ? PJ_SHA256_BLOCK - have : n;
    memcpy(s->buf + have, p, take);
    p += take;
    n -= take;
    if (have + take < PJ_SHA256_BLOCK) return;
    compress(s->h, s->buf);
  }
  for (; n >= PJ_SHA256_BLOCK; p += PJ_SHA256_BLOCK, n -= PJ_SHA256_BLOCK) compress(s->h, p);
  if (n) memcpy(s->buf, p, n);
}

void pj_sha256_final(pj_sha256_t *s, uint8_t out[PJ_SHA256_DIGEST]) {
  /* FIPS 180-4 5.1.1: a 1 bit, zeros up to 56 mod 64 bytes, the length in bits (64-bit BE). */
  uint64_t bits = s->total * 8;
  size_t have = (size_t)(s->total % PJ_SHA256_BLOCK);
  s->buf[have++] = 0x80;
  if (have > 56) {
    memset(s->buf + have, 0, PJ_SHA256_BLOCK - have);
    compress(s->h, s->buf);
    have = 0;
  }
  memset(s->buf + have, 0, 56 - have);
  for (int i = 0; i < 8; i++) s->buf[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
  compress(s->h, s->buf);
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 4; j++) out[4 * i + j] = (uint8_t)(s->h[i] >> (24 - 8 * j));
}

void pj_sha256(const void *data, size_t n, uint8_t out[PJ_SHA256_DIGEST]) {
  pj_sha256_t s;
  pj_sha256_init(&s);
  pj_sha256_update(&s, data, n);
  pj_sha256_final(&s, out);
}

/* RFC 2104: H(K ^ opad, H(K ^ ipad, text)), K zero-padded to the block size (hashed first when
 * longer). Both pads' first blocks are absorbed here, so a copied context costs no rehash. */
void pj_hmac_sha256_init(pj_hmac_sha256_t *c, const void *key, size_t keylen) {
  uint8_t k[PJ_SHA256_BLOCK] = {0}, pad[PJ_SHA256_BLOCK];
  if (keylen > PJ_SHA256_BLOCK)
    pj_sha256(key, keylen, k);
  else if (keylen)
    memcpy(k, key, keylen);
  for (int i = 0; i < PJ_SHA256_BLOCK; i++) pad[i] = k[i] ^ 0x36;
  pj_sha256_init(&c->inner);
  pj_sha256_update(&c->inner, pad, sizeof pad);
  for (int i = 0; i < PJ_SHA256_BLOCK; i++) pad[i] = k[i] ^ 0x5c;
  pj_sha256_init(&c->outer);
  pj_sha256_update(&c->outer, pad, sizeof pad);
}

void pj_hmac_sha256_update(pj_hmac_sha256_t *c, const void *data, size_t n) {
  pj_sha256_update(&c->inner, data, n);
}

void pj_hmac_sha256_final(pj_hmac_sha256_t *c, uint8_t out[PJ_SHA256_DIGEST]) {
  uint8_t inner[PJ_SHA256_DIGEST];
  pj_sha256_final(&c->inner, inner);
  pj_sha256_update(&c->outer, inner, sizeof inner);
  pj_sha256_final(&c->outer, out);
}

void pj_hmac_sha256(const void *key, size_t keylen, const void *data, size_t n,
                    uint8_t out[PJ_SHA256_DIGEST]) {
  pj_hmac_sha256_t c;
  pj_hmac_sha256_init(&c, key, keylen);
  pj_hmac_sha256_update(&c, data, n);
  pj_hmac_sha256_final(&c, out);
}

bool pj_equal_consttime(const void *a, const void *b, size_t n) {
  /* Every byte is read whatever the earlier ones were; volatile keeps the compiler from
   * turning the loop into an early-exit comparison. */
  const volatile uint8_t *x = a, *y = b;
  uint8_t diff = 0;
  for (size_t i = 0; i < n; i++) diff |= (uint8_t)(x[i] ^ y[i]);
  return diff == 0;
}
