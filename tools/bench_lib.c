/* tools/bench_lib.c: tools/bench's arguments, statistics and reports (see
 * bench_lib.h); nothing here touches a device. */
#include "stoke/report.h"
#include "tools/bench_lib.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ arguments */

void bench_usage(FILE *f) {
  fprintf(f,
          "usage: bench RUN.INI [section.key=value ...] [--a section.key=value ...] [--b section.key=value ...]\n"
          "             [--rounds 5] [--warmup 12] [--steps 40] [--per-op] [--json FILE] [--md FILE] [--html FILE]\n"
          "       bench --loader RUN.INI [bench_loader options]   the loader alone (see bench_loader --help)\n"
          "\n"
          "Runs the training step of RUN.INI as variant A (with --a's overrides) and variant B (with\n"
          "--b's), interleaved A B A B ... for --rounds rounds; each run is a fresh tools/train run\n"
          "of --warmup untimed steps and then --steps timed ones (device events on a GPU, the host\n"
          "clock on the CPU); samples/s = batch x steps / elapsed. Overrides outside --a / --b apply\n"
          "to both; the ones after --a or --b belong to that variant up to the next option. With no\n"
          "--b, it is a plain benchmark of one variant.\n"
          "Prints per variant the median and min-max samples/s, and B/A with a 95%% confidence\n"
          "interval: the geometric mean of the paired rounds' ratios, with a t-interval on their\n"
          "logarithms. --per-op adds one profiled run per variant (not timed) and a table of GPU\n"
          "time per op, pass and engine for both and the change. --json and --md write the results\n"
          "(device, precision, commit, date) as JSON and as markdown tables for BENCHMARKS.md; --html\n"
          "as a page with plots (rates per round, B/A, the per-op change).\n"
          "The bench sets run.steps, run.profile_ops, run.checkpoint=false and run.progress=off itself;\n"
          "each variant's runs write to <run.out_dir, default runs/bench_<ini name>>/<A|B>/ (plan.txt,\n"
          "metrics.jsonl).\n"
          "Exit codes: 0 done, 1 error, 2 usage.\n");
}

static int fail(char *err, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, cap, fmt, ap);
  va_end(ap);
  return -1;
}

/* The value of option `name` given as "--name V" or "--name=V". */
static int opt_value(int argc, char *const *argv, int *i, const char *name, const char **val) {
  size_t n = strlen(name);
  if (strncmp(argv[*i], name, n)) return 0;
  if (argv[*i][n] == '=') {
    *val = argv[*i] + n + 1;
    return 1;
  }
  if (argv[*i][n]) return 0;
  *val = *i + 1 < argc ? argv[++*i] : NULL;
  return 1;
}

static int parse_count(const char *name, const char *v, long lo, long hi, int *out, char *err, size_t cap) {
  if (!v) return fail(err, cap, "%s needs a number", name);
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi)
    return fail(err, cap, "%s '%s': a whole number from %ld to %ld", name, v, lo, hi);
  *out = (int)x;
  return 0;
}

/* "section.key=value": the keys the bench sets itself are refused. */
static int check_override(const char *ov, char *err, size_t cap) {
  const char *eq = strchr(ov, '='), *dot = strchr(ov, '.');
  if (!eq || !dot || dot > eq || dot == ov || dot + 1 == eq)
    return fail(err, cap, "'%s' is neither an option nor a section.key=value override", ov);
  static const char *const own[] = {"run.steps", "run.profile_ops", "run.checkpoint"};
  for (size_t k = 0; k < sizeof own / sizeof *own; k++)
    if ((size_t)(eq - ov) == strlen(own[k]) && !strncmp(ov, own[k], strlen(own[k])))
      return fail(err, cap, "'%s': the bench sets %s itself (use --warmup, --steps and --per-op)", ov, own[k]);
  return 0;
}

