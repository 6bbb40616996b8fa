/* tests/fuzz/bpe_fuzz.c: fuzz target of GPT-2's tokenizer files as
 * tools/bpe.c parses them (convert text --tokenizer gpt2, generate): the
 * input is encoder.json's text, a NUL byte, then vocab.bpe's. A file that
 * is not GPT-2's (a damaged download, another model's vocabulary) must be
 * an error, never a read past its end (json_string once could: a file cut
 * inside a \u escape). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tools/bpe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *nul = memchr(data, 0, size);
  size_t ne = nul ? (size_t)(nul - data) : size, nm = nul ? size - ne - 1 : 0;
  char *enc = malloc(ne + 1), *merges = malloc(nm + 1);
  if (enc && merges) {
    memcpy(enc, data, ne);
    enc[ne] = 0;
    if (nm) memcpy(merges, nul + 1, nm);
    merges[nm] = 0;
    stoke_bpe *b = NULL;
    stoke_err *e = stoke_bpe_parse(enc, merges, "encoder.json", "vocab.bpe", &b);
    if (e) {
      stoke_err_free(e);
    } else { /* only GPT-2's own counts get here: encode and decode a text */
      int32_t *ids = NULL;
      int64_t count = 0;
      if (!(e = stoke_bpe_encode(b, "Hello world, it's 12 o'clock", 28, &ids, &count))) {
        char out[256];
        for (int64_t i = 0; i < count; i++) stoke_bpe_decode(b, ids[i], out, sizeof out);
      }
      if (e) stoke_err_free(e);
      free(ids);
      stoke_bpe_free(b);
    }
  }
  free(enc);
  free(merges);
  return 0;
}
