/* core/metrics.c: step metrics: JSON lines, progress bar / log lines, and
 * the run's closing summary with percentiles. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/core.h"
#include "stoke/metrics.h"
#include "stoke/report.h"
#include "stoke/tensorboard.h"

struct stoke_metrics {
  stoke_metrics_opts o;
  FILE *jsonl;
  stoke_tb *tb;        /* TensorBoard scalars, or NULL */
  stoke_log_row *rows; /* every logged step, for the report */
  int64_t n_rows, cap_rows;
  stoke_eval_row *evals;
  int64_t n_evals, cap_evals;
  double *step_ms;     /* every step's device time (stoke/steptime.h), in order */
  int64_t n, cap;
  int64_t interval_first; /* step_ms index of the interval's first step */
  double *host_ms;     /* every step's host time (launches), the data wait excluded */
  int64_t n_host, cap_host;
  double *rates;       /* samples/s of each logged interval */
  int64_t n_rates, cap_rates;
  double wait_total, wait_first, interval_wait, interval_host;
  int64_t interval_steps;
  double first_loss, last_loss, elapsed;
  int has_loss;
  double util_sum, mem_max;
  int64_t n_util;
  /* power (stoke_nvml_power) over the logged intervals after the first: energy, capped time, their span */
  double energy_j, capped_s, capped_span, power_s, clock_sum, clock_span;
  double scale, skipped; /* NaN without a scaler */
};

/* After a JSON line: whether it reached the file (a full disk, a file-size
 * limit), as an error naming it. */
static stoke_err *jsonl_flushed(stoke_metrics *m) {
  if (!m->jsonl) return NULL;
  if (fflush(m->jsonl) == 0 && !ferror(m->jsonl)) return NULL;
  return STOKE_ERR(STOKE_E_IO, "writing '%s' failed: %s (is the disk full?)", m->o.jsonl_path, strerror(errno));
}

/* A loss as printed: 4 decimals, or 4 significant digits with an exponent
 * once it is large (a diverging run's 1.1e+32 printed as 33 digits). */
static const char *loss_text(double v, char *buf, size_t cap) {
  snprintf(buf, cap, fabs(v) < 1e5 || !isfinite(v) ? "%.4f" : "%.4e", v);
  return buf;
}

/* A resume continues from the checkpoint's step, and the steps the first
 * part logged after it (it ran on past its last save, then crashed) are
 * run again: their lines (steps and evaluations, {"step": N, ...} with N
 * past start_step) leave the file, written whole or not at all, so each
 * step has one line. */
/* A line's length with its newline. */
static size_t line_len(const char *p) {
  size_t n = strcspn(p, "\n");
  return n + (p[n] == '\n');
}

/* A step's or an evaluation's line after start_step. */
static int redone(const char *line, int64_t start_step) {
  long long step;
  return sscanf(line, "{\"step\": %lld,", &step) == 1 && step > start_step;
}

static stoke_err *drop_redone(const char *path, int64_t start_step) {
  char *text = NULL;
  size_t n = 0;
  stoke_err *e = stoke_read_file(path, "metrics", &text, &n);
  if (e) {
    int none = e->code == STOKE_E_NOT_FOUND;
    stoke_err_free(e);
    return none ? NULL : STOKE_ERR(STOKE_E_IO, "cannot read '%s' to continue it", path);
  }
  int64_t dropped = 0;
  for (const char *p = text; *p; p += line_len(p)) dropped += redone(p, start_step);
  if (!dropped) {
    free(text);
    return NULL;
  }
  char tmp[4200];
  FILE *f = NULL;
  e = stoke_write_begin(path, "metrics", tmp, sizeof tmp, &f);
  for (const char *p = text; !e && *p; p += line_len(p))
    if (!redone(p, start_step)) fwrite(p, 1, line_len(p), f);
  if (!e) e = stoke_write_end(f, tmp, path, "metrics", NULL);
  free(text);
  if (!e)
    stoke_log(STOKE_LOG_INFO, "metrics", "%s: %lld lines of steps after %lld left out: the checkpoint is at step "
              "%lld, and this run does them again", path, (long long)dropped, (long long)start_step,
              (long long)start_step);
  return e;
}