int bench_parse_args(int argc, char *const *argv, bench_args *a, char *err, size_t cap) {
  memset(a, 0, sizeof *a);
  a->rounds = 5;
  a->warmup = 12;
  a->steps = 40;
  a->variants = 1;
  err[0] = 0;
  int group = -1, seen[2] = {0, 0}; /* the --a / --b whose overrides follow */
  for (int i = 1; i < argc; i++) {
    const char *s = argv[i], *v;
    if (!strcmp(s, "--help") || !strcmp(s, "-h")) return 1;
    if (s[0] != '-') {
      if (!a->ini && !strchr(s, '=')) {
        a->ini = s;
        continue;
      }
      if (check_override(s, err, cap)) return -1;
      int *n = group < 0 ? &a->n_common : &a->n_ov[group];
      if (*n == BENCH_MAX_OV) return fail(err, cap, "more than %d overrides in one group", BENCH_MAX_OV);
      (group < 0 ? a->common : a->ov[group])[(*n)++] = s;
      continue;
    }
    if (group >= 0 && !a->n_ov[group])
      return fail(err, cap, "--%c needs at least one section.key=value after it", 'a' + group);
    group = -1;
    if (!strcmp(s, "--a") || !strcmp(s, "--b")) {
      group = s[2] - 'a';
      if (seen[group]++) return fail(err, cap, "%s given twice; list all of its overrides after one %s", s, s);
      if (group == 1) a->variants = 2;
    } else if (!strcmp(s, "--per-op")) {
      a->per_op = 1;
    } else if (opt_value(argc, argv, &i, "--rounds", &v)) {
      if (parse_count("--rounds", v, 1, BENCH_MAX_ROUNDS, &a->rounds, err, cap)) return -1;
    } else if (opt_value(argc, argv, &i, "--warmup", &v)) {
      if (parse_count("--warmup", v, 0, 1000000, &a->warmup, err, cap)) return -1;
    } else if (opt_value(argc, argv, &i, "--steps", &v)) {
      if (parse_count("--steps", v, 1, 1000000, &a->steps, err, cap)) return -1;
    } else if (opt_value(argc, argv, &i, "--json", &v) || opt_value(argc, argv, &i, "--md", &v) ||
               opt_value(argc, argv, &i, "--html", &v)) {
      const char *opt = s[2] == 'j' ? "--json" : s[2] == 'm' ? "--md" : "--html";
      if (!v || !v[0]) return fail(err, cap, "%s needs a file name", opt);
      *(s[2] == 'j' ? &a->json : s[2] == 'm' ? &a->md : &a->html) = v;
    } else if (!strcmp(s, "--loader")) {
      return fail(err, cap, "--loader comes first: bench --loader RUN.INI [bench_loader options]");
    } else {
      return fail(err, cap, "unknown option '%s'", s);
    }
  }
  if (group >= 0 && !a->n_ov[group])
    return fail(err, cap, "--%c needs at least one section.key=value after it", 'a' + group);
  if (!a->ini) return fail(err, cap, "no RUN.INI given");
  return 0;
}

/* ------------------------------------------------------------ statistics */

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

bench_spread bench_spread_of(const double *x, int n) {
  bench_spread s = {n, NAN, NAN, NAN};
  if (n < 1) return s;
  double *v = malloc(sizeof *v * (size_t)n);
  if (!v) return s;
  memcpy(v, x, sizeof *v * (size_t)n);
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  s.min = v[0];
  s.max = v[n - 1];
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  free(v);
  return s;
}

