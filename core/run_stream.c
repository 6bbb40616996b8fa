/* core/run_stream.c: a data stream of the run (training or evaluation):
 * its source opened, the model's graph built and compiled, batch_size and
 * workers = auto resolved, the executor and the loader started; and a
 * batch copied into the stream's input. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stoke/core.h"
#include "stoke/ops.h"
#include "run_state.h"

/* "[3, 32, 32]" */
static void shape_text(const stoke_shape *sh, char *out, size_t cap) {
  size_t k = (size_t)snprintf(out, cap, "[");
  for (int i = 0; i < sh->ndim && k < cap; i++)
    k += (size_t)snprintf(out + k, cap - k, "%s%lld", i ? ", " : "", (long long)sh->d[i]);
  if (k < cap) snprintf(out + k, cap - k, "]");
}

/* Evaluation runs the training weights: its samples must be of the
 * training data's shape and classes (said here, by section and key,
 * rather than as two plans that differ). */
static stoke_err *eval_matches(run_state *s, const stoke_sample_info_v1 *ev) {
  stoke_sample_info_v1 tr;
  STOKE_PROPAGATE(s->train.src->info(s->train.src_self, &tr));
  if (tr.classes != ev->classes)
    return STOKE_ERR(STOKE_E_INVALID,
                     "%s: [eval_data] has %lld classes and [data] %lld: evaluation runs the model trained on [data]; "
                     "give both the same classes",
                     stoke_cfg_where(s->cfg, "eval_data", "source"), (long long)ev->classes, (long long)tr.classes);
  int same = tr.shape.ndim == ev->shape.ndim;
  for (int i = 0; same && i < tr.shape.ndim; i++) same = tr.shape.d[i] == ev->shape.d[i];
  if (!same) {
    char a[64], b[64];
    shape_text(&ev->shape, a, sizeof a);
    shape_text(&tr.shape, b, sizeof b);
    return STOKE_ERR(STOKE_E_INVALID,
                     "%s: [eval_data] samples are %s and [data] samples %s: evaluation runs the model trained on "
                     "[data]; give both the same sample shape",
                     stoke_cfg_where(s->cfg, "eval_data", "source"), a, b);
  }
  return NULL;
}

/* The model's graph for a stream: inputs (u8 images are normalized by the
 * first node, on the device), the model, and the loss when training. */
