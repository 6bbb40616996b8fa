/* tests/jpeg/decode_bench.c: how many images per second one core decodes
 * with the "jpeg" source's train transform (RandomResizedCrop 224 + flip)
 * from a 500x375 quality-90 4:2:0 JPEG, as in BENCH.md's jpeg-bench. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <turbojpeg.h>

#include "sources/jpeg/crop.h"
#include "stoke/config.h"
#include "stoke/core.h"
#include "stoke/registry.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int die(const char *what, stoke_err *e) {
  fprintf(stderr, "decode_bench: %s: %s\n", what, e ? e->msg : "failed");
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: decode_bench PHOTO.jpg [N] [plugin.so]\n");
    return 2;
  }
  int n = argc > 2 ? atoi(argv[2]) : 3000;
  const char *plugin = argc > 3 ? argv[3] : "sources/jpeg/libstoke_jpeg.so";
  /* the photo -> 500x375, quality 90, 4:2:0 */
  FILE *f = fopen(argv[1], "rb");
  if (!f) return die(argv[1], NULL);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *src = malloc((size_t)len);
  if (fread(src, 1, (size_t)len, f) != (size_t)len) return die("read", NULL);
  fclose(f);
  tjhandle t = tjInitDecompress();
  int w, h, ss, cs;
  if (tjDecompressHeader3(t, src, (unsigned long)len, &w, &h, &ss, &cs)) return die("header", NULL);
  unsigned char *px = malloc((size_t)w * h * 3), *small = malloc(500 * 375 * 3);
  if (tjDecompress2(t, src, (unsigned long)len, px, w, 0, h, TJPF_RGB, 0)) return die("decode", NULL);
  stoke_jpeg_rect r = {0, 0, w, h};
  stoke_jpeg_resample(px, w, h, w * 3, r, small, 500, 375, 0);
  tjhandle c = tjInitCompress();
  unsigned char *jpeg = NULL;
  unsigned long jn = 0;
  if (tjCompress2(c, small, 500, 0, 375, TJPF_RGB, &jpeg, &jn, TJSAMP_420, 90, 0)) return die("encode", NULL);
  char root[4096], dir[4200], file[4300];
  const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(root, sizeof root, "%s/stoke_decode_bench_%d", tmp, (int)getpid());
  snprintf(dir, sizeof dir, "%s/c0", root);
  snprintf(file, sizeof file, "%s/img.jpg", dir);
  mkdir(root, 0755);
  mkdir(dir, 0755);
  f = fopen(file, "wb");
  fwrite(jpeg, 1, jn, f);
  fclose(f);

  stoke_registry *reg;
  stoke_err *e = stoke_registry_new(&reg);
  if (!e) e = stoke_registry_load(reg, plugin);
  if (e) return die(plugin, e);
  const stoke_source_v1 *s = stoke_find_source(reg, "jpeg");
  stoke_cfg *cfg;
  char ini[8192];
  for (int cache = 0; cache < 2; cache++) {
    snprintf(ini, sizeof ini, "[data]\nroot = %s\nsize = 224\ncache = %s\n", root, cache ? "ram" : "none");
    cfg = stoke_cfg_new();
    e = stoke_cfg_declare(cfg, "data", NULL, s->keys, s->n_keys);
    if (!e) e = stoke_cfg_load_string(cfg, "bench.ini", ini);
    if (!e) e = stoke_cfg_validate(cfg);
    void *self = NULL;
    if (!e) e = s->open(cfg, "data", &self);
    if (e) return die("open", e);
    unsigned char *out = malloc(224 * 224 * 3);
    int32_t label;
    for (int i = 0; i < 50; i++) s->read(self, 0, (uint64_t)i, out, &label); /* warm-up */
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
      double t0 = now();
      for (int i = 0; i < n; i++) {
        e = s->read(self, 0, (uint64_t)(rep * n + i) * 2654435761u, out, &label);
        if (e) return die("read", e);
      }
      double dt = now() - t0;
      if (dt < best) best = dt;
    }
    printf("jpeg source, train transform 500x375 q90 4:2:0 (%lu bytes) -> 224x224, cache=%s: %.0f images/s "
           "on one core (best of 3 x %d)\n",
           jn, cache ? "ram" : "none", n / best, n);
    free(out);
    s->close(self);
    stoke_cfg_free(cfg);
  }
  remove(file);
  rmdir(dir);
  rmdir(root);
  stoke_registry_free(reg);
  return 0;
}
