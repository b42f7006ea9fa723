/* SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), written from the specifications: the
 * persistent compile cache's keyed integrity tags (disk_cache.c, TORCH_PJRT_CACHE_KEY). No
 * allocation, no failure modes; tests/c/test_sha256.c checks the published test vectors. */
#ifndef TORCH_PJRT_SHA256_H
#define TORCH_PJRT_SHA256_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

#define PJ_SHA256_DIGEST 32
#define PJ_SHA256_BLOCK 64

typedef struct {
  uint32_t h[8];
  uint64_t total;                /* bytes hashed so far (message length mod 2^64 bytes) */
  uint8_t buf[PJ_SHA256_BLOCK];  /* the partial block: total % 64 bytes of it are valid */
} pj_sha256_t;

void pj_sha256_init(pj_sha256_t *s);
void pj_sha256_update(pj_sha256_t *s, const void *data, size_t n);
/* Writes the digest; s must be initialized again before reuse. */
void pj_sha256_final(pj_sha256_t *s, uint8_t out[PJ_SHA256_DIGEST]);
void pj_sha256(const void *data, size_t n, uint8_t out[PJ_SHA256_DIGEST]);

/* HMAC-SHA256, incremental: init with the key (any length: keys longer than a block are
 * hashed first, as RFC 2104 says), update with the message, final. A context initialized once
 * may be copied to start many messages under the same key. */
typedef struct {
  pj_sha256_t inner, outer;
} pj_hmac_sha256_t;

void pj_hmac_sha256_init(pj_hmac_sha256_t *c, const void *key, size_t keylen);
void pj_hmac_sha256_update(pj_hmac_sha256_t *c, const void *data, size_t n);
void pj_hmac_sha256_final(pj_hmac_sha256_t *c, uint8_t out[PJ_SHA256_DIGEST]);
void pj_hmac_sha256(const void *key, size_t keylen, const void *data, size_t n,
                    uint8_t out[PJ_SHA256_DIGEST]);

/* true when a and b hold the same n bytes. Its running time depends on n only, never on
 * where the bytes differ (a tag comparison must not tell an attacker how much of a forged tag
 * was right). */
bool pj_equal_consttime(const void *a, const void *b, size_t n);

#ifdef __cplusplus
}
#endif
#endif