double bench_t975(int df) {
  static const double t[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                             2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                             2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  if (df < 1) return NAN;
  if (df <= 30) return t[df - 1];
  double z = 1.959964, v = df, z3 = z * z * z, z5 = z3 * z * z;
  return z + (z3 + z) / (4 * v) + (5 * z5 + 16 * z3 + 3 * z) / (96 * v * v);
}

bench_ratio bench_ratio_paired(const double *a, const double *b, int n) {
  bench_ratio r = {n, NAN, NAN, NAN};
  if (n < 1) return r;
  double mean = 0, ss = 0;
  for (int i = 0; i < n; i++) mean += log(b[i] / a[i]) / n;
  r.ratio = exp(mean);
  if (n < 2) return r;
  for (int i = 0; i < n; i++) ss += (log(b[i] / a[i]) - mean) * (log(b[i] / a[i]) - mean);
  double half = bench_t975(n - 1) * sqrt(ss / (n - 1)) / sqrt((double)n);
  r.lo = exp(mean - half);
  r.hi = exp(mean + half);
  return r;
}

double bench_mean_finite(const double *v, int n) {
  double s = 0;
  int k = 0;
  for (int i = 0; i < n; i++)
    if (isfinite(v[i])) s += v[i], k++;
  return k ? s / k : NAN;
}

/* A variant's GPU power over its rounds in words, "GPU power 678 W, the
 * clocks held down by the power limit 16% of the time (mean of the
 * rounds)"; 0 (buf empty) where no round measured it (no NVML). */
static int power_words(const bench_variant *x, char *buf, size_t cap) {
  double w = bench_mean_finite(x->power_w, x->n), held = bench_mean_finite(x->capped, x->n);
  buf[0] = 0;
  if (!isfinite(w)) return 0;
  int n = snprintf(buf, cap, "GPU power %.0f W", w);
  if (isfinite(held) && n >= 0 && (size_t)n < cap)
    n += snprintf(buf + n, cap - (size_t)n, ", the clocks held down by the power limit %.0f%% of the time", 100 * held);
  if (n >= 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, " (mean of the rounds)");
  return 1;
}

double bench_rate(int64_t batch, int64_t steps, double ms) {
  return ms > 0 ? (double)batch * (double)steps / (ms / 1000.0) : NAN;
}

/* --------------------------------------------------------------- commit */

void bench_commit(const char *exe_dir, char *out, size_t cap) {
  const char *env = getenv("STOKE_COMMIT");
  if (env && env[0]) {
    snprintf(out, cap, "%s", env);
    return;
  }
  char path[PATH_MAX], line[128] = "";
  snprintf(path, sizeof path, "%s/COMMIT", exe_dir ? exe_dir : ".");
  FILE *f = fopen(path, "r");
  if (f) {
    int ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    line[strcspn(line, "\r\n")] = 0;
    if (ok && line[0]) {
      snprintf(out, cap, "%s", line);
      return;
    }
  }
  snprintf(out, cap, "unknown");
  FILE *p = popen("git rev-parse --short=12 HEAD 2>/dev/null", "r");
  if (!p) return;
  int ok = fgets(line, sizeof line, p) != NULL;
  if (pclose(p) != 0 || !ok) return;
  line[strcspn(line, "\r\n")] = 0;
  int dirty = 0;
  if ((p = popen("git status --porcelain --untracked-files=no 2>/dev/null", "r"))) {
    char any[8];
    dirty = fgets(any, sizeof any, p) != NULL;
    pclose(p);
  }
  snprintf(out, cap, "%s%s", line, dirty ? "-dirty" : "");
}

/* -------------------------------------------------------------- reports */

/* 1234567.4 as "1,234,567". */
static const char *commas(double x, char *buf, size_t cap) {
  if (!isfinite(x)) {
    snprintf(buf, cap, "n/a");
    return buf;
  }
  char digits[64];
  snprintf(digits, sizeof digits, "%.0f", fabs(x));
  size_t n = strlen(digits), o = 0;
  if (x <= -0.5 && o + 1 < cap) buf[o++] = '-';
  for (size_t i = 0; i < n && o + 2 < cap; i++) {
    buf[o++] = digits[i];
    if ((n - i - 1) % 3 == 0 && i + 1 < n) buf[o++] = ',';
  }
  buf[o] = 0;
  return buf;
}

static const char *or_ini(const char *ov) { return ov && ov[0] ? ov : "(as the INI file)"; }

/* One row of the per-op comparison: a (op, pass, engine) in A and/or B. */
typedef struct op_pair {
  const stoke_op_time *t; /* its names (from A or B) */
  double ms[2];           /* NaN: not in that variant */
  int nodes[2];
} op_pair;

static int op_same(const stoke_op_time *x, const stoke_op_time *y) {
  return !strcmp(x->op, y->op) && !strcmp(x->pass, y->pass) && !strcmp(x->engine, y->engine);
}

static double op_delta(const op_pair *p) {
  double a = isnan(p->ms[0]) ? 0 : p->ms[0], b = isnan(p->ms[1]) ? 0 : p->ms[1];
  return b - a;
}

/* Biggest change first (one variant: slowest first, as B counts 0). */
static int by_change(const void *x, const void *y) {
  double a = fabs(op_delta(x)), b = fabs(op_delta(y));
  return a < b ? 1 : a > b ? -1 : 0;
}

/* A's and B's profile rows matched by op, pass and engine; returns the count. */
static int op_pairs(const bench_result *r, op_pair *out, double total[2]) {
  int n = 0;
  total[0] = total[1] = 0;
  for (int v = 0; v < r->n_variants; v++)
    for (int i = 0; i < r->v[v].n_ops; i++) {
      const stoke_op_time *t = &r->v[v].ops[i];
      int k = 0;
      while (k < n && !op_same(out[k].t, t)) k++;
      if (k == n) out[n++] = (op_pair){t, {NAN, NAN}, {0, 0}};
      out[k].ms[v] = t->ms;
      out[k].nodes[v] = t->nodes;
      total[v] += t->ms;
    }
  qsort(out, (size_t)n, sizeof *out, by_change);
  return n;
}

static void op_name(const stoke_op_time *t, char *buf, size_t cap) {
  if (t->engine[0]) snprintf(buf, cap, "%s %s [%s]", t->op, t->pass, t->engine);
  else snprintf(buf, cap, "%s", t->op);
}

static void fmt_ms(double ms, char *buf, size_t cap) {
  if (isnan(ms)) snprintf(buf, cap, "-");
  else snprintf(buf, cap, "%.3f", ms);
}

static void fmt_change(double a, double b, char *buf, size_t cap) {
  if (isnan(a) && isnan(b)) snprintf(buf, cap, "-");
  else if (isnan(a)) snprintf(buf, cap, "only B");
  else if (isnan(b)) snprintf(buf, cap, "only A");
  else if (a > 0) snprintf(buf, cap, "%+.3f ms (%+.1f%%)", b - a, 100 * (b - a) / a);
  else snprintf(buf, cap, "%+.3f ms", b - a);
}

/* The cells of the per-op table's row k of n (k == n: the total, named
 * `total_name`). */
typedef struct op_cells {
  char name[96], ms0[32], ms1[32], ch[64];
} op_cells;

static void op_row(const op_pair *pairs, int n, const double total[2], int k, const char *total_name, op_cells *c) {
  const double *ms = k < n ? pairs[k].ms : total;
  if (k < n) op_name(pairs[k].t, c->name, sizeof c->name);
  else snprintf(c->name, sizeof c->name, "%s", total_name);
  fmt_ms(ms[0], c->ms0, sizeof c->ms0);
  fmt_ms(ms[1], c->ms1, sizeof c->ms1);
  fmt_change(ms[0], ms[1], c->ch, sizeof c->ch);
}

static const char *timing(const bench_result *r) { return r->gpu ? "device events" : "the host clock"; }

static int ratio_of(const bench_result *r, bench_ratio *q) {
  if (r->n_variants < 2) return 0;
  int n = r->v[0].n < r->v[1].n ? r->v[0].n : r->v[1].n;
  *q = bench_ratio_paired(r->v[0].rate, r->v[1].rate, n);
  return 1;
}

/* ms of one round's timed window: `steps` steps of `batch` samples at `rate`. */
static double window_ms(const bench_result *r, const bench_variant *x) {
  bench_spread s = bench_spread_of(x->rate, x->n);
  return (double)x->batch * r->steps / s.median * 1000;
}

/* Append "; " and the window's shortness to `buf` when it is short; the
 * --steps that reach the threshold go to *steps (0: not short). */
static void short_window(const bench_result *r, char *buf, size_t cap, int *steps) {
  double min_ms = r->gpu ? BENCH_MIN_WINDOW_MS_GPU : BENCH_MIN_WINDOW_MS, shortest = INFINITY;
  for (int v = 0; v < r->n_variants; v++) {
    double ms = window_ms(r, &r->v[v]);
    if (ms < shortest) shortest = ms;
  }
  *steps = 0;
  if (!(shortest < min_ms)) return;
  double want = ceil(r->steps * min_ms / shortest / 10) * 10;
  *steps = want > 1e6 ? 1000000 : (int)want;
  snprintf(buf, cap, "each round timed only %.0f ms of %s", shortest, timing(r));
}

void bench_verdict_of(const bench_result *r, bench_verdict *out) {
  memset(out, 0, sizeof *out);
  char shortness[128] = "";
  int steps;
  short_window(r, shortness, sizeof shortness, &steps);
  if (steps)
    snprintf(out->warn[out->n_warn++], sizeof out->warn[0],
             "%s (under %.0f ms, so start-up noise and the clock's resolution weigh in); try --steps %d",
             shortness, r->gpu ? BENCH_MIN_WINDOW_MS_GPU : BENCH_MIN_WINDOW_MS, steps);
  for (int v = 0; v < r->n_variants && out->n_warn < 3; v++) {
    bench_spread s = bench_spread_of(r->v[v].rate, r->v[v].n);
    double spread = (s.max - s.min) / s.median;
    if (s.n >= 2 && spread > BENCH_WIDE_SPREAD)
      snprintf(out->warn[out->n_warn++], sizeof out->warn[0],
               "%s's rounds spread over %.0f%% of their median (more than %.0f%%): the machine is busy or the "
               "rounds are short; more --rounds narrow the interval",
               r->v[v].name, 100 * spread, 100 * BENCH_WIDE_SPREAD);
  }
  bench_ratio q;
  if (!ratio_of(r, &q)) return;
  if (q.n < 2) {
    snprintf(out->line, sizeof out->line, "inconclusive: one round of each gives no interval; use --rounds 5");
    return;
  }
  if (q.lo > 1 || q.hi < 1) {
    int faster = q.lo > 1;
    double d = faster ? q.ratio - 1 : 1 - q.ratio, a = faster ? q.lo - 1 : 1 - q.hi, b = faster ? q.hi - 1 : 1 - q.lo;
    snprintf(out->line, sizeof out->line, "B is %s by %.1f%% (95%% CI %.1f%% to %.1f%%)", faster ? "faster" : "slower",
             100 * d, 100 * a, 100 * b);
  } else if (q.hi / q.lo <= BENCH_WIDE_CI) {
    snprintf(out->line, sizeof out->line,
             "no difference detected (the interval %.3f to %.3f includes 1.0: any difference is within %.0f%%)", q.lo,
             q.hi, 100 * fmax(1 - q.lo, q.hi - 1));
  } else {
    snprintf(out->line, sizeof out->line, "inconclusive: the interval spans %.3gx to %.3gx%s%s; try %s", q.lo, q.hi,
             shortness[0] ? "; " : "", shortness, steps ? "" : "more --rounds");
    if (steps) {
      size_t n = strlen(out->line);
      snprintf(out->line + n, sizeof out->line - n, "--steps %d", steps);
    }
  }
}

/* "commit unknown (not a git checkout ...)" once, in the report's header */
static const char *commit_words(const bench_result *r, char *buf, size_t cap) {
  if (strcmp(r->commit, "unknown")) return r->commit;
  snprintf(buf, cap, "unknown (not a git checkout; set STOKE_COMMIT to name it)");
  return buf;
}

void bench_print(const bench_result *r, FILE *f) {
  char a[32], b[32], c[32];
  fprintf(f, "stoke bench: %s%s%s, %d round%s%s, %d warm-up + %d timed steps each, timed with %s\n", r->ini,
          r->common && r->common[0] ? " " : "", r->common ? r->common : "", r->rounds, r->rounds == 1 ? "" : "s",
          r->n_variants == 2 ? " (A B interleaved)" : "", r->warmup, r->steps, timing(r));
  char cw[96];
  fprintf(f, "device %s, commit %s, %s\n", r->v[0].device, commit_words(r, cw, sizeof cw), r->date);
  for (int v = 0; v < r->n_variants; v++) {
    const bench_variant *x = &r->v[v];
    bench_spread s = bench_spread_of(x->rate, x->n);
    fprintf(f, "  %s  %-32s %-5s batch %-6lld samples/s median %s  min-max %s - %s\n", x->name,
            or_ini(x->overrides), x->precision, (long long)x->batch, commas(s.median, a, sizeof a),
            commas(s.min, b, sizeof b), commas(s.max, c, sizeof c));
    fprintf(f, "     rounds:");
    for (int i = 0; i < x->n; i++) fprintf(f, " %s", commas(x->rate[i], a, sizeof a));
    fprintf(f, "; loss %.4g -> %.4g\n", x->first_loss, x->final_loss);
    char pw[160]; /* a rate under a power limit is the step's energy as much as its time (run 31) */
    if (power_words(x, pw, sizeof pw)) fprintf(f, "     %s\n", pw);
  }
  bench_ratio q;
  if (ratio_of(r, &q)) {
    if (q.n >= 2)
      fprintf(f, "  B/A %.3f (95%% CI %.3f - %.3f; t-interval on the log ratios of %d paired rounds)\n", q.ratio, q.lo,
              q.hi, q.n);
    else fprintf(f, "  B/A %.3f (one round: no confidence interval; use --rounds 3 or more)\n", q.ratio);
  }
  bench_verdict v;
  bench_verdict_of(r, &v);
  if (v.line[0]) fprintf(f, "  verdict: %s\n", v.line);
  for (int i = 0; i < v.n_warn; i++) fprintf(f, "  warning: %s\n", v.warn[i]);
  if (!r->per_op) return;
  op_pair pairs[2 * BENCH_MAX_OPS];
  double total[2];
  int n = op_pairs(r, pairs, total);
  fprintf(f, "per-op %s time, ms per step (%d profiled steps after the warm-up, one extra run per variant)\n",
          r->gpu ? "GPU" : "CPU", r->steps);
  if (r->n_variants == 2) fprintf(f, "  %-44s %10s %10s  %s\n", "op (pass) [engine]", "A", "B", "B - A");
  else fprintf(f, "  %-44s %10s\n", "op (pass) [engine]", "A");
  for (int k = 0; k <= n; k++) {
    op_cells c;
    op_row(pairs, n, total, k, "total", &c);
    if (r->n_variants == 2) fprintf(f, "  %-44s %10s %10s  %s\n", c.name, c.ms0, c.ms1, c.ch);
    else fprintf(f, "  %-44s %10s\n", c.name, c.ms0);
  }
}

/* A JSON string (quotes, backslashes and control characters escaped). */
static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; s && *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
    else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
    else fputc(ch, f);
  }
  fputc('"', f);
}