static stoke_err *build_graph(run_state *s, stream *st, stoke_dtype dtype, int training) {
  stoke_sample_info_v1 info;
  STOKE_TRY(st->src->info(st->src_self, &info), "source '%s'", st->src->name);
  if (!training) STOKE_PROPAGATE(eval_matches(s, &info));
  STOKE_PROPAGATE(stoke_graph_new(s->reg, dtype, s->layout, &st->g));
  stoke_graph *g = st->g;
  stoke_shape xs = {info.shape.ndim + 1, {st->batch}};
  for (int i = 0; i < info.shape.ndim; i++) xs.d[i + 1] = info.shape.d[i];
  int x, y, logits, targets = -1;
  if (info.dtype == STOKE_I32 && info.shape.ndim == 1) {
    /* token windows [B, T + 1]: the model reads the first T, the loss the next T */
    STOKE_PROPAGATE(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &xs, STOKE_I32, &x));
    STOKE_PROPAGATE(stoke_lm_inputs(g, x, &x, &targets));
  } else if (info.dtype == STOKE_U8) {
    if (info.shape.ndim != 3)
      return STOKE_ERR(STOKE_E_UNSUPPORTED, "source '%s' gives u8 samples that are not images (C, H, W)",
                       st->src->name);
    if (info.layout == STOKE_NCHW)
      return STOKE_ERR(STOKE_E_UNSUPPORTED,
                       "source '%s' says its u8 images are STOKE_NCHW (CHW memory order); u8 images are read as "
                       "HWC (as decoders write them): write HWC and say STOKE_NHWC, or give f32 samples",
                       st->src->name);
    STOKE_PROPAGATE(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &xs, STOKE_U8, &x));
    g->values[x].layout = STOKE_NHWC; /* sources write HWC */
    char attrs[600];
    snprintf(attrs, sizeof attrs, "mean=%s, std=%s, layout=%s, dtype=%s", s->rc.data.mean, s->rc.data.std,
             s->layout == STOKE_NHWC ? "nhwc" : "nchw", stoke_dtype_name(dtype));
    int n;
    STOKE_TRY(stoke_graph_builder(g).node(g, STOKE_OP_NORMALIZE, "normalize", &x, 1, attrs, &n, 1),
              "%s: [data] mean / std", stoke_cfg_where(s->cfg, "data", "mean"));
    /* the pixels are divided by 255 first (ToTensor, then Normalize): a mean on the 0-255 scale normalizes
     * every input to about -mean / std */
    for (const char *p = s->rc.data.mean; training && *p; p = strchr(p, ':') ? strchr(p, ':') + 1 : p + strlen(p))
      if (strtod(p, NULL) > 1) {
        char shown[300];
        size_t k = 0;
        for (const char *q = s->rc.data.mean; *q && k + 3 < sizeof shown; q++)
          k += *q == ':' ? (size_t)snprintf(shown + k, sizeof shown - k, ", ") : (shown[k] = *q, 1);
        shown[k] = 0;
        stoke_log(STOKE_LOG_WARN, "data",
                  "%s: [data] mean = %s is above 1: mean and std are on the 0-1 scale of torchvision's ToTensor "
                  "(the pixels are divided by 255 first; ImageNet's are 0.485, 0.456, 0.406 and 0.229, 0.224, "
                  "0.225), so every input lands near -mean / std", stoke_cfg_where(s->cfg, "data", "mean"), shown);
        break;
      }
    x = n;
  } else if (info.dtype == STOKE_F32) {
    /* the batch arrives as f32; a low-precision graph converts it first. mean / std normalize u8 images only */
    const char *k = stoke_cfg_is_set(s->cfg, "data", "mean") ? "mean" : stoke_cfg_is_set(s->cfg, "data", "std") ? "std" : NULL;
    if (k && training)
      stoke_log(STOKE_LOG_WARN, "data",
                "%s: [data] %s is set, but source '%s' gives f32 samples, which the model reads as they are: mean "
                "and std normalize u8 images (the jpeg and lmdb sources); normalize in the source, or leave them out",
                stoke_cfg_where(s->cfg, "data", k), k, st->src->name);
    STOKE_PROPAGATE(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &xs, STOKE_F32, &x));
    /* images in the memory order the source declares (CHW unless it says STOKE_NHWC) */
    stoke_layout in = info.layout == STOKE_NHWC ? STOKE_NHWC : STOKE_NCHW;
    g->values[x].layout = xs.ndim == 4 ? in : STOKE_LAYOUT_ANY;
    if (dtype != STOKE_F32 || (xs.ndim == 4 && s->layout != in)) {
      char attrs[32];
      snprintf(attrs, sizeof attrs, "dtype=%s", stoke_dtype_name(dtype));
      int c;
      STOKE_PROPAGATE(stoke_graph_builder(g).node(g, STOKE_OP_CAST, "cast", &x, 1, attrs, &c, 1));
      x = c;
    }
  } else {
    return STOKE_ERR(STOKE_E_UNSUPPORTED, "source '%s' gives samples that are neither f32, u8 nor i32 token windows",
                     st->src->name);
  }
  st->lm = targets >= 0;
  STOKE_PROPAGATE(stoke_graph_input(g, "label", STOKE_VAL_LABEL, &(stoke_shape){1, {st->batch}}, STOKE_I32, &y));
  const char *mname = s->rc.model.name;
  const stoke_model_v1 *m = stoke_find_model(s->reg, mname);
  stoke_builder_v1 b = stoke_graph_builder(g);
  STOKE_TRY(m->build(s->cfg, "model", &b, x, info.classes, &logits), "building model '%s'", mname);
  stoke_shape ls = g->values[logits].shape;
  int64_t rows = st->lm ? stoke_numel(&g->values[targets].shape) : st->batch;
  if (ls.ndim != 2 || ls.d[0] != rows || (st->lm ? ls.d[1] < info.classes : ls.d[1] != info.classes))
    return STOKE_ERR(STOKE_E_INVALID, "model '%s' must give logits [%lld, %s%lld]%s", mname, (long long)rows,
                     st->lm ? ">= " : "", (long long)info.classes,
                     st->lm ? " (a row per token, a column per token id of the data's vocabulary)" : "");
  g->logits = logits;
  if (!training && !st->lm) return NULL; /* a language model's evaluation reads its loss */
  char attrs[64];
  snprintf(attrs, sizeof attrs, "label_smoothing=%.17g", s->rc.loss.label_smoothing);
  STOKE_PROPAGATE(stoke_graph_loss_on(g, logits, st->lm ? targets : y, attrs));
  return NULL;
}

