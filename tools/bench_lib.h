/* tools/bench_lib.h: what tools/bench does that needs no device: its
 * arguments, the statistics over rounds, and the reports (text, JSON,
 * markdown), apart so that tests/tools can check them on recorded timings. */
#ifndef STOKE_TOOLS_BENCH_LIB_H
#define STOKE_TOOLS_BENCH_LIB_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "stoke/graph.h" /* stoke_op_time */

#define BENCH_MAX_OV 64       /* overrides per group */
#define BENCH_MAX_ROUNDS 1000
#define BENCH_MAX_OPS 256     /* per-op rows per variant */

/* ------------------------------------------------------------ arguments */

typedef struct bench_args {
  const char *ini;
  const char *common[BENCH_MAX_OV]; /* overrides for both variants */
  int n_common;
  const char *ov[2][BENCH_MAX_OV]; /* --a's and --b's overrides */
  int n_ov[2];
  int variants; /* 1: no --b (a plain benchmark), 2: A/B */
  int rounds, warmup, steps, per_op;
  const char *json, *md, *html; /* NULL: not written */
} bench_args;

/* The usage text (kept beside the parser so the two agree). */
void bench_usage(FILE *f);

/* argv[1..argc-1] into *a (defaults: 5 rounds, 12 warm-up, 40 timed
 * steps). Returns 0 when parsed, 1 for --help, -1 on bad input with the
 * reason in err. The strings stay argv's. */
int bench_parse_args(int argc, char *const *argv, bench_args *a, char *err, size_t cap);

/* ------------------------------------------------------------ statistics */

typedef struct bench_spread {
  int n;
  double median, min, max;
} bench_spread;

/* Median and range of x[0..n-1] (NaN for n = 0). */
bench_spread bench_spread_of(const double *x, int n);

/* The two-sided 95% quantile of Student's t with df degrees of freedom
 * (a table to 30, the Cornish-Fisher expansion beyond; NaN for df < 1). */
double bench_t975(int df);

typedef struct bench_ratio {
  int n;
  double ratio, lo, hi; /* lo, hi: NaN when n < 2 */
} bench_ratio;

/* B/A over paired rounds (a[i] and b[i] ran back to back): the geometric
 * mean of b[i] / a[i], with the 95% t-interval of the mean log ratio,
 * exp(mean +- t975(n-1) * sd / sqrt(n)). Pairing cancels what drifts
 * slowly on a shared machine (clocks, neighbours) from both sides. */
bench_ratio bench_ratio_paired(const double *a, const double *b, int n);

/* The mean of v's finite values (NaN: none). */
double bench_mean_finite(const double *v, int n);

/* samples/s of `steps` steps of `batch` samples in `ms` (NaN if ms <= 0). */
double bench_rate(int64_t batch, int64_t steps, double ms);

/* -------------------------------------------------------------- results */

typedef struct bench_variant {
  char name[2];            /* "A" or "B" */
  char overrides[1024];    /* the variant's own overrides, space-separated (the text reports) */
  const char *ov[BENCH_MAX_OV]; /* the same, one each (JSON: a value may hold spaces) */
  int n_ov;
  char device[128], precision[32];
  int64_t batch;           /* samples per optimizer step */
  double rate[BENCH_MAX_ROUNDS]; /* samples/s per round */
  /* each round's GPU power (W, mean) and the share of its time the power limit held the clocks down
   * (stoke_summary's gpu_power_w, gpu_power_capped; NaN: not measured) */
  double power_w[BENCH_MAX_ROUNDS], capped[BENCH_MAX_ROUNDS];
  int n;
  double first_loss, final_loss; /* of the last round */
  stoke_op_time ops[BENCH_MAX_OPS]; /* the profile round (per_op) */
  int n_ops;
} bench_variant;

typedef struct bench_result {
  const char *ini;
  const char *common;      /* overrides of both, space-separated (the text reports) */
  const char *const *common_ov; /* the same, one each (JSON) */
  int n_common_ov;
  int warmup, steps, rounds, per_op;
  int gpu;                 /* timed with device events (1) or the host clock (0) */
  char commit[64], date[32];
  int n_variants;
  bench_variant v[2];
} bench_result;

/* What the A/B numbers say, in words. `line` is the verdict:
 *   "B is faster by 12% (95% CI 8% to 16%)" / "B is slower by ...",
 *   "no difference detected (the interval includes 1.0: ...)",
 *   "inconclusive: the interval spans 0.14x to 12x; ..." (an interval
 *   that includes 1.0 but is wider than BENCH_WIDE_CI, or one round);
 * one variant: "" (no comparison). warn[] holds what makes the numbers
 * weak: a timed window per round shorter than BENCH_MIN_WINDOW_MS (host
 * clock) or BENCH_MIN_WINDOW_MS_GPU (device events), with the --steps
 * that would reach it, and rounds of a variant spread wider than
 * BENCH_WIDE_SPREAD of their median. */
#define BENCH_MIN_WINDOW_MS 1000.0
#define BENCH_MIN_WINDOW_MS_GPU 100.0
#define BENCH_WIDE_CI 1.2      /* hi / lo of the B/A interval */
#define BENCH_WIDE_SPREAD 0.10 /* (max - min) / median of a variant's rounds */
typedef struct bench_verdict {
  char line[256];
  char warn[3][256];
  int n_warn;
} bench_verdict;
void bench_verdict_of(const bench_result *r, bench_verdict *out);

/* The commit: $STOKE_COMMIT, else a file COMMIT in `exe_dir` (written by
 * tools/gpu_stage.sh), else `git rev-parse` in the working folder (with
 * "-dirty" for uncommitted changes to tracked files), else "unknown". */
void bench_commit(const char *exe_dir, char *out, size_t cap);

/* The report for a terminal; as one JSON object; as markdown tables for
 * BENCHMARKS.md. */
void bench_print(const bench_result *r, FILE *f);
void bench_write_json(const bench_result *r, FILE *f);
void bench_write_md(const bench_result *r, FILE *f);
/* The same as one self-contained HTML page (core/report.c's plots): the
 * rounds' samples/s of A and B, B/A with its interval, the per-op change. */
void bench_write_html(const bench_result *r, FILE *f);

#endif
