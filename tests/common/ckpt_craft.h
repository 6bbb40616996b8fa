/* tests/common/ckpt_craft.h: checkpoint files edited as a damaged, crafted
 * or older file would be (tests/e2e/robust_test, tests/unit/layout_test).
 * Include after cmocka.h. */
#ifndef STOKE_TESTS_CKPT_CRAFT_H
#define STOKE_TESTS_CKPT_CRAFT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The whole of a checkpoint file (free it) and its header's length. */
static __attribute__((unused)) unsigned char *read_ckpt(const char *path, size_t *n, uint64_t *hlen) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  rewind(f);
  unsigned char *b = malloc(*n);
  assert_int_equal(fread(b, 1, *n, f), *n);
  fclose(f);
  *hlen = 0;
  for (int i = 0; i < 8; i++) *hlen |= (uint64_t)b[i] << (8 * i);
  return b;
}

/* Reads a checkpoint, applies `edit` to its header text (replace `from`
 * by `to`, and drop both checksums when `drop_crc`, as in a file written
 * before they existed), writes it to
 * `out`. */
static __attribute__((unused)) void craft(const char *in, const char *out, const char *from, const char *to, int drop_crc) {
  size_t n;
  uint64_t hlen;
  unsigned char *b = read_ckpt(in, &n, &hlen);
  size_t cap = hlen + (to ? strlen(to) : 0) + 64;
  char *h = calloc(1, cap);
  memcpy(h, b + 8, hlen);
  char *p = from ? strstr(h, from) : NULL;
  if (from) {
    assert_non_null(p);
    memmove(p + strlen(to), p + strlen(from), strlen(p + strlen(from)) + 1);
    memcpy(p, to, strlen(to));
  }
  if (drop_crc) {
    char *c = strstr(h, ",\"stoke_meta_crc32c\":\"");
    assert_non_null(c);
    memmove(c, c + 31, strlen(c + 31) + 1);
    /* and the tensors' checksums: a file from before checksums has neither (one alone is refused) */
    char *d = strstr(h, ",\"stoke_crc32c\":\"");
    assert_non_null(d);
    char *end = strchr(d + 17, '"');
    assert_non_null(end);
    memmove(d, end + 1, strlen(end + 1) + 1);
  }
  while (strlen(h) > 0 && h[strlen(h) - 1] == ' ') h[strlen(h) - 1] = 0;
  while (strlen(h) % 8) strcat(h, " ");
  uint64_t nl = strlen(h);
  FILE *f = fopen(out, "wb");
  for (int i = 0; i < 8; i++) fputc((int)(nl >> (8 * i)) & 0xff, f);
  fwrite(h, 1, nl, f);
  fwrite(b + 8 + hlen, 1, n - 8 - hlen, f);
  fclose(f);
  free(h);
  free(b);
}

#endif
