/* stoke/report.h: out_dir/report.html, one self-contained page per run:
 * summary, inline SVG plots of the logged steps, memory, config. */
#ifndef STOKE_REPORT_H
#define STOKE_REPORT_H

#include <stdio.h>

#include "stoke/graph.h"
#include "stoke/run.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One logged step, as metrics.jsonl has it (NaN: not measured). */
typedef struct stoke_log_row {
  int64_t step;
  double loss, lr, samples_per_s;
  double step_ms, step_ms_p50, step_ms_p95, step_ms_max; /* the interval's device step times */
  double host_ms, wait_ms, mfu, gpu_util, gpu_mem_mib, loss_scale;
} stoke_log_row;

typedef struct stoke_eval_row {
  int64_t step;
  double loss, accuracy;
} stoke_eval_row;

typedef struct stoke_report {
  const char *title;            /* the run's name */
  const char *status;           /* "done", "interrupted" */
  const char *dir;              /* out_dir: config.ini, plan.txt and ops.txt are read from it */
  const stoke_log_row *rows;
  int64_t n_rows;
  const stoke_eval_row *evals;
  int64_t n_evals;
  const stoke_summary *summary;
  const stoke_plan *plan;       /* memory by kind; NULL: left out */
  int64_t trace_first, trace_last; /* run.trace's steps (0: none) */
  double trace_ms, untraced_ms;    /* their median device step time, and the other steps' (first left out) */
  const char *error;               /* a failed run's error message; NULL: none */
} stoke_report;

/* Writes the page to `path` (through a temporary file and a rename). */
stoke_err *stoke_report_write(const char *path, const stoke_report *r);

/* One line plot as inline SVG (the report's and tools/bench's): x against
 * each series' y; NaN values break a line. A band fills between two
 * series (lo, hi). Writes a note instead when nothing was measured. */
typedef struct stoke_svg_series {
  const char *name, *color; /* name "": not in the legend */
  const double *y;
  int band_with; /* >= 0: fill between this series and series[band_with] */
} stoke_svg_series;
void stoke_svg_plot(FILE *f, const char *title, const char *unit, const double *x, int64_t n,
                    const stoke_svg_series *s, int ns);
/* The same with its own x axis label (stoke_svg_plot's is "step"). */
void stoke_svg_plot_x(FILE *f, const char *title, const char *unit, const char *xlabel, const double *x, int64_t n,
                      const stoke_svg_series *s, int ns);
/* Horizontal bars (label, value), e.g. memory by kind or time per op. */
void stoke_svg_bars(FILE *f, const char *title, const char *unit, const char *const *labels, const double *v, int n);
/* A page's head (title, the report's style sheet) up to <body>. */
void stoke_html_head(FILE *f, const char *title);
/* Text with &, <, > and quotes escaped. */
void stoke_html_text(FILE *f, const char *s);

#ifdef __cplusplus
}
#endif
#endif