stoke_err *stoke_metrics_new(const stoke_metrics_opts *o, stoke_metrics **out) {
  if (o->jsonl_path && o->start_step > 0) STOKE_PROPAGATE(drop_redone(o->jsonl_path, o->start_step));
  stoke_metrics *m = calloc(1, sizeof *m);
  if (!m) return STOKE_ERR(STOKE_E_OOM, "out of memory");
  m->o = *o;
  m->first_loss = m->last_loss = NAN;
  m->scale = m->skipped = NAN;
  /* a resumed run (start_step > 0) continues the file its first part wrote, as log.txt does */
  if (o->jsonl_path && !(m->jsonl = fopen(o->jsonl_path, o->start_step > 0 ? "a" : "w"))) {
    free(m);
    return STOKE_ERR(STOKE_E_IO, "cannot write metrics to '%s': %s", o->jsonl_path, strerror(errno));
  }
  stoke_err *e = o->tensorboard_dir ? stoke_tb_open(o->tensorboard_dir, &m->tb) : NULL;
  if (e) {
    stoke_metrics_free(m);
    return stoke_err_wrap(e, __FILE__, __LINE__, "[run] tensorboard");
  }
  *out = m;
  return NULL;
}

void stoke_metrics_free(stoke_metrics *m) {
  if (!m) return;
  if (m->jsonl) fclose(m->jsonl);
  stoke_tb_close(m->tb);
  free(m->rows);
  free(m->evals);
  free(m->step_ms);
  free(m->host_ms);
  free(m->rates);
  free(m);
}

/* A number for JSON in `fmt`: NaN and infinities (no value) are null. */
static const char *json_fmt(double v, const char *fmt, char *buf, size_t cap) {
  if (isfinite(v)) snprintf(buf, cap, fmt, v);
  else snprintf(buf, cap, "null");
  return buf;
}
static const char *json_num(double v, char *buf, size_t cap) { return json_fmt(v, "%.6g", buf, cap); }

static void push(double **v, int64_t *n, int64_t *cap, double x) {
  if (*n == *cap) {
    int64_t c = *cap ? 2 * *cap : 256;
    double *nv = realloc(*v, sizeof(double) * (size_t)c);
    if (!nv) return; /* statistics lose a point, training goes on */
    *v = nv;
    *cap = c;
  }
  (*v)[(*n)++] = x;
}

/* Append one element to a growable array; a failed allocation loses it. */
static void grow_push(void **v, int64_t *n, int64_t *cap, const void *x, size_t size) {
  if (*n == *cap) {
    int64_t c = *cap ? 2 * *cap : 64;
    void *nv = realloc(*v, size * (size_t)c);
    if (!nv) return;
    *v = nv;
    *cap = c;
  }
  memcpy((char *)*v + size * (size_t)(*n)++, x, size);
}

static void fmt_eta(double s, char *buf, size_t cap) {
  if (!isfinite(s) || s < 0) s = 0;
  long t = (long)(s + 0.5);
  if (t >= 3600) snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

void stoke_metrics_device(stoke_metrics *m, const double *ms, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    push(&m->step_ms, &m->n, &m->cap, ms[i]);
    m->elapsed += 1e-3 * ms[i];
  }
}

stoke_err *stoke_metrics_collect(stoke_metrics *m, stoke_steptime *t) {
  const double *ms;
  int64_t n;
  STOKE_PROPAGATE(stoke_steptime_read(t, &ms, &n));
  stoke_metrics_device(m, ms, n);
  return NULL;
}

double stoke_metrics_last_ms(const stoke_metrics *m) { return m->n > 0 ? m->step_ms[m->n - 1] : NAN; }

