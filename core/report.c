/* core/report.c: out_dir/report.html: the summary, inline SVG plots of the
 * logged steps (loss, samples/s, step times, data wait, GPU, lr, loss
 * scale), memory by kind, the per-op table and the resolved config. One
 * file, no scripts, no network: it opens from disk in any browser. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/core.h"
#include "stoke/report.h"

void stoke_html_text(FILE *f, const char *s) {
  for (; s && *s; s++) {
    switch (*s) {
      case '&': fputs("&amp;", f); break;
      case '<': fputs("&lt;", f); break;
      case '>': fputs("&gt;", f); break;
      case '"': fputs("&quot;", f); break;
      default: fputc(*s, f);
    }
  }
}

/* ------------------------------------------------------------ plots */

enum { W = 640, H = 240, ML = 64, MR = 16, MT = 28, MB = 30 };

/* A round step for about n ticks over `range`: 1, 2 or 5 x 10^k. */
static double tick_step(double range, int n) {
  double raw = range / n, p = pow(10, floor(log10(raw))), m = raw / p;
  return p * (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10);
}

static void fmt_num(double v, char *b, size_t cap) {
  double a = fabs(v);
  if (v == 0) snprintf(b, cap, "0");
  else if (a >= 1e6 || a < 1e-3) snprintf(b, cap, "%.2g", v);
  else if (a >= 100) snprintf(b, cap, "%.0f", v);
  else snprintf(b, cap, "%.3g", v);
}

void stoke_svg_plot(FILE *f, const char *title, const char *unit, const double *x, int64_t n,
                    const stoke_svg_series *s, int ns) {
  stoke_svg_plot_x(f, title, unit, "step", x, n, s, ns);
}

void stoke_svg_plot_x(FILE *f, const char *title, const char *unit, const char *xlabel, const double *x, int64_t n,
                      const stoke_svg_series *s, int ns) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  int64_t points = 0;
  for (int64_t i = 0; i < n; i++)
    for (int k = 0; k < ns; k++)
      if (isfinite(s[k].y[i]) && isfinite(x[i])) {
        x0 = fmin(x0, x[i]), x1 = fmax(x1, x[i]);
        y0 = fmin(y0, s[k].y[i]), y1 = fmax(y1, s[k].y[i]);
        points++;
      }
  fputs("<figure>", f);
  if (!points) {
    fputs("<figcaption>", f);
    stoke_html_text(f, title);
    fputs("</figcaption><p class=\"none\">not measured in this run</p></figure>\n", f);
    return;
  }
  if (y0 > 0 && y0 < 0.5 * y1) y0 = 0; /* from zero unless that flattens the line */
  if (y1 - y0 < 1e-12 * fmax(1, fabs(y1))) y0 -= 0.5 * fmax(fabs(y0), 1e-9), y1 += 0.5 * fmax(fabs(y1), 1e-9);
  if (x1 <= x0) x0 -= 1, x1 += 1;
  double ts = tick_step(y1 - y0, 4);
  y0 = floor(y0 / ts) * ts, y1 = ceil(y1 / ts) * ts;
  double pw = W - ML - MR, ph = H - MT - MB;
