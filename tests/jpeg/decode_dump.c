/* tests/jpeg/decode_dump.c: decodes JPEG files the way every stoke reader
 * does (sources/jpeg/decode.h: the warning rule, CMYK/YCCK to RGB) and
 * writes each as a binary PPM, for pil_test.sh to compare with PIL.
 *
 *   decode_dump IN.jpg OUT.ppm [IN.jpg OUT.ppm ...]
 *
 * Exit 1 when a file is refused (its reason on stderr), 0 otherwise. */
#include <stdio.h>
#include <stdlib.h>

#include "sources/jpeg/decode.h"

int main(int argc, char **argv) {
  int status = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    FILE *f = fopen(argv[i], "rb");
    if (!f) {
      perror(argv[i]);
      return 1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    uint8_t *data = malloc((size_t)n);
    if (!data || fread(data, 1, (size_t)n, f) != (size_t)n) return 1;
    fclose(f);
    uint8_t *px = NULL;
    int h, w;
    char why[512];
    if (stoke_jpeg_decode(data, (size_t)n, 3, 8, 0, 0, &px, &h, &w, why, sizeof why)) {
      fprintf(stderr, "%s: refused: %s\n", argv[i], why);
      status = 1;
    } else {
      FILE *o = fopen(argv[i + 1], "wb");
      fprintf(o, "P6\n%d %d\n255\n", w, h);
      fwrite(px, 1, (size_t)w * (size_t)h * 3, o);
      fclose(o);
      free(px);
    }
    free(data);
  }
  return status;
}