static double percentile_of(const double *v, int64_t n, double pct) {
  double *tmp = n > 0 ? malloc(sizeof(double) * (size_t)n) : NULL;
  if (!tmp) return NAN;
  memcpy(tmp, v, sizeof(double) * (size_t)n);
  double p = stoke_percentile(tmp, n, pct);
  free(tmp);
  return p;
}

static double max_of(const double *v, int64_t n) {
  double x = NAN;
  for (int64_t i = 0; i < n; i++)
    if (!(v[i] <= x)) x = v[i];
  return x;
}

stoke_err *stoke_metrics_step(stoke_metrics *m, int64_t step, int64_t epoch, double host_s,
                              double wait_s, int logged, double loss, double lr) {
  push(&m->host_ms, &m->n_host, &m->cap_host, 1e3 * host_s);
  m->interval_host += host_s;
  m->interval_wait += wait_s;
  m->wait_total += wait_s;
  if (step == m->o.start_step + 1) m->wait_first = wait_s; /* this run's first step (a resume's too) */
  m->interval_steps++;
  if (!logged) return NULL;
  /* the interval's steps as the device ran them (stoke_metrics_device came first) */
  const double *dev = m->step_ms + m->interval_first;
  int64_t n_dev = m->n - m->interval_first;
  double dev_ms = 0;
  for (int64_t i = 0; i < n_dev; i++) dev_ms += dev[i];
  double step_ms = n_dev > 0 ? dev_ms / (double)n_dev : NAN;
  double p50 = percentile_of(dev, n_dev, 50), p95 = percentile_of(dev, n_dev, 95), mx = max_of(dev, n_dev);
  double rate = dev_ms > 0 ? (double)(n_dev * m->o.samples_per_step) / (1e-3 * dev_ms) : 0;
  /* the first step carries start-up costs (allocation, autotuning, graph
   * capture): the interval it ends alone is kept out of the median */
  if (step > m->o.start_step + 1) push(&m->rates, &m->n_rates, &m->cap_rates, rate);
  if (!m->has_loss) m->first_loss = loss;
  m->has_loss = 1;
  m->last_loss = loss;
  double host_ms = 1e3 * m->interval_host / (double)m->interval_steps;
  double wait_ms = 1e3 * m->interval_wait / (double)m->interval_steps;
  double mfu = m->o.peak_flops > 0 && step_ms > 0 ? m->o.flops_per_step / (step_ms * 1e-3) / m->o.peak_flops : NAN;
  double util = NAN, mem = NAN;
  if (m->o.nvml && stoke_nvml_sample(m->o.nvml, &util, &mem) == 0) {
    m->util_sum += util;
    m->n_util++;
    if (mem > m->mem_max) m->mem_max = mem;
  }
  /* the first call starts the sampler (its first reading, about now: the first logged interval, start-up,
   * stays out, as it does of the samples/s median); each figure after covers a second or more; all NaN
   * without NVML */
  stoke_power_sample pw;
  stoke_nvml_power(m->o.nvml, &pw);
  if (isfinite(pw.power_w)) {
    m->energy_j += pw.power_w * pw.span_s;
    m->power_s += pw.span_s;
    if (isfinite(pw.capped)) m->capped_s += pw.capped * pw.span_s, m->capped_span += pw.span_s;
    if (isfinite(pw.sm_mhz)) m->clock_sum += pw.sm_mhz * pw.span_s, m->clock_span += pw.span_s;
  }
  if (m->jsonl) {
    char a[32], b[32], c[32], d[32], e[32], f[32], g[32], h[32], k[32], pa[32], pb[32], pc[32];
    fprintf(m->jsonl,
            "{\"step\": %lld, \"epoch\": %lld, \"loss\": %.6g, \"lr\": %.6g, \"samples_per_s\": %.1f, "
            "\"step_time_ms\": %s, \"step_time_ms_p50\": %s, \"step_time_ms_p95\": %s, \"step_time_ms_max\": %s, "
            "\"host_ms\": %.4f, \"data_wait_ms\": %.4f, \"mfu\": %s, \"gpu_util\": %s, \"gpu_mem_mib\": %s, "
            "\"gpu_power_w\": %s, \"gpu_power_capped\": %s, \"gpu_sm_clock_mhz\": %s, "
            "\"loss_scale\": %s, \"skipped_steps\": %s}\n",
            (long long)step, (long long)epoch, loss, lr, rate, json_num(step_ms, f, sizeof f),
            json_num(p50, g, sizeof g), json_num(p95, h, sizeof h), json_num(mx, k, sizeof k), host_ms, wait_ms,
            json_num(mfu, a, sizeof a), json_num(util, b, sizeof b), json_num(mem, c, sizeof c),
            json_num(pw.power_w, pa, sizeof pa), json_num(pw.capped, pb, sizeof pb), json_num(pw.sm_mhz, pc, sizeof pc),
            json_num(m->scale, d, sizeof d), json_num(m->skipped, e, sizeof e));
  }
  double eta = (double)(m->o.total_steps - step) * m->elapsed / (double)(m->n > 0 ? m->n : 1);
  char eta_s[32];
  fmt_eta(eta, eta_s, sizeof eta_s);
  if (m->o.progress == STOKE_PROGRESS_BAR) {
    int width = 24, done = (int)((double)width * (double)step / (double)m->o.total_steps);
    char bar[32];
    for (int i = 0; i < width; i++) bar[i] = i < done ? '=' : i == done ? '>' : ' ';
    bar[width] = 0;
    char lt[32];
    fprintf(stderr, "\r step %lld/%lld [%s] loss %s  %.0f samples/s  step %.3f ms  data-wait %.2f ms  ETA %s   ",
            (long long)step, (long long)m->o.total_steps, bar, loss_text(loss, lt, sizeof lt), rate, step_ms, wait_ms,
            eta_s);
    if (step == m->o.total_steps) fputc('\n', stderr);
    fflush(stderr);
  } else if (m->o.progress == STOKE_PROGRESS_LINES) {
    char lt[32];
    printf("step %lld/%lld  epoch %lld  loss %s  lr %.4g  %.0f samples/s  step %.3f ms (p50 %.3f, p95 %.3f, "
           "max %.3f)  host %.3f ms  data-wait %.3f ms  ETA %s\n",
           (long long)step, (long long)m->o.total_steps, (long long)epoch, loss_text(loss, lt, sizeof lt), lr, rate,
           step_ms, p50, p95, mx, host_ms, wait_ms, eta_s);
    fflush(stdout);
  }
  m->interval_host = m->interval_wait = 0;
  m->interval_steps = 0;
  m->interval_first = m->n;
  stoke_log_row row = {step, loss, lr, rate, step_ms, p50, p95, mx, host_ms, wait_ms, mfu, util, mem, m->scale};
  grow_push((void **)&m->rows, &m->n_rows, &m->cap_rows, &row, sizeof row);
  if (m->tb) {
    static const char *const tags[] = {"train/loss",          "train/lr",           "perf/samples_per_s",
                                       "perf/step_time_ms",   "perf/step_time_ms_p50", "perf/step_time_ms_p95",
                                       "perf/step_time_ms_max", "perf/host_ms",     "perf/data_wait_ms",
                                       "perf/mfu",            "gpu/utilization",    "gpu/memory_mib",
                                       "train/loss_scale",    "train/skipped_steps", "gpu/power_w",
                                       "gpu/power_capped",    "gpu/sm_clock_mhz"};
    const double v[] = {loss, lr,      rate,      step_ms,  p50,        p95,        mx,       host_ms,
                        wait_ms,       mfu,       util,     mem,        m->scale,   m->skipped, pw.power_w,
                        pw.capped,     pw.sm_mhz};
    STOKE_PROPAGATE(stoke_tb_scalars(m->tb, step, tags, v, (int)(sizeof v / sizeof *v)));
  }
  return jsonl_flushed(m);
}