#define PX(v) (ML + ((v) - x0) / (x1 - x0) * pw)
#define PY(v) (MT + (y1 - (v)) / (y1 - y0) * ph)
  fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
             "data-points=\"%lld\" role=\"img\"><title>", W, H, W, H, (long long)points);
  stoke_html_text(f, title);
  fputs("</title>\n<text x=\"8\" y=\"18\" class=\"t\">", f);
  stoke_html_text(f, title);
  if (unit && unit[0]) {
    fputs(" (", f);
    stoke_html_text(f, unit);
    fputs(")", f);
  }
  fputs("</text>\n", f);
  char b[32];
  for (double v = y0; v <= y1 + ts * 1e-6; v += ts) {
    fmt_num(fabs(v) < ts * 1e-9 ? 0 : v, b, sizeof b);
    fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" class=\"g\"/><text x=\"%d\" y=\"%.1f\" class=\"yl\">%s</text>\n",
            ML, W - MR, PY(v), PY(v), ML - 4, PY(v) + 4, b);
  }
  double xs = tick_step(x1 - x0, 6);
  if (xs < 1 && floor(x0) == x0 && floor(x1) == x1) xs = 1; /* whole x (steps, rounds): whole ticks */
  for (double v = ceil(x0 / xs) * xs; v <= x1 + xs * 1e-6; v += xs) {
    fmt_num(v, b, sizeof b);
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" class=\"xl\">%s</text>\n", PX(v), H - MB + 16, b);
  }
  fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"xl\">", W - MR - 12, H - 4);
  stoke_html_text(f, xlabel);
  fputs("</text>\n", f);
  for (int k = 0; k < ns; k++) { /* bands first, under the lines */
    int o = s[k].band_with;
    if (o < 0) continue;
    fprintf(f, "<path class=\"band\" fill=\"%s\" d=\"", s[k].color);
    int open = 0;
    int64_t start = 0;
    for (int64_t i = 0; i <= n; i++) {
      int ok = i < n && isfinite(s[k].y[i]) && isfinite(s[o].y[i]);
      if (ok && !open) open = 1, start = i;
      if (ok) fprintf(f, "%c%.1f,%.1f ", i == start ? 'M' : 'L', PX(x[i]), PY(s[k].y[i]));
      if (!ok && open) {
        for (int64_t j = i - 1; j >= start; j--) fprintf(f, "L%.1f,%.1f ", PX(x[j]), PY(s[o].y[j]));
        fputs("Z ", f);
        open = 0;
      }
    }
    fputs("\"/>\n", f);
  }
  for (int k = 0; k < ns; k++) {
    if (s[k].band_with >= 0) continue;
    fprintf(f, "<path class=\"line\" stroke=\"%s\" data-series=\"", s[k].color);
    stoke_html_text(f, s[k].name);
    fputs("\" d=\"", f);
    int pen = 0;
    for (int64_t i = 0; i < n; i++) {
      if (!isfinite(s[k].y[i]) || !isfinite(x[i])) {
        pen = 0;
        continue;
      }
      int alone = !pen && (i + 1 == n || !isfinite(s[k].y[i + 1]));
      fprintf(f, "%c%.1f,%.1f %s", pen ? 'L' : 'M', PX(x[i]), PY(s[k].y[i]), alone ? "h0.1 " : ""); /* a dot */
      pen = 1;
    }
    fputs("\"/>\n", f);
  }
  int named = 0;
  for (int k = 0; k < ns; k++) named += s[k].name[0] != 0;
  for (int k = 0, at = 0; k < ns; k++) { /* the legend, top right; unnamed series (a band's edge) are left out */
    if (!s[k].name[0]) continue;
    int lx = W - MR - 100 * (named - at++);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"4\" fill=\"%s\"%s/><text x=\"%d\" y=\"%d\" class=\"lg\">",
            lx, 12, s[k].color, s[k].band_with >= 0 ? " opacity=\"0.35\"" : "", lx + 18, 18);
    stoke_html_text(f, s[k].name);
    fputs("</text>\n", f);
  }
  fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\" class=\"frame\"/></svg></figure>\n", ML, MT, pw, ph);
#undef PX
#undef PY
}

void stoke_svg_bars(FILE *f, const char *title, const char *unit, const char *const *labels, const double *v, int n) {
  double mx = 0;
  for (int i = 0; i < n; i++)
    if (isfinite(v[i])) mx = fmax(mx, fabs(v[i]));
  int rh = 22, h = MT + rh * n + 8, lw = 220, bw = W - lw - 90;
  fprintf(f, "<figure><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
             "data-points=\"%d\" role=\"img\"><title>", W, h, W, h, n);
  stoke_html_text(f, title);
  fputs("</title>\n<text x=\"8\" y=\"18\" class=\"t\">", f);
  stoke_html_text(f, title);
  fputs(" (", f);
  stoke_html_text(f, unit);
  fputs(")</text>\n", f);
  double zero = lw; /* negative values (a change) grow left of the middle */
  int any_neg = 0;
  for (int i = 0; i < n; i++) any_neg |= v[i] < 0;
  if (any_neg) zero = lw + bw / 2.0, bw /= 2;
  for (int i = 0; i < n; i++) {
    double len = mx > 0 && isfinite(v[i]) ? fabs(v[i]) / mx * bw : 0;
    int y = MT + rh * i;
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"yl\">", lw - 6, y + 15);
    stoke_html_text(f, labels[i]);
    char b[32];
    fmt_num(v[i], b, sizeof b);
    fprintf(f, "</text><rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"16\" class=\"%s\"/>"
               "<text x=\"%.1f\" y=\"%d\" class=\"lg\">%s</text>\n",
            v[i] < 0 ? zero - len : zero, y + 2, len, v[i] < 0 ? "neg" : "bar",
            (v[i] < 0 ? zero : zero + len) + 4, y + 15, b);
  }
  fputs("</svg></figure>\n", f);
}

