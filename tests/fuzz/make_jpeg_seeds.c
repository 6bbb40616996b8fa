/* tests/fuzz/make_jpeg_seeds.c: writes the JPEG seeds of the fuzz corpus
 * (tests/fuzz/make_corpus.sh builds and runs it): small images of every
 * kind libjpeg-turbo writes: baseline 4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1,
 * gray, progressive, CMYK, odd sizes. */
#include <stdio.h>
#include <stdlib.h>

#include <turbojpeg.h>

static void one(const char *dir, const char *name, int w, int h, int pf, int samp, int flags) {
  int ps = tjPixelSize[pf];
  unsigned char *px = malloc((size_t)w * h * ps);
  for (int i = 0; i < w * h * ps; i++) px[i] = (unsigned char)(i * 37 + (i / (w * ps)) * 11);
  tjhandle t = tjInitCompress();
  unsigned char *jpg = NULL;
  unsigned long n = 0;
  if (tjCompress2(t, px, w, 0, h, pf, &jpg, &n, samp, 85, flags)) {
    fprintf(stderr, "%s: %s\n", name, tjGetErrorStr2(t));
    exit(1);
  }
  char path[512];
  snprintf(path, sizeof path, "%s/%s.jpg", dir, name);
  FILE *f = fopen(path, "wb");
  fwrite(jpg, 1, n, f);
  fclose(f);
  tjFree(jpg);
  tjDestroy(t);
  free(px);
}

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  const char *d = argv[1];
  one(d, "444", 16, 16, TJPF_RGB, TJSAMP_444, 0);
  one(d, "422", 24, 16, TJPF_RGB, TJSAMP_422, 0);
  one(d, "420", 33, 17, TJPF_RGB, TJSAMP_420, 0);
  one(d, "440", 16, 24, TJPF_RGB, TJSAMP_440, 0);
  one(d, "411", 40, 8, TJPF_RGB, TJSAMP_411, 0);
  one(d, "gray", 20, 12, TJPF_GRAY, TJSAMP_GRAY, 0);
  one(d, "progressive", 32, 24, TJPF_RGB, TJSAMP_420, TJFLAG_PROGRESSIVE);
  one(d, "cmyk", 16, 16, TJPF_CMYK, TJSAMP_444, 0);
  one(d, "tiny", 1, 1, TJPF_RGB, TJSAMP_444, 0);
  one(d, "wide", 64, 2, TJPF_RGB, TJSAMP_420, 0);
  return 0;
}