/* workers = auto: 1, 2, 4, ... up to the core count, each timed on a few
 * batches after a warm-up (what users sweep by hand); the fastest count
 * wins, a larger count only when it is at least 5% faster. */
static stoke_err *auto_workers(run_state *s, stoke_loader_opts lo, int64_t *best_out) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores < 1) cores = 1;
  double best_rate = 0;
  int64_t best = 1;
  char line[512] = "";
  size_t used = 0;
  for (int64_t w = 1; w <= cores && w <= 64; w *= 2) {
    lo.workers = (int)w;
    lo.shuffle = 1;
    lo.feed = 0; /* host batches only: timed, not handed over */
    stoke_loader *l;
    STOKE_TRY(stoke_loader_new(&lo, &l), "workers = auto, trying %lld", (long long)w);
    /* the ring's first `prefetch` batches were made before anyone asked:
     * drain them, then time at least 12 batches and 0.2 s (at most 400) */
    stoke_err *e = NULL;
    double t0 = 0, n = 0;
    int warm = lo.prefetch + 1;
    for (int i = 0; i < warm + 400 && !e; i++) {
      stoke_batch *b;
      e = stoke_loader_next(l, &b, NULL);
      if (!e && i == warm - 1) t0 = now_s();
      if (!e && i >= warm) n += (double)b->n;
      if (!e) stoke_loader_release(l, b);
      if (i >= warm + 12 && now_s() - t0 > 0.2) break;
    }
    double rate = n / (now_s() - t0);
    stoke_loader_free(l);
    if (e) return stoke_err_wrap(e, __FILE__, __LINE__, "workers = auto, trying %lld", (long long)w);
    used += (size_t)snprintf(line + used, used < sizeof line ? sizeof line - used : 0, "%s%lld: %.0f/s",
                             used ? ", " : "", (long long)w, rate);
    if (rate > best_rate * 1.05) best_rate = rate, best = w;
  }
  stoke_log(STOKE_LOG_INFO, "loader", "workers = auto: %lld (samples/s by worker count: %s)", (long long)best, line);
  *best_out = best;
  return NULL;
}

/* The memory a plan may take: 85% of [run] memory_gb, or of the device's
 * free memory (the kernels' workspaces are not known before their plan();
 * the margin covers them); *device: the memory it is 85% of, `name` says
 * where that figure comes from. */
stoke_err *run_memory_budget(run_state *s, double *budget, double *device, char *name, size_t cap) {
  double gb = s->rc.run.memory_gb;
  stoke_device_info_v1 info = {0};
  if (gb > 0) snprintf(info.name, sizeof info.name, "[run] memory_gb = %g", gb);
  else if (s->dev && s->dev->info) STOKE_PROPAGATE(s->dev->info(s->dev_self, &info));
  *device = gb > 0 ? gb * 1073741824.0 : (double)info.free_bytes;
  *budget = 0.85 * *device;
  if (name) snprintf(name, cap, "%s", info.name);
  return NULL;
}

/* The compiler's options for a stream, from the run's config. */
static stoke_err *plan_opts(run_state *s, const stoke_precision_v1 *prec, int training, stoke_plan_opts *po) {
  const stoke_run_config *rc = &s->rc;
  int det = rc->run.deterministic;
  uint32_t flags = (prec->tf32 ? STOKE_KFLAG_TF32 : 0) | (det ? STOKE_KFLAG_DETERMINISTIC : 0) |
                   (rc->run.conv_autotune && !det ? STOKE_KFLAG_AUTOTUNE : 0);
  double init_scale = rc->run.loss_scale_init, budget = 0, device;
  if (training && !strcmp(rc->run.recompute, "auto")) STOKE_PROPAGATE(run_memory_budget(s, &budget, &device, NULL, 0));
  *po = (stoke_plan_opts){s->engines, s->n_engines, s->selves, training ? rc->optimizer.name : NULL, training, flags,
                          training && prec->loss_scaling != STOKE_SCALING_NONE,
                          init_scale > 0 ? init_scale : prec->init_scale, rc->run.fuse, rc->optimizer.grad_clip,
                          !rc->optimizer.weight_decay_1d, !rc->run.grad_sums_in_place, prec,
                          training ? rc->run.recompute : NULL, budget, !rc->run.fwd_in_bwd,
                          !rc->run.fuse_bias_norm,
                          /* data parallel: a bucket's all-reduce follows each node, so no side stream */
                          s->world > 1 ? 0 : (int)rc->run.wgrad_stream, !rc->run.pool_index,
                          !rc->run.fuse_shortcut,
                          rc->run.filter_layout == 2 ||
                              (rc->run.filter_layout == 0 && s->dev && s->dev->device == STOKE_DEV_GPU)};
  return NULL;
}