/* ------------------------------------------------------------- page */

static const char *style =
    "<style>body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1340px}"
    "h1{font-size:20px}h2{font-size:16px;margin-top:28px}figure{display:inline-block;margin:4px}"
    "svg{background:#fff;border:1px solid #ddd}.t{font-weight:600;font-size:13px}.yl{text-anchor:end;font-size:11px;fill:#555}"
    ".xl{text-anchor:middle;font-size:11px;fill:#555}.lg{font-size:11px}.g{stroke:#eee}"
    ".frame{fill:none;stroke:#999}.line{fill:none;stroke-width:1.6;stroke-linecap:round;stroke-linejoin:round}"
    ".band{opacity:.25;stroke:none}.bar{fill:#4c78a8}.neg{fill:#e45756}.none{color:#888}"
    "table{border-collapse:collapse}td,th{padding:2px 10px;border-bottom:1px solid #eee;text-align:left}"
    "pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:12px}</style>\n";

void stoke_html_head(FILE *f, const char *title) {
  fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>", f);
  stoke_html_text(f, title);
  fputs("</title>\n", f);
  fputs(style, f);
  fputs("</head><body>\n", f);
}

/* A file of the run folder as preformatted text (absent: a note). */
static void file_pre(FILE *f, const char *dir, const char *name, const char *heading) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *in = fopen(path, "r");
  if (!in) return;
  fprintf(f, "<h2>%s</h2><pre>", heading);
  char line[4096];
  while (fgets(line, sizeof line, in)) stoke_html_text(f, line);
  fclose(in);
  fputs("</pre>\n", f);
}

static void row_num(FILE *f, const char *name, double v, const char *fmt, const char *unit) {
  fputs("<tr><th>", f);
  stoke_html_text(f, name);
  fputs("</th><td>", f);
  if (isfinite(v)) {
    fprintf(f, fmt, v);
    fprintf(f, " %s", unit);
  } else {
    fputs("n/a", f);
  }
  fputs("</td></tr>\n", f);
}

/* Column `off` (a double field) of the rows. */
static double *column(const stoke_log_row *r, int64_t n, size_t off) {
  double *c = malloc(sizeof *c * (size_t)(n > 0 ? n : 1));
  if (!c) return NULL;
  for (int64_t i = 0; i < n; i++) c[i] = *(const double *)((const char *)&r[i] + off);
  return c;
}

#define COL(field) column(r->rows, n, offsetof(stoke_log_row, field))