void stoke_metrics_scaler(stoke_metrics *m, double scale, double skipped) {
  m->scale = scale;
  m->skipped = skipped;
}

/* acc NaN: no accuracy (a language model's evaluation reports the loss). */
stoke_err *stoke_metrics_eval(stoke_metrics *m, int64_t step, int64_t epoch, double loss, double acc) {
  char ja[32], jb[32];
  if (m->jsonl)
    fprintf(m->jsonl, "{\"step\": %lld, \"epoch\": %lld, \"eval_loss\": %s, \"eval_accuracy\": %s}\n",
            (long long)step, (long long)epoch, json_num(loss, ja, sizeof ja), json_num(acc, jb, sizeof jb));
  stoke_eval_row row = {step, loss, acc};
  grow_push((void **)&m->evals, &m->n_evals, &m->cap_evals, &row, sizeof row);
  if (m->tb) {
    static const char *const tags[] = {"eval/loss", "eval/accuracy"};
    const double v[] = {loss, acc};
    STOKE_PROPAGATE(stoke_tb_scalars(m->tb, step, tags, v, 2));
  }
  if (m->o.progress == STOKE_PROGRESS_BAR) fputc('\n', stderr);
  if (m->o.progress != STOKE_PROGRESS_OFF) {
    printf("eval after step %lld (epoch %lld): loss %.4f", (long long)step, (long long)epoch, loss);
    if (acc == acc) printf(", top-1 accuracy %.4f", acc);
    printf("\n");
    fflush(stdout);
  }
  return jsonl_flushed(m);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double stoke_percentile(double *v, int64_t n, double pct) {
  if (n <= 0) return NAN;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  double pos = pct / 100.0 * (double)(n - 1);
  int64_t lo = (int64_t)floor(pos), hi = lo + 1 < n ? lo + 1 : lo;
  return v[lo] + (v[hi] - v[lo]) * (pos - (double)lo);
}

void stoke_metrics_summary(stoke_metrics *m, stoke_summary *s) {
  /* step-time percentiles leave out the first step (start-up) when there are more */
  int64_t skip = m->n > 1 ? 1 : 0;
  s->step_ms_p50 = percentile_of(m->step_ms + skip, m->n - skip, 50);
  s->step_ms_p95 = percentile_of(m->step_ms + skip, m->n - skip, 95);
  s->step_ms_max = max_of(m->step_ms + skip, m->n - skip);
  skip = m->n_host > 1 ? 1 : 0;
  s->host_ms_p50 = percentile_of(m->host_ms + skip, m->n_host - skip, 50);
  if (m->n_rates > 0) s->samples_per_s = percentile_of(m->rates, m->n_rates, 50);
  else if (m->elapsed > 0) s->samples_per_s = (double)(m->n * m->o.samples_per_step) / m->elapsed;
  /* the bench's window: the same device times, summed */
  int64_t w0 = m->o.time_warmup, w1 = m->o.time_warmup + m->o.time_steps;
  if (m->o.time_steps > 0 && m->n >= w1) {
    s->timed_ms = 0;
    for (int64_t i = w0; i < w1; i++) s->timed_ms += m->step_ms[i];
  }
  s->first_loss = m->first_loss;
  s->final_loss = m->last_loss;
  s->data_wait_s = m->wait_total;
  s->data_wait_first_s = m->wait_first;
  s->peak_flops = m->o.peak_flops;
  s->mfu = m->o.peak_flops > 0 && s->samples_per_s > 0
               ? m->o.flops_per_step * s->samples_per_s / (double)m->o.samples_per_step / m->o.peak_flops
               : NAN;
  s->gpu_util_mean = m->n_util ? m->util_sum / (double)m->n_util : NAN;
  s->gpu_mem_max_mib = m->n_util ? m->mem_max : NAN;
  s->gpu_power_w = m->power_s > 0 ? m->energy_j / m->power_s : NAN;
  s->gpu_power_capped = m->capped_span > 0 ? m->capped_s / m->capped_span : NAN;
  s->gpu_sm_clock_mhz = m->clock_span > 0 ? m->clock_sum / m->clock_span : NAN;
  stoke_nvml_power_limits(m->o.nvml, &s->gpu_power_limit_w, &s->gpu_sm_clock_max_mhz); /* NaN without NVML */
  s->loss_scale = m->scale;
  s->skipped_steps = m->skipped;
}

/* run.trace's cost, measured: the median device time of the traced steps
 * against that of the others (the first step left out). */
static void trace_cost(const stoke_metrics *m, double *traced, double *untraced) {
  *traced = *untraced = NAN;
  if (m->o.trace_first <= 0 || m->n < 2) return;
  double *a = malloc(sizeof *a * (size_t)m->n), *b = malloc(sizeof *b * (size_t)m->n);
  int64_t na = 0, nb = 0;
  for (int64_t i = 1; a && b && i < m->n; i++) {
    int64_t step = m->o.start_step + i + 1;
    if (step >= m->o.trace_first && step <= m->o.trace_last) a[na++] = m->step_ms[i];
    else b[nb++] = m->step_ms[i];
  }
  if (na && nb) *traced = stoke_percentile(a, na, 50), *untraced = stoke_percentile(b, nb, 50);
  free(a);
  free(b);
}

/* out_dir/report.html of the run so far (error: a failed run's message,
 * above its figures; NULL for none); nothing without a report_dir. */
static stoke_err *write_report(const stoke_metrics *m, const stoke_summary *s, const char *status, const char *error) {
  if (!m->o.report_dir) return NULL;
  char path[4096];
  snprintf(path, sizeof path, "%s/report.html", m->o.report_dir);
  stoke_report r = {m->o.run_name ? m->o.run_name : "", status, m->o.report_dir, m->rows, m->n_rows, m->evals,
                    m->n_evals, s, m->o.plan, m->o.trace_first, m->o.trace_last, NAN, NAN, error};
  trace_cost(m, &r.trace_ms, &r.untraced_ms);
  return stoke_report_write(path, &r);
}

/* A run that failed: its last line says so, with the error's text (JSON-escaped),
 * and report.html shows it above the figures and curves up to the failure
 * (a report of an earlier run in out_dir would otherwise stay). */
void stoke_metrics_error(stoke_metrics *m, const stoke_summary *base, int64_t steps_done, const char *msg) {
  if (!m) return;
  if (base) {
    stoke_summary s = *base;
    stoke_metrics_summary(m, &s);
    s.steps = steps_done;
    stoke_err_free(write_report(m, &s, "failed", msg)); /* the error that stopped the run is the one to report */
  }
  if (!m->jsonl) return;
  fprintf(m->jsonl, "{\"summary\": \"error\", \"steps_done\": %lld, \"message\": \"", (long long)steps_done);
  for (const unsigned char *c = (const unsigned char *)msg; *c; c++) {
    if (*c == '"' || *c == '\\') fprintf(m->jsonl, "\\%c", *c);
    else if (*c == '\n') fputs("\\n", m->jsonl);
    else if (*c < 0x20) fprintf(m->jsonl, "\\u%04x", *c);
    else fputc(*c, m->jsonl);
  }
  fputs("\"}\n", m->jsonl);
  fflush(m->jsonl);
}

stoke_err *stoke_metrics_close(stoke_metrics *m, const stoke_summary *s, const char *status) {
  /* no step logged (a signal during step 1, a resume with nothing to train): the loss is NaN, written null */
  char a[32], b[32], c[32], d[32], e[32], f[32], g[32], h[32], k[32], m_[32], fl[32], rate[32], pw[5][32];
  if (m->jsonl)
    fprintf(m->jsonl,
            "{\"summary\": \"%s\", \"steps\": %lld, \"samples\": %lld, \"final_loss\": %s, "
            "\"samples_per_s_median\": %s, \"step_time_ms_p50\": %s, \"step_time_ms_p95\": %s, "
            "\"step_time_ms_max\": %s, \"host_ms_p50\": %s, \"data_wait_s\": %.4f, \"data_wait_first_s\": %.4f, "
            "\"flops_per_step\": %.6g, "
            "\"skipped_samples\": %lld, \"bad_samples\": %lld, "
            "\"eval_loss\": %s, \"eval_accuracy\": %s, \"mfu\": %s, \"gpu_util_mean\": %s, "
            "\"gpu_mem_max_mib\": %s, \"gpu_power_w_mean\": %s, \"gpu_power_limit_w\": %s, "
            "\"gpu_power_capped\": %s, \"gpu_sm_clock_mhz_mean\": %s, \"gpu_sm_clock_mhz_max\": %s, "
            "\"device_alloc_mib\": %s, \"gpu_ops_per_step\": %lld, "
            "\"launches_per_step\": %lld, \"cuda_graph_replays\": %lld}\n",
            status, (long long)s->steps, (long long)s->samples, json_num(s->final_loss, fl, sizeof fl),
            json_fmt(s->samples_per_s, "%.1f", rate, sizeof rate),
            json_num(s->step_ms_p50, f, sizeof f), json_num(s->step_ms_p95, g, sizeof g),
            json_num(s->step_ms_max, h, sizeof h), json_num(s->host_ms_p50, k, sizeof k), s->data_wait_s, s->data_wait_first_s, s->flops_per_step, (long long)s->skipped_samples,
            (long long)s->bad_samples, json_num(s->eval_loss, a, sizeof a), json_num(s->eval_accuracy, b, sizeof b),
            json_num(s->mfu, c, sizeof c), json_num(s->gpu_util_mean, d, sizeof d),
            json_num(s->gpu_mem_max_mib, e, sizeof e), json_num(s->gpu_power_w, pw[0], sizeof pw[0]),
            json_num(s->gpu_power_limit_w, pw[1], sizeof pw[1]), json_num(s->gpu_power_capped, pw[2], sizeof pw[2]),
            json_num(s->gpu_sm_clock_mhz, pw[3], sizeof pw[3]), json_num(s->gpu_sm_clock_max_mhz, pw[4], sizeof pw[4]),
            json_num(s->dev_alloc_mib, m_, sizeof m_),
            (long long)s->gpu_ops_per_step,
            (long long)s->launches_per_step, (long long)s->graph_replays);
  stoke_err *err = jsonl_flushed(m);
  if (!err) err = write_report(m, s, status, NULL);
  if (m->o.quiet || err) return err;
  if (!s->samples && !m->n_rows) { /* a resume at or past the run's end: no step ran, no figure to print */
    printf("summary (%s): %lld steps, none of them run now (the checkpoint's step is the run's last: raise [run] "
           "steps or epochs to continue)\n",
           status, (long long)s->steps);
    goto files;
  }
  char ran[64] = "", lf[32], l0[32];
  if (m->o.start_step > 0) /* a resume: the steps count from the start, the samples and times are this run's */
    snprintf(ran, sizeof ran, " (%lld of them in this run)", (long long)(s->steps - m->o.start_step));
  printf("summary (%s): %lld steps%s, %lld samples, final loss %s (first %s)\n"
         "  samples/s median %.0f, step time p50 %.3f ms, p95 %.3f ms, max %.3f ms (device)\n"
         "  host launch time p50 %.3f ms per step, data wait %.3f s total (%.3f s of it in the first step: the "
         "loader's start)\n",
         status, (long long)s->steps, ran, (long long)s->samples, loss_text(s->final_loss, lf, sizeof lf),
         loss_text(s->first_loss, l0, sizeof l0),
         s->samples_per_s, s->step_ms_p50, s->step_ms_p95, s->step_ms_max, s->host_ms_p50, s->data_wait_s,
         s->data_wait_first_s);
  if (isfinite(s->mfu))
    printf("  MFU %.1f%% of %.0f TFLOP/s (datasheet peak for the precision), %.4g FLOPs per step\n",
           100 * s->mfu, s->peak_flops / 1e12, s->flops_per_step);
  else
    printf("  MFU n/a (no known peak for this device), %.4g FLOPs per step\n", s->flops_per_step);
  if (isfinite(s->loss_scale))
    printf("  loss scale %g, %.0f steps skipped for inf/NaN gradients\n", s->loss_scale, s->skipped_steps);
  if (isfinite(s->gpu_util_mean))
    printf("  GPU utilization %.0f%% (mean of samples), memory used up to %.0f MiB\n", s->gpu_util_mean,
           s->gpu_mem_max_mib);
  if (isfinite(s->gpu_power_w)) {
    printf("  GPU power %.0f W on average", s->gpu_power_w);
    if (isfinite(s->gpu_power_limit_w))
      printf(" (%.0f%% of its %.0f W limit)", 100 * s->gpu_power_w / s->gpu_power_limit_w, s->gpu_power_limit_w);
    if (isfinite(s->gpu_power_capped))
      printf(", the clocks held down by that limit %.0f%% of the time", 100 * s->gpu_power_capped);
    if (isfinite(s->gpu_sm_clock_mhz))
      printf("; SM clock %.0f MHz (mean%s", s->gpu_sm_clock_mhz, isfinite(s->gpu_sm_clock_max_mhz) ? "" : ")");
    if (isfinite(s->gpu_sm_clock_mhz) && isfinite(s->gpu_sm_clock_max_mhz))
      printf(", maximum %.0f)", s->gpu_sm_clock_max_mhz);
    printf("\n");
  }
  if (isfinite(s->dev_alloc_mib))
    printf("  device memory allocated by stoke %.0f MiB (%.2f GB), held through every step: its peak\n",
           s->dev_alloc_mib, s->dev_alloc_mib * 1048576.0 / 1e9);
  if (s->gpu_ops_per_step)
    printf("  %lld GPU operations per step, %lld launch%s per step\n", (long long)s->gpu_ops_per_step,
           (long long)s->launches_per_step, s->launches_per_step == 1 ? " (CUDA graph)" : "es");
  if (s->graph_replays)
    printf("  %lld micro-batches replayed the CUDA graph (the first%s ran eagerly)\n", (long long)s->graph_replays,
           m->o.trace_first > 0 ? " and the traced steps" : "");
  if (s->eval_accuracy == s->eval_accuracy)
    printf("  evaluation: loss %.4f, top-1 accuracy %.4f over %lld samples\n", s->eval_loss, s->eval_accuracy,
           (long long)s->eval_samples);
  else if (s->eval_loss == s->eval_loss)
    printf("  evaluation: loss %.4f (%.4f bits per token) over %lld sequences\n", s->eval_loss, s->eval_loss / log(2.0),
           (long long)s->eval_samples);
  if (s->skipped_samples)
    printf("  %lld samples could not be used (each named once in log.txt); replaced %lld times, by reason:%s\n",
           (long long)s->bad_samples, (long long)s->skipped_samples, s->skip_reasons);
files:
  printf("  metrics: %s/metrics.jsonl\n", s->out_dir);
  if (m->o.report_dir) printf("  report: %s/report.html (open it in a browser)\n", m->o.report_dir);
  if (m->tb) printf("  TensorBoard: %s (tensorboard --logdir on its folder)\n", stoke_tb_path(m->tb));
  double traced, untraced;
  trace_cost(m, &traced, &untraced);
  if (m->o.trace_first > 0)
    printf("  trace of steps %lld-%lld: %s/trace.json (ui.perfetto.dev); traced steps' median %.3f ms against "
           "%.3f ms untraced (%+.1f%%)\n",
           (long long)m->o.trace_first, (long long)m->o.trace_last, s->out_dir, traced, untraced,
           100 * (traced / untraced - 1));
  if (s->checkpoint[0]) printf("  checkpoint: %s (continue with run.resume=%s)\n", s->checkpoint, s->checkpoint);
  fflush(stdout);
  return NULL;
}