/* A number, or null for NaN / infinity (JSON has neither). */
static void json_num(FILE *f, double x) {
  if (isfinite(x)) fprintf(f, "%.10g", x);
  else fputs("null", f);
}

/* Numbers as a JSON array (null: not measured). */
static void json_nums(FILE *f, const double *v, int n) {
  fputc('[', f);
  for (int i = 0; i < n; i++) {
    if (i) fputc(',', f);
    json_num(f, v[i]);
  }
  fputc(']', f);
}

/* Overrides as a JSON array of strings, one each (a value may hold spaces:
 * run.backends=fused, cudnn). */
static void json_list(FILE *f, const char *const *w, int n) {
  fputc('[', f);
  for (int i = 0; i < n; i++) {
    if (i) fputc(',', f);
    json_str(f, w[i]);
  }
  fputc(']', f);
}

void bench_write_json(const bench_result *r, FILE *f) {
  fprintf(f, "{\"tool\":\"stoke bench\",\"ini\":");
  json_str(f, r->ini);
  fprintf(f, ",\"overrides\":");
  json_list(f, r->common_ov, r->n_common_ov);
  fprintf(f, ",\"commit\":");
  json_str(f, r->commit);
  fprintf(f, ",\"date\":");
  json_str(f, r->date);
  fprintf(f, ",\"rounds\":%d,\"warmup_steps\":%d,\"timed_steps\":%d,\"timing\":", r->rounds, r->warmup, r->steps);
  json_str(f, r->gpu ? "device events" : "host clock");
  fprintf(f, ",\"variants\":[");
  for (int v = 0; v < r->n_variants; v++) {
    const bench_variant *x = &r->v[v];
    bench_spread s = bench_spread_of(x->rate, x->n);
    fprintf(f, "%s{\"name\":", v ? "," : "");
    json_str(f, x->name);
    fprintf(f, ",\"overrides\":");
    json_list(f, x->ov, x->n_ov);
    fprintf(f, ",\"device\":");
    json_str(f, x->device);
    fprintf(f, ",\"precision\":");
    json_str(f, x->precision);
    fprintf(f, ",\"batch\":%lld,\"samples_per_s\":", (long long)x->batch);
    json_nums(f, x->rate, x->n);
    fprintf(f, ",\"median\":");
    json_num(f, s.median);
    fprintf(f, ",\"min\":");
    json_num(f, s.min);
    fprintf(f, ",\"max\":");
    json_num(f, s.max);
    if (isfinite(bench_mean_finite(x->power_w, x->n))) { /* only where measured (a GPU with NVML) */
      fprintf(f, ",\"gpu_power_w\":");
      json_nums(f, x->power_w, x->n);
      fprintf(f, ",\"gpu_power_capped\":");
      json_nums(f, x->capped, x->n);
    }
    fprintf(f, ",\"first_loss\":");
    json_num(f, x->first_loss);
    fprintf(f, ",\"final_loss\":");
    json_num(f, x->final_loss);
    fputc('}', f);
  }
  fputc(']', f);
  bench_ratio q;
  if (ratio_of(r, &q)) {
    fprintf(f, ",\"ratio\":{\"b_over_a\":");
    json_num(f, q.ratio);
    fprintf(f, ",\"ci95\":[");
    json_num(f, q.lo);
    fputc(',', f);
    json_num(f, q.hi);
    fprintf(f, "],\"paired_rounds\":%d,\"method\":\"geometric mean of paired ratios, t-interval on their logs\"}",
            q.n);
  }
  bench_verdict vd;
  bench_verdict_of(r, &vd);
  fprintf(f, ",\"verdict\":");
  json_str(f, vd.line);
  fprintf(f, ",\"warnings\":[");
  for (int i = 0; i < vd.n_warn; i++) {
    if (i) fputc(',', f);
    json_str(f, vd.warn[i]);
  }
  fputc(']', f);
  if (r->per_op) {
    op_pair pairs[2 * BENCH_MAX_OPS];
    double total[2];
    int n = op_pairs(r, pairs, total);
    fprintf(f, ",\"per_op\":[");
    for (int k = 0; k < n; k++) {
      fprintf(f, "%s{\"op\":", k ? "," : "");
      json_str(f, pairs[k].t->op);
      fprintf(f, ",\"pass\":");
      json_str(f, pairs[k].t->pass);
      fprintf(f, ",\"engine\":");
      json_str(f, pairs[k].t->engine);
      for (int v = 0; v < r->n_variants; v++) {
        fprintf(f, ",\"nodes_%c\":%d,\"ms_%c\":", 'a' + v, pairs[k].nodes[v], 'a' + v);
        json_num(f, pairs[k].ms[v]);
      }
      fputc('}', f);
    }
    fputc(']', f);
  }
  fprintf(f, "}\n");
}