/* batch_size = auto: the largest power of two from 8 whose plan fits 85%
 * of the device's free memory (no trial-and-error allocation); with
 * recompute = auto, each batch's plan recomputes what it must to fit. */
static stoke_err *auto_batch(run_state *s, stream *st, const stoke_plan_opts *po, stoke_dtype dtype) {
  double budget, device;
  char device_name[160];
  STOKE_PROPAGATE(run_memory_budget(s, &budget, &device, device_name, sizeof device_name));
  int64_t best = 0, len = st->src->length(st->src_self);
  double need = 0, best_need = 0;
  for (int64_t b = 8; b <= len && b <= (1 << 20); b *= 2) {
    st->batch = b;
    stoke_err *e = build_graph(s, st, dtype, 1);
    stoke_plan *p = NULL;
    if (!e) e = stoke_compile(st->g, po, &p);
    if (!e) need = stoke_plan_device_bytes(p);
    stoke_plan_free(p);
    stoke_graph_free(st->g);
    st->g = NULL;
    if (e) return stoke_err_wrap(e, __FILE__, __LINE__, "batch_size = auto, trying %lld", (long long)b);
    if (need > budget) break;
    best = b;
    best_need = need;
  }
  if (!best)
    return STOKE_ERR(STOKE_E_OOM,
                     "batch_size = auto: not even 8 samples fit: the plan needs %.1f MiB, %.1f MiB of the "
                     "device's %.1f MiB free is the budget; use a smaller model or precision, or [run] recompute = auto",
                     need / 1048576, budget / 1048576, device / 1048576);
  st->batch = best;
  stoke_log(STOKE_LOG_INFO, "run",
            "batch_size = auto: %lld (the plan needs %.1f MiB; %.1f MiB free on %s, 85%% is the budget%s)",
            (long long)best, best_need / 1048576, device / 1048576, device_name,
            po->recompute && !strcmp(po->recompute, "auto") ? "; recompute = auto" : "");
  return NULL;
}

/* Open a stream's source, find its batch, build and compile its graph. */
stoke_err *run_plan_stream(run_state *s, stream *st, const stoke_data_config *dc, const stoke_precision_v1 *prec,
                          int training) {
  stoke_dtype dtype = prec->param_dtype;
  st->section = dc->section;
  st->batch = dc->batch;
  if (!st->batch && !training) st->batch = s->train.batch;
  st->src = stoke_find_source(s->reg, dc->source);
  STOKE_TRY(st->src->open(s->cfg, dc->section, &st->src_self), "opening [%s] source '%s'", dc->section, dc->source);
  stoke_plan_opts po;
  STOKE_PROPAGATE(plan_opts(s, prec, training, &po));
  if (!st->batch) STOKE_PROPAGATE(auto_batch(s, st, &po, dtype));
  STOKE_PROPAGATE(build_graph(s, st, dtype, training));
  STOKE_TRY(stoke_compile(st->g, &po, &st->plan), "compiling the %s graph", training ? "training" : "evaluation");
  return NULL;
}