static stoke_err *write_page(FILE *f, const stoke_report *r) {
  const stoke_summary *s = r->summary;
  int64_t n = r->n_rows, ne = r->n_evals;
  char title[512];
  snprintf(title, sizeof title, "stoke run %s", r->title);
  stoke_html_head(f, title);
  fputs("<h1>", f);
  stoke_html_text(f, title);
  fprintf(f, "</h1><p>%s: %lld steps, %lld samples on ", r->status, (long long)s->steps, (long long)s->samples);
  stoke_html_text(f, s->device);
  fputs(", precision ", f);
  stoke_html_text(f, s->precision);
  fputs(". Step times are device times (events on the compute stream; see the README).</p>\n", f);
  if (r->error) { /* a failed run: why, above its figures and curves (those up to the failure) */
    fputs("<p style=\"border:1px solid #c00;padding:6px\"><b>The run failed:</b> ", f);
    stoke_html_text(f, r->error);
    fputs("</p>\n", f);
  }
  fputs("<table>\n", f);
  row_num(f, "samples/s (median of logged intervals)", s->samples_per_s, "%.0f", "");
  row_num(f, "step time p50", s->step_ms_p50, "%.3f", "ms");
  row_num(f, "step time p95", s->step_ms_p95, "%.3f", "ms");
  row_num(f, "step time max", s->step_ms_max, "%.3f", "ms");
  row_num(f, "host launch time p50", s->host_ms_p50, "%.3f", "ms per step");
  row_num(f, "data wait", s->data_wait_s, "%.3f", "s total");
  row_num(f, "data wait in the first step (the loader's start)", s->data_wait_first_s, "%.3f", "s");
  row_num(f, "MFU", 100 * s->mfu, "%.1f", "%");
  row_num(f, "final loss", s->final_loss, "%.4f", "");
  row_num(f, "evaluation loss", s->eval_loss, "%.4f", "");
  row_num(f, "evaluation top-1 accuracy", s->eval_accuracy, "%.4f", "");
  row_num(f, "GPU utilization (mean)", s->gpu_util_mean, "%.0f", "%");
  row_num(f, "GPU memory used (max)", s->gpu_mem_max_mib, "%.0f", "MiB");
  if (isfinite(s->gpu_power_w)) { /* NVML's power counters: GPU runs only */
    row_num(f, "GPU power (mean)", s->gpu_power_w, "%.0f", "W");
    row_num(f, "GPU power limit", s->gpu_power_limit_w, "%.0f", "W");
    row_num(f, "time the power limit held the clocks down", 100 * s->gpu_power_capped, "%.0f", "%");
    row_num(f, "SM clock (mean)", s->gpu_sm_clock_mhz, "%.0f", "MHz");
  }
  fputs("</table>\n", f);
  if (r->trace_first > 0) {
    fprintf(f, "<p>Trace of steps %lld-%lld in trace.json (open it in ui.perfetto.dev). What tracing cost: the "
               "traced steps' median device step time ", (long long)r->trace_first, (long long)r->trace_last);
    if (isfinite(r->trace_ms) && isfinite(r->untraced_ms))
      fprintf(f, "%.3f ms against %.3f ms for the other steps (%+.1f%%).</p>\n", r->trace_ms, r->untraced_ms,
              100 * (r->trace_ms / r->untraced_ms - 1));
    else
      fputs("is not known (too few steps on one side).</p>\n", f);
    if (s->graph_replays)
      fputs("<p>The other steps replayed the step's CUDA graph; the traced steps ran eagerly, outside it, each kernel "
            "timed on its own: their per-op and step times are eager times (the same kernels and results).</p>\n", f);
  }
  fputs("<h2>Training</h2>\n", f);

  double *x = malloc(sizeof *x * (size_t)(n + ne + 1)), *loss = COL(loss), *lr = COL(lr), *rate = COL(samples_per_s),
         *ms = COL(step_ms), *p50 = COL(step_ms_p50), *p95 = COL(step_ms_p95), *mx = COL(step_ms_max),
         *host = COL(host_ms), *wait = COL(wait_ms), *util = COL(gpu_util), *mem = COL(gpu_mem_mib),
         *scale = COL(loss_scale), *ev = malloc(sizeof *ev * (size_t)(n + ne + 1)),
         *evx = malloc(sizeof *evx * (size_t)(n + ne + 1));
  stoke_err *e = NULL;
  if (!x || !loss || !lr || !rate || !ms || !p50 || !p95 || !mx || !host || !wait || !util || !mem || !scale || !ev || !evx) {
    e = STOKE_ERR(STOKE_E_OOM, "out of memory for the report");
    goto out;
  }
  for (int64_t i = 0; i < n; i++) x[i] = (double)r->rows[i].step;
  /* train and eval loss on one x axis: the rows' steps, then the evaluations' */
  double *lx = malloc(sizeof *lx * (size_t)(n + ne + 1)), *ltr = malloc(sizeof *ltr * (size_t)(n + ne + 1));
  if (!lx || !ltr) {
    free(lx), free(ltr);
    e = STOKE_ERR(STOKE_E_OOM, "out of memory for the report");
    goto out;
  }
  for (int64_t i = 0; i < n; i++) lx[i] = x[i], ltr[i] = loss[i], ev[i] = NAN;
  for (int64_t i = 0; i < ne; i++) lx[n + i] = (double)r->evals[i].step, ltr[n + i] = NAN, ev[n + i] = r->evals[i].loss;
  stoke_svg_plot(f, "loss", "", lx, n + ne,
                 (stoke_svg_series[]){{"train", "#4c78a8", ltr, -1}, {"eval", "#e45756", ev, -1}}, 2);
  free(lx), free(ltr);
  for (int64_t i = 0; i < ne; i++) evx[i] = (double)r->evals[i].step, ev[i] = r->evals[i].accuracy;
  if (ne) stoke_svg_plot(f, "evaluation top-1 accuracy", "", evx, ne, (stoke_svg_series[]){{"eval", "#e45756", ev, -1}}, 1);
  /* the speed plots leave out the first logged step (start-up: allocation,
   * autotuning, graph capture), as the summary does, when there are more */
  int k = n > 1; /* the first row is always the run's first step alone (run.c logs it) */
  stoke_svg_plot(f, "samples/s", "per logged interval, device time", x + k, n - k,
                 (stoke_svg_series[]){{"samples/s", "#4c78a8", rate + k, -1}}, 1);
  stoke_svg_plot(f, "step time", "ms, device", x + k, n - k,
                 (stoke_svg_series[]){{"p50-p95", "#4c78a8", p50 + k, 1}, {"p95", "#4c78a8", p95 + k, -1},
                                      {"mean", "#222222", ms + k, -1}, {"max", "#e45756", mx + k, -1}},
                 4);
  stoke_svg_plot(f, "host time per step", "ms", x + k, n - k,
                 (stoke_svg_series[]){{"data wait", "#f58518", wait + k, -1}, {"host launch", "#54a24b", host + k, -1}},
                 2);
  stoke_svg_plot(f, "learning rate", "", x, n, (stoke_svg_series[]){{"lr", "#4c78a8", lr, -1}}, 1);
  stoke_svg_plot(f, "loss scale", "fp16 scaler", x, n, (stoke_svg_series[]){{"scale", "#b279a2", scale, -1}}, 1);
  stoke_svg_plot(f, "GPU utilization", "%, NVML", x, n, (stoke_svg_series[]){{"utilization", "#54a24b", util, -1}}, 1);
  stoke_svg_plot(f, "GPU memory used", "MiB, NVML", x, n, (stoke_svg_series[]){{"memory", "#f58518", mem, -1}}, 1);
  if (r->plan) {
    const stoke_plan *p = r->plan;
    const char *labels[] = {"parameters", "gradients", "optimizer state", "activations", "buffers (running stats)",
                            "workspace (largest node's)"};
    double v[] = {p->bytes[STOKE_BUF_PARAMS] / 1048576.0, p->bytes[STOKE_BUF_GRADS] / 1048576.0,
                  p->opt_state_bytes / 1048576.0,         p->bytes[STOKE_BUF_ARENA] / 1048576.0,
                  p->bytes[STOKE_BUF_STATE] / 1048576.0,  p->workspace_bytes / 1048576.0};
    fputs("<h2>Memory of the plan</h2>\n", f);
    stoke_svg_bars(f, "memory by kind", "MiB", labels, v, 6);
  }
  file_pre(f, r->dir, "ops.txt", "Per-op time (profile_ops)");
  file_pre(f, r->dir, "config.ini", "Resolved config");
  file_pre(f, r->dir, "plan.txt", "Plan");
  fputs("</body></html>\n", f);
out:
  free(x), free(loss), free(lr), free(rate), free(ms), free(p50), free(p95), free(mx), free(host), free(wait);
  free(util), free(mem), free(scale), free(ev), free(evx);
  return e;
}

stoke_err *stoke_report_write(const char *path, const stoke_report *r) {
  char tmp[PATH_MAX];
  FILE *f;
  STOKE_PROPAGATE(stoke_write_begin(path, "report", tmp, sizeof tmp, &f));
  return stoke_write_end(f, tmp, path, "report", write_page(f, r));
}