/* Text for a markdown table cell: pipes escaped. */
static void md_cell(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '|') fputc('\\', f);
    fputc(*s, f);
  }
}

void bench_write_md(const bench_result *r, FILE *f) {
  char a[32], b[32], c[32], d[32];
  fprintf(f, "| variant | overrides | device | precision | batch | samples/s median | min - max |\n");
  fprintf(f, "|---|---|---|---|---:|---:|---:|\n");
  for (int v = 0; v < r->n_variants; v++) {
    const bench_variant *x = &r->v[v];
    bench_spread s = bench_spread_of(x->rate, x->n);
    fprintf(f, "| %s | ", x->name);
    if (x->overrides[0]) {
      fputc('`', f);
      md_cell(f, x->overrides);
      fputc('`', f);
    } else {
      fprintf(f, "(as the INI file)");
    }
    fprintf(f, " | ");
    md_cell(f, x->device);
    fprintf(f, " | %s | %s | %s | %s - %s |\n", x->precision, commas((double)x->batch, a, sizeof a),
            commas(s.median, b, sizeof b), commas(s.min, c, sizeof c), commas(s.max, d, sizeof d));
  }
  fprintf(f, "\n");
  for (int v = 0; v < r->n_variants; v++) { /* where NVML measured it: the pace under a power limit */
    char pw[160];
    if (power_words(&r->v[v], pw, sizeof pw)) fprintf(f, "%s %s.\n", r->v[v].name, pw);
  }
  bench_ratio q;
  if (ratio_of(r, &q)) {
    if (q.n >= 2)
      fprintf(f, "B/A = %.3f (95%% CI %.3f - %.3f; t-interval on the log ratios of %d paired rounds).\n", q.ratio,
              q.lo, q.hi, q.n);
    else fprintf(f, "B/A = %.3f (one round, no confidence interval).\n", q.ratio);
  }
  bench_verdict vd;
  bench_verdict_of(r, &vd);
  if (vd.line[0]) fprintf(f, "Verdict: %s.\n", vd.line);
  for (int i = 0; i < vd.n_warn; i++) fprintf(f, "Warning: %s.\n", vd.warn[i]);
  fprintf(f, "`");
  md_cell(f, r->ini);
  if (r->common && r->common[0]) {
    fputc(' ', f);
    md_cell(f, r->common);
  }
  fprintf(f, "`; %d round%s%s, %d warm-up + %d timed steps each, timed with %s; commit %s, %s.\n", r->rounds,
          r->rounds == 1 ? "" : "s", r->n_variants == 2 ? " interleaved A B" : "", r->warmup, r->steps, timing(r),
          r->commit, r->date);
  if (!r->per_op) return;
  op_pair pairs[2 * BENCH_MAX_OPS];
  double total[2];
  int n = op_pairs(r, pairs, total);
  fprintf(f, "\n%s time per op, ms per step (%d profiled steps after the warm-up, one extra run per variant):\n\n",
          r->gpu ? "GPU" : "CPU", r->steps);
  if (r->n_variants == 2) fprintf(f, "| op (pass) [engine] | A | B | B - A |\n|---|---:|---:|---:|\n");
  else fprintf(f, "| op (pass) [engine] | A |\n|---|---:|\n");
  for (int k = 0; k <= n; k++) {
    op_cells c;
    op_row(pairs, n, total, k, "**total**", &c);
    if (r->n_variants == 2) fprintf(f, "| %s | %s | %s | %s |\n", c.name, c.ms0, c.ms1, c.ch);
    else fprintf(f, "| %s | %s |\n", c.name, c.ms0);
  }
}