/* Plan a stream (run_plan_stream), bind its plan to the device, start its loader. */
stoke_err *run_open_stream(run_state *s, stream *st, const stoke_data_config *dc, int training, int64_t start_batch) {
  const char *section = dc->section;
  uint64_t seed = (uint64_t)s->rc.run.seed;
  int64_t workers = dc->workers;
  STOKE_PROPAGATE(run_plan_stream(s, st, dc, s->prec, training));
  if (training)
    STOKE_TRY(stoke_exec_new(st->plan, s->dev, s->dev_self, seed, &st->x),
              "preparing the plan: parameters %.1f MiB, gradients %.1f MiB, optimizer state %.1f MiB, "
              "activations %.1f MiB at batch %lld (halving [data] batch_size about halves the activations)",
              st->plan->bytes[STOKE_BUF_PARAMS] / 1048576.0, st->plan->bytes[STOKE_BUF_GRADS] / 1048576.0,
              st->plan->opt_state_bytes / 1048576.0, st->plan->bytes[STOKE_BUF_ARENA] / 1048576.0,
              (long long)st->batch);
  else
    STOKE_TRY(stoke_exec_new_shared(st->plan, s->train.x, &st->x), "preparing the evaluation plan");
  /* resumed: the same place in the global sample order, whatever the
   * number of processes or the batch size it was saved with; with
   * on_device the run trains on its first batch every step, so a resumed
   * one takes the first batch again (an uninterrupted run's), not the one
   * at its step */
  if (training && s->resume.step > 0)
    st->resume_micro = stoke_dist_resume_batch(s->resume.step, s->resume.accumulate,
                                               s->resume.batch > 0 ? s->resume.batch : st->batch, s->resume.world,
                                               st->batch, s->world, st->src->length(st->src_self));
  if (training && dc->on_device) start_batch = 0;
  else if (training && s->resume.step > 0) /* from a whole step's first micro-batch (another accumulate: up to
                                             * accumulate - 1 read again): the next file's step says where the data is */
    start_batch = st->resume_micro - st->resume_micro % s->rc.run.accumulate;
  stoke_loader_opts lo = {st->src, st->src_self, s->dev, s->dev_self, st->batch, (int)workers,
                          (int)dc->prefetch, dc->shuffle, dc->drop_last, seed, s->rank, s->world, start_batch,
                          s->dp ? NULL : &stoke_stop_signal, !training, dc->max_skipped, 1};
  if (!workers) STOKE_PROPAGATE(auto_workers(s, lo, &workers));
  lo.workers = (int)workers;
  STOKE_TRY(stoke_loader_new(&lo, &st->loader), "starting the [%s] loader", section);
  return NULL;
}

/* The precision policy's table, and a warning for each matmul or conv
 * whose dimensions keep tensor cores from full speed in fp16/bf16. */
void run_report_precision(const stoke_precision_v1 *p, const stoke_graph *g, int quiet) {
  static const char *scaling[] = {"off", "static", "dynamic"};
  if (!quiet)
    printf("precision %s: parameters %s (the optimizer on %s%s), activations %s, TF32 %s, loss scaling %s; "
           "ops in fp32: %s\n",
           p->name, stoke_dtype_name(p->param_dtype), stoke_dtype_name(p->master_dtype),
           p->master_dtype != p->param_dtype ? " master weights" : "", stoke_dtype_name(p->compute_dtype),
           p->tf32 ? "on" : "off", (unsigned)p->loss_scaling < 3 ? scaling[p->loss_scaling] : "?",
           p->fp32_ops && p->fp32_ops[0] ? p->fp32_ops
                                         : "none (statistics, norms and the loss accumulate in fp32 inside the kernels)");
  if (p->compute_dtype != STOKE_BF16 && p->compute_dtype != STOKE_F16) return;
  for (int i = 0; i < g->n_fwd; i++) {
    const stoke_gnode *n = &g->nodes[i];
    int conv = !strcmp(n->n.op, STOKE_OP_CONV2D), lin = !strcmp(n->n.op, STOKE_OP_LINEAR);
    if (!conv && !lin) continue;
    int64_t in = g->values[n->in[0]].shape.d[1], out = g->values[n->in[1]].shape.d[0];
    if (in % 8 || out % 8)
      stoke_log(STOKE_LOG_WARN, "run",
                "%s '%s': %s %lld -> %lld, not multiples of 8: tensor cores run it below full speed in %s",
                n->n.op, n->n.name, conv ? "channels" : "features", (long long)in, (long long)out, p->name);
  }
}

/* The next batch into the stream's input and label values, by the
 * loader's hand-off (stoke_loader_feed): on a GPU the compute stream
 * waits for its copy, the host does not. */
stoke_err *run_feed(stream *st, int32_t *host_labels, stoke_fed *fed, double *wait_s) {
  return stoke_loader_feed(st->loader, stoke_exec_input(st->x), stoke_exec_labels(st->x), host_labels, fed, wait_s);
}

void run_stream_close(run_state *s, stream *st) {
  stoke_loader_free(st->loader); /* waits for its copies */
  stoke_exec_free(st->x);
  stoke_plan_free(st->plan);
  stoke_graph_free(st->g);
  if (st->src_self) st->src->close(st->src_self);
}
