/* tests/tokens/bpe_roundtrip.c: `bpe_roundtrip ENCODER.JSON VOCAB.BPE FILE`:
 * the file's text encoded with tools/bpe.c and its ids decoded one by one
 * (stoke_bpe_decode, what tools/generate prints) must give the text back,
 * byte for byte; prints the token count or where they part. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/bpe.h"

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: bpe_roundtrip ENCODER.JSON VOCAB.BPE FILE\n");
    return 2;
  }
  FILE *f = fopen(argv[3], "rb");
  static char text[1 << 20], back[1 << 21];
  size_t n = f ? fread(text, 1, sizeof text, f) : 0;
  if (f) fclose(f);
  stoke_bpe *b = NULL;
  int32_t *ids = NULL;
  int64_t count = 0;
  stoke_err *e = stoke_bpe_load(argv[1], argv[2], &b);
  if (!e) e = stoke_bpe_encode(b, text, n, &ids, &count);
  if (e) {
    fprintf(stderr, "bpe_roundtrip: %s\n", e->msg);
    return 1;
  }
  size_t m = 0;
  for (int64_t i = 0; i < count; i++) m += stoke_bpe_decode(b, ids[i], back + m, sizeof back - m);
  size_t at = 0;
  while (at < n && at < m && text[at] == back[at]) at++;
  int ok = m == n && at == n;
  if (ok) printf("%lld tokens\n", (long long)count);
  else printf("decoded %zu bytes of %zu; they part at byte %zu\n", m, n, at);
  /* an id outside the vocabulary decodes to nothing */
  char none[8];
  if (stoke_bpe_decode(b, STOKE_BPE_VOCAB, none, sizeof none) || stoke_bpe_decode(b, -1, none, sizeof none)) {
    printf("an id outside the vocabulary decoded to bytes\n");
    ok = 0;
  }
  free(ids);
  stoke_bpe_free(b);
  return ok ? 0 : 1;
}