/* ---------------------------------------------------------------- html */

/* The per-op rows of A and B matched by op, pass and engine: B - A in ms. */
static int op_changes(const bench_result *r, const char **labels, char (*buf)[96], double *d, int cap) {
  int n = 0;
  for (int v = 0; v < 2; v++)
    for (int i = 0; i < r->v[v].n_ops && n < cap; i++) {
      const stoke_op_time *o = &r->v[v].ops[i];
      char key[96];
      if (o->engine[0]) snprintf(key, sizeof key, "%s %s [%s]", o->op, o->pass, o->engine);
      else snprintf(key, sizeof key, "%s", o->op);
      int k = 0;
      while (k < n && strcmp(buf[k], key)) k++;
      if (k == n) {
        snprintf(buf[n], sizeof buf[n], "%s", key);
        labels[n] = buf[n];
        d[n++] = 0;
      }
      d[k] += v ? o->ms : -o->ms;
    }
  return n;
}

void bench_write_html(const bench_result *r, FILE *f) {
  char title[512];
  snprintf(title, sizeof title, "stoke bench %s", r->ini);
  stoke_html_head(f, title);
  fputs("<h1>", f);
  stoke_html_text(f, title);
  fputs("</h1>\n<p>", f);
  stoke_html_text(f, r->common);
  fprintf(f, " &middot; %d rounds%s, %d warm-up + %d timed steps each, timed with %s; commit ", r->rounds,
          r->n_variants > 1 ? " (A B interleaved)" : "", r->warmup, r->steps, r->gpu ? "device events" : "the host clock");
  stoke_html_text(f, r->commit);
  fputs(", ", f);
  stoke_html_text(f, r->date);
  fputs("</p>\n<table><tr><th>variant</th><th>overrides</th><th>device</th><th>precision</th><th>batch</th>"
        "<th>samples/s median</th><th>min - max</th></tr>\n", f);
  for (int v = 0; v < r->n_variants; v++) {
    const bench_variant *x = &r->v[v];
    bench_spread s = bench_spread_of(x->rate, x->n);
    fprintf(f, "<tr><td>%s</td><td>", x->name);
    stoke_html_text(f, x->overrides);
    fputs("</td><td>", f);
    stoke_html_text(f, x->device);
    fputs("</td><td>", f);
    stoke_html_text(f, x->precision);
    fprintf(f, "</td><td>%lld</td><td>%.0f</td><td>%.0f - %.0f</td></tr>\n", (long long)x->batch, s.median, s.min, s.max);
  }
  fputs("</table>\n", f);
  int n = r->v[0].n;
  double x[BENCH_MAX_ROUNDS], ratio[BENCH_MAX_ROUNDS];
  for (int i = 0; i < n; i++) x[i] = i + 1;
  stoke_svg_series s[2] = {{"A", "#4c78a8", r->v[0].rate, -1}, {"B", "#e45756", r->v[1].rate, -1}};
  stoke_svg_plot_x(f, "samples/s per round", "", "round", x, n, s, r->n_variants);
  if (r->n_variants > 1) {
    bench_ratio q = bench_ratio_paired(r->v[0].rate, r->v[1].rate, n < r->v[1].n ? n : r->v[1].n);
    fprintf(f, "<p><b>B/A = %.3f</b> (95%% CI %.3f - %.3f; t-interval on the log ratios of %d paired rounds)</p>\n",
            q.ratio, q.lo, q.hi, q.n);
    bench_verdict vd;
    bench_verdict_of(r, &vd);
    fputs("<p><b>Verdict:</b> ", f);
    stoke_html_text(f, vd.line);
    fputs("</p>\n", f);
    for (int i = 0; i < vd.n_warn; i++) {
      fputs("<p>Warning: ", f);
      stoke_html_text(f, vd.warn[i]);
      fputs("</p>\n", f);
    }
    double lo[BENCH_MAX_ROUNDS], hi[BENCH_MAX_ROUNDS];
    for (int i = 0; i < q.n; i++) ratio[i] = r->v[1].rate[i] / r->v[0].rate[i], lo[i] = q.lo, hi[i] = q.hi;
    stoke_svg_plot_x(f, "B/A per round", "", "round", x, q.n,
                     (stoke_svg_series[]){{"95% CI of B/A", "#54a24b", lo, 1}, {"", "#54a24b", hi, -1},
                                          {"B/A", "#222222", ratio, -1}},
                     3);
  }
  if (r->per_op && r->n_variants > 1) {
    const char *labels[2 * BENCH_MAX_OPS];
    static char buf[2 * BENCH_MAX_OPS][96];
    double d[2 * BENCH_MAX_OPS];
    int k = op_changes(r, labels, buf, d, 2 * BENCH_MAX_OPS);
    stoke_svg_bars(f, "per-op change, B - A", "ms per step", labels, d, k);
  }
  fputs("</body></html>\n", f);
}
