/* tests/fuzz/driver.c: runs a fuzz target (LLVMFuzzerTestOneInput) without
 * libFuzzer, as a cmocka test in the normal build and under ASan/UBSan
 * (tools/test.sh): every file of the corpus folders named on the command
 * line (the seeds, and regress/: inputs that once failed), then a fixed
 * number of deterministic mutations of each seed (bit flips, interesting
 * bytes and integers, cuts, insertions, splices). tools/fuzz.sh runs the
 * same targets under libFuzzer, guided by coverage, for longer.
 *
 *   <target>_fuzz_test [--mutations N] [--seed S] DIR_OR_FILE...
 *
 * STOKE_FUZZ_MUTATIONS overrides the default of mutations per seed. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

typedef struct input {
  uint8_t *d;
  size_t n;
  char name[512];
} input;

static input *inputs;
static int n_inputs, cap_inputs;
static long mutations = 300;
static uint64_t seed = 1;

static void add_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  rewind(f);
  uint8_t *d = malloc(n > 0 ? (size_t)n : 1);
  if (!d || (n > 0 && fread(d, 1, (size_t)n, f) != (size_t)n)) fail_msg("cannot read %s", path);
  fclose(f);
  if (n_inputs == cap_inputs) {
    cap_inputs = cap_inputs ? 2 * cap_inputs : 64;
    inputs = realloc(inputs, sizeof *inputs * (size_t)cap_inputs);
  }
  input *in = &inputs[n_inputs++];
  in->d = d;
  in->n = (size_t)n;
  snprintf(in->name, sizeof in->name, "%s", path);
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A file, or every file of a folder (sorted, not recursive); a missing
 * folder is empty (regress/ exists only once something was found). */
static void add_path(const char *path) {
  struct stat st;
  if (stat(path, &st)) return;
  if (!S_ISDIR(st.st_mode)) {
    add_file(path);
    return;
  }
  DIR *dir = opendir(path);
  char *names[4096];
  int n = 0;
  for (struct dirent *de; dir && (de = readdir(dir)) && n < 4096;)
    if (de->d_name[0] != '.') names[n++] = strdup(de->d_name);
  if (dir) closedir(dir);
  qsort(names, (size_t)n, sizeof *names, by_name);
  for (int i = 0; i < n; i++) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", path, names[i]);
    add_file(p);
    free(names[i]);
  }
}

static uint64_t next(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* One mutation of `in` into a fresh buffer (*out, *n). */
static void mutate(const input *in, uint64_t *r, uint8_t **out, size_t *n) {
  static const uint64_t ints[] = {0, 1, 0x7f, 0x80, 0xff, 0x7fff, 0x8000, 0xffff, 0x7fffffff, 0x80000000u,
                                  0xffffffffu, 0x7fffffffffffffffull, 0x8000000000000000ull, ~0ull, 16, 64, 4096};
  size_t cap = in->n + 64;
  uint8_t *d = malloc(cap);
  memcpy(d, in->d, in->n);
  size_t len = in->n;
  int rounds = 1 + (int)(next(r) % 4);
  for (int k = 0; k < rounds; k++) {
    size_t at = len ? (size_t)(next(r) % len) : 0;
    switch (next(r) % 8) {
      case 0: if (len) d[at] ^= (uint8_t)(1u << (next(r) % 8)); break;                /* a bit */
      case 1: if (len) d[at] = (uint8_t)ints[next(r) % 5]; break;                     /* a byte */
      case 2: {                                                                       /* an integer */
        int w = 1 << (next(r) % 4);
        uint64_t v = ints[next(r) % (sizeof ints / sizeof *ints)];
        int be = (int)(next(r) % 2);
        for (int b = 0; b < w && at + (size_t)b < len; b++)
          d[at + (size_t)b] = (uint8_t)(v >> (8 * (be ? w - 1 - b : b)));
        break;
      }
      case 3: len = at; break;                                                        /* cut short */
      case 4: if (len + 16 <= cap) {                                                  /* insert bytes */
          int m = 1 + (int)(next(r) % 16);
          memmove(d + at + m, d + at, len - at);
          for (int b = 0; b < m; b++) d[at + (size_t)b] = (uint8_t)next(r);
          len += (size_t)m;
        }
        break;
      case 5: if (len) {                                                              /* delete bytes */
          size_t m = 1 + next(r) % 16;
          if (at + m > len) m = len - at;
          memmove(d + at, d + at + m, len - at - m);
          len -= m;
        }
        break;
      case 6: if (len > 1) {                                                          /* copy a range */
          size_t from = next(r) % len, m = 1 + next(r) % 32;
          if (from + m > len) m = len - from;
          if (at + m > len) m = len - at;
          memmove(d + at, d + from, m);
        }
        break;
      default: {                                                                      /* splice another seed */
        const input *o = &inputs[next(r) % (uint64_t)n_inputs];
        if (o->n && at < cap) {
          size_t from = next(r) % o->n, m = o->n - from;
          if (at + m > cap) m = cap - at;
          memcpy(d + at, o->d + from, m);
          if (at + m > len) len = at + m;
        }
      }
    }
  }
  *out = d;
  *n = len;
}

/* Each corpus file as it is. */
static void test_corpus(void **state) {
  for (int i = 0; i < n_inputs; i++) {
    /* a copy of exactly its size, so ASan sees any read past the end */
    uint8_t *d = malloc(inputs[i].n ? inputs[i].n : 1);
    memcpy(d, inputs[i].d, inputs[i].n);
    LLVMFuzzerTestOneInput(d, inputs[i].n);
    free(d);
  }
  print_message("%d corpus inputs\n", n_inputs);
}

static void test_mutations(void **state) {
  uint64_t r = seed;
  long total = 0;
  for (int i = 0; i < n_inputs; i++)
    for (long k = 0; k < mutations; k++) {
      uint8_t *d;
      size_t n;
      mutate(&inputs[i], &r, &d, &n);
      if (getenv("STOKE_FUZZ_SAVE")) { /* the input about to run, for a crash's reproduction */
        FILE *f = fopen(getenv("STOKE_FUZZ_SAVE"), "wb");
        if (f) {
          fwrite(d, 1, n, f);
          fclose(f);
        }
      }
      LLVMFuzzerTestOneInput(d, n);
      free(d);
      total++;
    }
  print_message("%ld mutations (seed %llu)\n", total, (unsigned long long)seed);
}

int main(int argc, char **argv) {
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  const char *m = getenv("STOKE_FUZZ_MUTATIONS");
  if (m) mutations = atol(m);
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--mutations") && i + 1 < argc) mutations = atol(argv[++i]);
    else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
    else add_path(argv[i]);
  }
  if (!n_inputs) {
    fprintf(stderr, "no corpus: name the seed folders (tests/fuzz/corpus/<target>)\n");
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_corpus),
      cmocka_unit_test(test_mutations),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
