/* tests/fuzz/safetensors_fuzz.c: fuzz target of the checkpoint reader:
 * the safetensors structure (header JSON, offsets tiling the data), then
 * what a resume checks before it touches the model: the run state's
 * fields and checksum, every tensor's CRC-32C. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/checkpoint.h"
#include "stoke/core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  unsigned char *bytes = malloc(size ? size : 1);
  if (!bytes) return 0;
  memcpy(bytes, data, size);
  stoke_st_file f;
  stoke_err *e = stoke_st_parse(bytes, size, "fuzz.safetensors", &f); /* owns bytes now */
  if (e) {
    stoke_err_free(e);
    return 0;
  }
  stoke_ckpt_meta m;
  e = stoke_checkpoint_check(&f, "fuzz.safetensors", &m);
  if (e) stoke_err_free(e);
  for (int i = 0; i < f.n_tensors; i++) {
    const stoke_st_tensor *t = stoke_st_find(&f, f.tensors[i].name);
    /* every tensor's bytes lie inside the data section */
    volatile unsigned char sum = 0;
    for (size_t k = t->begin; k < t->end; k++) sum ^= f.data[k];
  }
  stoke_st_free(&f);
  return 0;
}
