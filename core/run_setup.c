/* core/run_setup.c: a run's first phase: its folder (resolved config,
 * log), the process's place in a data parallel job, the engines and the
 * device, the checkpoint to resume, the training and evaluation streams,
 * the run's length and lr schedule, the metrics, and what the step loop
 * needs decided before it starts (graphs, room for checkpoints). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "stoke/checkpoint.h"
#include "stoke/core.h"
#include "nvtx.h"
#include "run_state.h"

static const char *dist_getenv(const char *name, void *ctx) {
  (void)ctx;
  return getenv(name);
}

/* Writes `path` through `put` and checks that every byte reached the file:
 * a full disk or a file-size limit is an error naming the file, never a
 * silently short or empty file. */
stoke_err *run_write_checked(const char *path, void (*put)(const void *, FILE *), const void *arg) {
  FILE *f = fopen(path, "w");
  if (!f) return STOKE_ERR(STOKE_E_IO, "cannot write '%s': %s", path, strerror(errno));
  put(arg, f);
  int bad = fflush(f) != 0 || ferror(f), err = errno;
  if (fclose(f) && !bad) bad = 1, err = errno;
  if (bad) return STOKE_ERR(STOKE_E_IO, "writing '%s' failed: %s (is the disk full?)", path, strerror(err));
  return NULL;
}

static void put_text(const void *t, FILE *f) { fputs(t, f); }
static void put_plan(const void *p, FILE *f) { stoke_plan_report(p, f); }

static stoke_err *mkdir_p(const char *path) {
  char buf[PATH_MAX];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(buf, 0755) && errno != EEXIST)
      return STOKE_ERR(STOKE_E_IO, "cannot create folder '%s': %s", buf, strerror(errno));
    *p = '/';
  }
  if (mkdir(buf, 0755) && errno != EEXIST)
    return STOKE_ERR(STOKE_E_IO, "cannot create folder '%s': %s", buf, strerror(errno));
  return NULL;
}

/* The resolved config as text (saved with the run and in checkpoints). */
char *run_config_text(const stoke_cfg *c) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return NULL;
  stoke_cfg_dump(c, f);
  fclose(f);
  return buf;
}

/* Close the opened engines, the device's last (the others use it). */
void run_close_engines(run_state *s) {
  for (int pass = 0; pass < 2; pass++)
    for (int i = s->n_engines - 1; i >= 0; i--) {
      if (!s->opened[i] || (pass == 0) == (s->backs[i] == s->dev)) continue;
      if (s->backs[i]->close) s->backs[i]->close(s->selves[i]);
      s->opened[i] = 0;
    }
}

/* The engines of [run] backends and the first that owns a device, none
 * opened. */
static stoke_err *pick_device(run_state *s) {
  for (int i = 0; i < s->n_engines; i++) {
    s->backs[i] = stoke_find_backend(s->reg, s->engines[i]);
    if (!s->backs[i]->device_engine && !s->dev) s->dev = s->backs[i];
  }
  if (!s->dev)
    return STOKE_ERR(STOKE_E_INVALID,
                     "%s: [run] backends: none of the backends owns a device (cpu or cuda); add one",
                     stoke_cfg_where(s->cfg, "run", "backends"));
  return NULL;
}

static stoke_err *open_engines(run_state *s) {
  int64_t dev_index = s->rc.run.device_index + s->local_rank; /* data parallel: one GPU per process of a node */
  STOKE_PROPAGATE(pick_device(s));
  /* the device engine opens first: the others get its state */
  int order[STOKE_CFG_MAX_LIST], n = 0;
  for (int i = 0; i < s->n_engines; i++)
    if (s->backs[i] == s->dev) order[n++] = i;
  for (int i = 0; i < s->n_engines; i++)
    if (s->backs[i] != s->dev) order[n++] = i;
  for (int k = 0; k < n; k++) {
    int i = order[k];
    const stoke_backend_v1 *b = s->backs[i];
    if (b->device_engine && strcmp(b->device_engine, s->dev->name))
      return STOKE_ERR(STOKE_E_INVALID, "%s: [run] backends: '%s' runs on '%s', which is not in the list",
                       stoke_cfg_where(s->cfg, "run", "backends"), b->name, b->device_engine);
    if (b->device != s->dev->device)
      return STOKE_ERR(STOKE_E_INVALID, "[run] backends: '%s' and '%s' are on different devices",
                       b->name, s->dev->name);
    STOKE_TRY(b->open ? b->open((int)dev_index, b == s->dev ? NULL : s->dev_self, &s->selves[i]) : NULL,
              "opening backend '%s' on device %lld", b->name, (long long)dev_index);
    s->opened[i] = 1;
    if (b == s->dev) s->dev_self = s->selves[i];
  }
  return NULL;
}

/* Open the engines in order; the first that owns a device provides memory.
 * With device = auto and no GPU, fall back to the cpu backend, saying so. */
static stoke_err *open_backends(run_state *s, const char **prec_name) {
  s->n_engines = s->rc.run.n_backends;
  memcpy(s->engines, s->rc.run.backends, sizeof s->engines);
  stoke_device_choice want = s->rc.run.device;
  stoke_err *e = NULL;
  /* which device the backends own is known before any opens: device = cpu opens no GPU only to close it */
  if (want == STOKE_DEVICE_CPU) STOKE_PROPAGATE(pick_device(s));
  int to_cpu = want == STOKE_DEVICE_CPU && s->dev->device == STOKE_DEV_GPU;
  if (!to_cpu) {
    e = open_engines(s);
    int on_gpu = s->dev && s->dev->device == STOKE_DEV_GPU;
    if (!e && want == STOKE_DEVICE_GPU && !on_gpu)
      return STOKE_ERR(STOKE_E_INVALID,
                       "%s: [run] device = gpu, but [run] backends run on the CPU (device backend '%s'): list the "
                       "GPU backends (e.g. backends = cudnn, cublaslt, cuda) or set device = auto",
                       stoke_cfg_where(s->cfg, "run", "device"), s->dev->name);
    if (!e || e->code != STOKE_E_NOT_FOUND || want == STOKE_DEVICE_GPU || !on_gpu) return e;
    stoke_log(STOKE_LOG_WARN, "run", "%s; [run] device = auto: falling back to the cpu backend (fp32)", e->msg);
    stoke_err_free(e);
  } else {
    stoke_log(STOKE_LOG_INFO, "run", "[run] device = cpu: the cpu backend (fp32) in place of [run] backends");
  }
  run_close_engines(s);
  s->dev = NULL;
  s->dev_self = NULL;
  s->cpu_fallback = 1;
  STOKE_TRY(stoke_registry_load(s->reg, "cpu"), "falling back to the cpu backend");
  s->engines[0] = "cpu";
  s->n_engines = 1;
  *prec_name = "fp32";
  return open_engines(s);
}

/* Data parallel: which process this is (the comm plugin is handed the
 * same); the GPU is device_index + the local rank. Rank 0 speaks for the
 * job. */
static stoke_err *find_place(run_state *s) {
  if (!strcmp(s->rc.run.comm, "single")) return NULL;
  stoke_dist_env *env = &s->dist;
  char msg[512];
  if (stoke_dist_env_read(dist_getenv, NULL, env, msg, sizeof msg))
    return STOKE_ERR(STOKE_E_INVALID, "%s: [run] comm = %s: %s", stoke_cfg_where(s->cfg, "run", "comm"),
                     s->rc.run.comm, msg);
  s->rank = env->rank, s->world = env->world, s->local_rank = env->local_rank;
  s->opts.quiet |= s->rank > 0;
  return NULL;
}

/* The run's folder (out_dir, or runs/<name>; ranks > 0 beside rank 0's)
 * and its log; the resolved config is written once the device is known
 * (write_config) and printed by announce() once the run is set up. */
static stoke_err *open_folder(run_state *s) {
  const stoke_run_config *rc = &s->rc;
  const char *ini = s->o->ini_path;
  char *run_name = s->run_name, path[640];
  if (strlen(rc->run.name) >= sizeof s->run_name) /* cut, two runs' names could meet */
    return STOKE_ERR(STOKE_E_INVALID, "%s: [run] name is %zu characters long, at most %zu",
                     stoke_cfg_where(s->cfg, "run", "name"), strlen(rc->run.name), sizeof s->run_name - 1);
  if (rc->run.name[0]) snprintf(run_name, sizeof s->run_name, "%s", rc->run.name);
  else {
    const char *base = strrchr(ini, '/');
    snprintf(run_name, sizeof s->run_name, "%s", base ? base + 1 : ini);
    char *dot = strrchr(run_name, '.');
    if (dot) *dot = 0;
  }
  /* room for /rankN: cut short, rank N's folder would be another's and the ranks would write over its files */
  size_t len = rc->run.out_dir[0] ? strlen(rc->run.out_dir) : strlen("runs/") + strlen(run_name);
  if (len > sizeof s->dir - 32)
    return STOKE_ERR(STOKE_E_INVALID, "%s: [run] out_dir is too long: %zu characters, at most %zu",
                     stoke_cfg_where(s->cfg, "run", "out_dir"), len, sizeof s->dir - 32);
  if (rc->run.out_dir[0]) snprintf(s->dir, sizeof s->dir, "%s", rc->run.out_dir);
  else snprintf(s->dir, sizeof s->dir, "runs/%s", run_name);
  /* run.resume = auto: the checkpoint rank 0 writes in out_dir, when there is one (every rank reads it) */
  if (!strcmp(rc->run.resume, "auto")) {
    struct stat st;
    snprintf(s->resume_auto, sizeof s->resume_auto, "%s/" RUN_CKPT_NAME, s->dir);
    if (stat(s->resume_auto, &st)) s->resume_auto[0] = 0;
    s->rc.run.resume = s->resume_auto;
    stoke_log(STOKE_LOG_INFO, "run", "[run] resume = auto: %s", s->resume_auto[0] ? s->resume_auto
                                                                 : "no checkpoint in out_dir, starting at step 0");
  }
  /* a run's folder (run.resume=runs/x): its checkpoint, as the summary's "continue with" names it */
  struct stat rs;
  if (strcmp(rc->run.resume, "auto") && s->rc.run.resume[0] && !stat(s->rc.run.resume, &rs) && S_ISDIR(rs.st_mode)) {
    snprintf(s->resume_auto, sizeof s->resume_auto, "%s/" RUN_CKPT_NAME, rc->run.resume);
    if (stat(s->resume_auto, &rs))
      return STOKE_ERR(STOKE_E_NOT_FOUND, "%s: [run] resume = %s is a folder without a %s: name the checkpoint file",
                       stoke_cfg_where(s->cfg, "run", "resume"), rc->run.resume, RUN_CKPT_NAME);
    stoke_log(STOKE_LOG_INFO, "run", "[run] resume = %s, a folder: its %s", rc->run.resume, s->resume_auto);
    s->rc.run.resume = s->resume_auto;
  }
  if (s->rank > 0) snprintf(s->dir + len, sizeof s->dir - len, "/rank%d", s->rank);
  snprintf(s->sum->out_dir, sizeof s->sum->out_dir, "%s", s->dir);
  run_signals_ignore_xfsz(&s->sg);
  STOKE_TRY(mkdir_p(s->dir), "[run] out_dir");
  if (s->rank == 0) STOKE_PROPAGATE(run_claim_out_dir(s));
  snprintf(path, sizeof path, "%s/log.txt", s->dir);
  s->log = fopen(path, "a");
  if (s->log) { /* runs in one out_dir append here: each starts with a line saying when and from what */
    time_t now = time(NULL);
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&now));
    fprintf(s->log, "== %s: %s%s%s ==\n", when, s->o->ini_path ? s->o->ini_path : "(config text)",
            s->rc.run.resume[0] ? ", resuming from " : "", s->rc.run.resume);
    stoke_log_set_file(s->log);
  }
  return NULL;
}

/* [run] layout: auto is NHWC on a GPU (channels_last), NCHW on the CPU. */
static void pick_layout(run_state *s) {
  s->layout = s->rc.run.layout != STOKE_LAYOUT_ANY ? s->rc.run.layout
              : s->dev->device == STOKE_DEV_GPU    ? STOKE_NHWC
                                                   : STOKE_NCHW;
}

/* The engines, the precision policy, the communicator; the layout, the
 * device's peak for MFU and its NVML handle. */
stoke_err *run_open_device(run_state *s) {
  const stoke_run_config *rc = &s->rc;
  stoke_summary *sum = s->sum;
  const char *prec_name = rc->run.precision;
  STOKE_PROPAGATE(open_backends(s, &prec_name));
  const stoke_precision_v1 *prec = s->prec = stoke_find_precision(s->reg, prec_name);
  if (strcmp(rc->run.comm, "single"))
    STOKE_PROPAGATE(stoke_dp_open(stoke_find_comm(s->reg, rc->run.comm), s->cfg, &s->dist, s->dev, s->dev_self, &s->dp));
  pick_layout(s);
  stoke_device_info_v1 info = {0};
  if (s->dev->info) STOKE_TRY(s->dev->info(s->dev_self, &info), "asking the device for its peak");
  snprintf(sum->device, sizeof sum->device, "%s", info.name[0] ? info.name : s->dev->name);
  snprintf(sum->precision, sizeof sum->precision, "%s", prec->name);
  sum->gpu = s->dev->device == STOKE_DEV_GPU;
  s->peak_flops = prec->compute_dtype == STOKE_F32 ? (prec->tf32 ? info.peak_tf32 : info.peak_flops[STOKE_F32])
                                                   : info.peak_flops[prec->compute_dtype];
  if (s->dev->device == STOKE_DEV_GPU) s->nvml = stoke_nvml_open((int)rc->run.device_index + s->local_rank);
  if (s->dev->device == STOKE_DEV_CPU && prec->param_dtype != STOKE_F32 && prec->param_dtype != STOKE_F64)
    return STOKE_ERR(STOKE_E_UNSUPPORTED,
                     "%s: [run] precision = %s needs a GPU backend (%s parameters); the cpu backend runs fp32",
                     stoke_cfg_where(s->cfg, "run", "precision"), prec_name, stoke_dtype_name(prec->param_dtype));
  return NULL;
}

/* Where the value of `key` in `section` of a resolved config's text
 * (config.ini, a checkpoint's copy: stoke_cfg_dump's "key = value" lines)
 * starts, and its length; NULL when absent. */
static const char *config_find(const char *text, const char *section, const char *key, size_t *len) {
  char head[96];
  snprintf(head, sizeof head, "[%s]\n", section);
  const char *p = strstr(text, head);
  size_t kl = strlen(key);
  for (p = p ? p + strlen(head) : NULL; p && *p && *p != '['; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (!strncmp(p, key, kl) && !strncmp(p + kl, " = ", 3)) {
      *len = strcspn(p + kl + 3, "\n");
      return p + kl + 3;
    }
  return NULL;
}

/* That value copied into out; 0 when absent. */
static int config_value(const char *text, const char *section, const char *key, char *out, size_t cap) {
  size_t n;
  const char *v = config_find(text, section, key, &n);
  if (v) snprintf(out, cap, "%.*s", (int)n, v);
  return v != NULL;
}

void run_config_drift(const char *now, const char *ckpt, const char *what) {
  char *then = NULL;
  stoke_err_free(stoke_checkpoint_config(ckpt, &then));
  if (!then || !now) {
    free(then);
    return;
  }
  char diff[1024] = "";
  size_t used = 0;
  const char *p = strstr(now, "[model]\n");
  for (p = p ? p + 8 : NULL; p && *p && *p != '[' && used < sizeof diff; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
    const char *eq = strstr(p, " = "), *end = strchr(p, '\n');
    if (*p == ';' || !eq || (end && eq > end)) continue;
    char key[64], v_now[256], v_then[256];
    snprintf(key, sizeof key, "%.*s", (int)(eq - p), p);
    snprintf(v_now, sizeof v_now, "%.*s", (int)(end ? end - eq - 3 : (long)strlen(eq + 3)), eq + 3);
    if (config_value(then, "model", key, v_then, sizeof v_then) && strcmp(v_now, v_then))
      used += (size_t)snprintf(diff + used, sizeof diff - used, "%s%s = %s (its run had %s)", used ? ", " : "", key,
                               v_now, v_then);
  }
  if (diff[0])
    stoke_log(STOKE_LOG_WARN, "run",
              "%s %s with [model] %s: the weights load (the shapes agree), but as another model than the one they "
              "were trained as", what, ckpt, diff);
  char st_now[64], st_then[64], sched[64];
  if (config_value(now, "optimizer", "schedule", sched, sizeof sched) && !strcmp(sched, "cosine") &&
      config_value(then, "optimizer", "schedule", sched, sizeof sched) && !strcmp(sched, "cosine") &&
      config_value(now, "run", "steps", st_now, sizeof st_now) && config_value(then, "run", "steps", st_then, sizeof st_then) &&
      strcmp(st_now, st_then) && strcmp(what, "generating from"))
    stoke_log(STOKE_LOG_WARN, "run",
              "%s %s: [run] steps = %s, its run had %s: the cosine schedule now reaches min_lr at step %s, so the "
              "rate from here follows the new curve, not the old one (nanoGPT's lr_decay_iters has no stoke key)",
              what, ckpt, st_now, st_then, st_now);
  free(then);
}

/* [run] resume: the weights, optimizer state and loss scale of the
 * checkpoint (its step was read before the loader started). */
static stoke_err *load_resume(run_state *s) {
  const char *resume = s->rc.run.resume;
  int64_t seed = s->rc.run.seed, accumulate = s->rc.run.accumulate;
  stoke_ckpt_meta meta = {0};
  STOKE_TRY(stoke_checkpoint_load(s->train.x, resume, &meta), "%s: [run] resume",
            stoke_cfg_where(s->cfg, "run", "resume"));
  if (meta.loss_scale > 0) /* 0: the file's run had no scaler; this run's starts from its initial scale */
    STOKE_TRY(stoke_exec_set_scale(s->train.x, (float)meta.loss_scale, (float)meta.loss_scale_good_steps),
              "restoring the loss scale");
  /* the loss scaler's skipped steps, in this run's steps when those differ (AdamW's bias corrections subtract
   * them from the step) */
  s->resume.skipped_steps = meta.step > 0 ? meta.skipped_steps * s->start_step / meta.step : 0;
  /* AdamW's bias corrections count the updates its moments hold: none when the file's optimizer was another
   * (its state starts fresh), so the first update here is its step 1, as a fresh run's */
  if (s->train.plan->opt && strcmp(meta.optimizer, s->train.plan->opt->name))
    s->resume.skipped_steps = s->start_step;
  if (meta.seed != seed || meta.accumulate != accumulate)
    stoke_log(STOKE_LOG_WARN, "run",
              "resuming from %s, saved with seed %lld and accumulate %lld, now %lld and %lld: the run "
              "will not repeat the original",
              resume, (long long)meta.seed, (long long)meta.accumulate, (long long)seed, (long long)accumulate);
  run_config_drift(s->config_text, resume, "resuming from");
  run_best_resumed(s);
  if (!s->o->quiet) printf("stoke: resumed from %s at step %lld\n", resume, (long long)s->start_step);
  return NULL;
}

/* Data parallel: gradients in buckets, the same start everywhere. */
static stoke_err *attach_ranks(run_state *s) {
  int64_t accumulate = s->rc.run.accumulate;
  STOKE_PROPAGATE(stoke_dp_attach(s->dp, s->train.x, s->rc.run.bucket_mb * 1048576.0));
  STOKE_PROPAGATE(stoke_dp_broadcast_state(s->dp));
  char buckets[1024];
  stoke_dp_describe(s->dp, buckets, sizeof buckets);
  if (!s->o->quiet)
    printf("data parallel: %d processes (comm %s), %lld samples per step (%lld per process), gradients in %s\n",
           s->world, s->rc.run.comm, (long long)(s->train.batch * accumulate * s->world),
           (long long)(s->train.batch * accumulate), buckets);
  if (s->world > 1 && s->rc.run.wgrad_stream > 0)
    stoke_log(STOKE_LOG_INFO, "run",
              "[run] wgrad_stream = %lld is off under data parallel: each node's gradients go to their bucket's "
              "all-reduce as the node ends", (long long)s->rc.run.wgrad_stream);
  return NULL;
}

/* The streams: training (from where a resumed checkpoint stopped) and
 * evaluation; the plan in plan.txt. */
static stoke_err *open_data(run_state *s) {
  const stoke_run_config *rc = &s->rc;
  /* the training loader starts where the checkpoint stopped: read its
   * step first; where the data continues also depends on how it was cut
   * (accumulate, world, batch: run_open_stream) */
  if (rc->run.resume[0]) {
    STOKE_TRY(stoke_checkpoint_read_meta(rc->run.resume, &s->resume), "%s: [run] resume",
              stoke_cfg_where(s->cfg, "run", "resume"));
    s->start_step = s->resume.step;
  }
  STOKE_PROPAGATE(run_open_stream(s, &s->train, &rc->data, 1, s->start_step * rc->run.accumulate));
  if (rc->run.resume[0]) {
    /* saved with another batch, accumulate or world: the run goes on from the same sample (run_open_stream),
     * so its step count, the schedule's place and the run's length are this run's steps to that sample */
    int64_t micro = s->train.resume_micro;
    int64_t step = micro / rc->run.accumulate;
    if (step != s->resume.step) {
      stoke_log(STOKE_LOG_INFO, "run", "%s: step %lld of %lld samples a step is step %lld of this run's %lld%s",
                rc->run.resume, (long long)s->resume.step,
                (long long)(s->resume.accumulate * (s->resume.batch > 0 ? s->resume.batch : s->train.batch) *
                            s->resume.world),
                (long long)step, (long long)(rc->run.accumulate * s->train.batch * s->world),
                micro % rc->run.accumulate ? " (from that step's first micro-batch: a few are read again)" : "");
      s->start_step = step;
    }
    STOKE_PROPAGATE(load_resume(s));
    if (rc->run.init_from[0])
      stoke_log(STOKE_LOG_INFO, "run", "[run] init_from %s is not read: the run continues its own checkpoint",
                rc->run.init_from);
  } else if (rc->run.init_from[0]) {
    char report[1600];
    STOKE_TRY(stoke_checkpoint_load_weights(s->train.x, rc->run.init_from, report, sizeof report), "%s: [run] init_from",
              stoke_cfg_where(s->cfg, "run", "init_from"));
    stoke_log(STOKE_LOG_INFO, "run", "[run] init_from %s: %s; training starts at step 0 with a fresh optimizer",
              rc->run.init_from, report);
  }
  if (s->dp) STOKE_PROPAGATE(attach_ranks(s));
  if (rc->eval_data.source[0]) STOKE_PROPAGATE(run_open_stream(s, &s->eval, &rc->eval_data, 0, 0));
  char path[640];
  snprintf(path, sizeof path, "%s/plan.txt", s->dir);
  STOKE_TRY(run_write_checked(path, put_plan, s->train.plan), "[run] out_dir");
  return NULL;
}

/* The run's length in steps, the lr schedule, the evaluation period, and
 * the metrics (metrics.jsonl, the progress display, TensorBoard, the
 * report, the step timers, the trace). */
static stoke_err *plan_length(run_state *s) {
  const stoke_run_config *rc = &s->rc;
  int64_t accumulate = rc->run.accumulate, per_epoch = stoke_loader_batches_per_epoch(s->train.loader);
  int64_t steps_per_epoch = per_epoch / accumulate > 0 ? per_epoch / accumulate : 1;
  int64_t total = rc->run.steps > 0 ? rc->run.steps : (int64_t)ceil(rc->run.epochs * (double)per_epoch / (double)accumulate);
  if (total < 1) total = 1;
  if (s->start_step >= total)
    stoke_log(STOKE_LOG_WARN, "run", "%s is at step %lld, and this run ends at step %lld: nothing to train; raise "
              "[run] steps or epochs to continue", rc->run.resume, (long long)s->start_step, (long long)total);
  s->total = total, s->per_epoch = per_epoch;
  /* in batches, not rounded: eval_every = 0.5 of 25 batches evaluates at 13, 25, 38, 50 (each epoch's end),
   * where a rounded 13 drifted to 26, 39, 52 */
  s->eval_period = rc->run.eval_every > 0 ? rc->run.eval_every * (double)per_epoch : 0;
  if (!rc->eval_data.source[0] && rc->run.keep_best)
    stoke_log(STOKE_LOG_WARN, "run", "%s: [run] keep_best = true, but there is no [eval_data] section: no evaluation "
              "loss to keep the best of", stoke_cfg_where(s->cfg, "run", "keep_best"));
  if (!rc->eval_data.source[0] && stoke_cfg_is_set(s->cfg, "run", "eval_every") && rc->run.eval_every > 0)
    stoke_log(STOKE_LOG_WARN, "run", "%s: [run] eval_every is set, but there is no [eval_data] section: nothing is "
              "evaluated; add one (a held-out split: e.g. the same source with another offset or path)",
              stoke_cfg_where(s->cfg, "run", "eval_every"));
  int64_t samples = s->train.batch * accumulate * s->world;
  STOKE_PROPAGATE(stoke_lr_schedule_make(rc, total, steps_per_epoch, samples, &s->sched));
  double flops = s->train.plan->train_flops * (double)accumulate;
  s->sum->flops_per_step = flops;
  snprintf(s->metrics_path, sizeof s->metrics_path, "%s/metrics.jsonl", s->dir);
  stoke_show show = rc->run.progress;
  int quiet = s->o->quiet;
  stoke_metrics_opts mo = {s->metrics_path, show == STOKE_SHOW_OFF || quiet ? STOKE_PROGRESS_OFF
                                 : show == STOKE_SHOW_BAR        ? STOKE_PROGRESS_BAR
                                 : show == STOKE_SHOW_LINES      ? STOKE_PROGRESS_LINES
                                 : isatty(2)                     ? STOKE_PROGRESS_BAR
                                                                 : STOKE_PROGRESS_LINES,
                           total, samples, quiet, s->start_step, flops, s->peak_flops, s->nvml,
                           s->o->time_warmup, s->o->time_steps};
  if (!strcmp(rc->run.tensorboard, "true")) mo.tensorboard_dir = s->dir; /* rank N's: in rank N's folder */
  else if (strcmp(rc->run.tensorboard, "false") && s->rank == 0) mo.tensorboard_dir = rc->run.tensorboard;
  mo.report_dir = s->dir, mo.run_name = s->run_name, mo.plan = s->train.plan;
  STOKE_TRY(stoke_trace_parse(rc->run.trace, &s->trace_first, &s->trace_last), "%s",
            stoke_cfg_where(s->cfg, "run", "trace"));
  mo.trace_first = s->trace_first, mo.trace_last = s->trace_last;
  STOKE_PROPAGATE(stoke_metrics_new(&mo, &s->metrics));
  STOKE_PROPAGATE(stoke_steptime_new(s->dev, s->dev_self, &s->steptime));
  if (s->trace_first) {
    char path[640];
    snprintf(path, sizeof path, "%s/trace.json", s->dir);
    STOKE_PROPAGATE(stoke_trace_new(path, s->trace_first, s->trace_last, s->rank, &s->trace));
    stoke_loader_on_fill(s->train.loader, stoke_trace_fill, s->trace);
  }
  return NULL;
}

/* cuda_graph as asked where it can be: not with profile_ops, not on a
 * device without graphs (warnings), never with a comm that cannot follow
 * a replayed graph (an error). */
static stoke_err *choose_graphs(run_state *s) {
  const char *where = stoke_cfg_where(s->cfg, "run", "cuda_graph");
  s->cuda_graph = s->rc.run.cuda_graph;
  stoke_nvtx_enable(s->rc.run.nvtx);
  if (s->cuda_graph && s->rc.run.profile_ops) {
    stoke_log(STOKE_LOG_WARN, "run", "%s: cuda_graph = true with profile_ops = true: the profile times each "
              "kernel on its own, so this run does not use graphs", where);
    s->cuda_graph = 0;
  } else if (s->cuda_graph && s->rc.run.detect_anomaly) {
    stoke_log(STOKE_LOG_WARN, "run", "%s: cuda_graph = true with detect_anomaly = true: the check reads every "
              "node's outputs back, so this run does not use graphs", where);
    s->cuda_graph = 0;
  } else if (s->cuda_graph && !s->dev->capture_begin) {
    stoke_log(STOKE_LOG_WARN, "run", "%s: cuda_graph = true, but the '%s' device has no graphs: running without",
              where, s->dev->name);
    s->cuda_graph = 0;
  }
  if (s->cuda_graph && s->dp && !stoke_dp_graphs(s->dp))
    return STOKE_ERR(STOKE_E_UNSUPPORTED,
                     "%s: cuda_graph = true with comm = %s: this comm cannot follow collectives inside a replayed "
                     "graph (no watch()); set [run] cuda_graph = false",
                     where, s->rc.run.comm);
  if (s->rc.run.detect_anomaly) {
    int scaler = s->prec->loss_scaling != STOKE_SCALING_NONE;
    STOKE_TRY(stoke_exec_anomaly(s->train.x, 1, scaler), "%s", stoke_cfg_where(s->cfg, "run", "detect_anomaly"));
    stoke_log(STOKE_LOG_INFO, "run",
              "[run] detect_anomaly = true: every node's outputs are read back and checked for NaN and inf%s "
              "(slow: for finding where a divergence starts)",
              scaler ? ", but the backward's gradients, where the loss scaler expects overflows and skips the step"
                     : "");
  }
  if (s->cuda_graph) STOKE_TRY(stoke_exec_graphs(s->train.x, 1), "%s", where);
  s->ops_reported = s->dp != NULL; /* counting records a step: no collectives in a capture */
  return NULL;
}

/* --dry-run: the training plan as the run would make it (batch_size =
 * auto and recompute = auto included), its memory and FLOPs, and no
 * training and no run folder: the answer before renting the GPU. With
 * [run] memory_gb no device is opened (the backends' kernel tables come
 * from their plugins; nothing is allocated or planned on a device);
 * without it, the device is asked for its free memory. */
stoke_err *run_dry(run_state *s) {
  const stoke_run_opts *o = s->o;
  const char *prec_name = s->rc.run.precision;
  stoke_summary *sum = s->sum;
  double budget, device;
  char device_name[160];
  s->n_engines = s->rc.run.n_backends;
  memcpy(s->engines, s->rc.run.backends, sizeof s->engines);
  if (s->rc.run.memory_gb > 0) STOKE_PROPAGATE(pick_device(s));
  else STOKE_PROPAGATE(open_backends(s, &prec_name));
  pick_layout(s);
  STOKE_PROPAGATE(run_memory_budget(s, &budget, &device, device_name, sizeof device_name));
  const stoke_precision_v1 *prec = stoke_find_precision(s->reg, prec_name);
  STOKE_PROPAGATE(run_plan_stream(s, &s->train, &s->rc.data, prec, 1));
  const stoke_plan *p = s->train.plan;
  if (!o->quiet) stoke_plan_report(p, stdout);
  double need = stoke_plan_device_bytes(p), act = (double)p->bytes[STOKE_BUF_ARENA];
  double without = p->recompute_report ? (double)p->arena_without_recompute : act;
  sum->flops_per_step = p->train_flops;
  sum->dry_batch = s->train.batch;
  sum->dry_plan_bytes = need;
  sum->dry_recompute_flops = p->recompute_flops;
  double unit = device >= 4 * 1073741824.0 ? 1073741824.0 : 1048576.0;
  const char *u = unit > 1048576.0 ? "GiB" : "MiB";
  printf("dry run (%s, %s): batch %lld; the plan needs %.2f %s of the %.2f %s budget (85%% of %.2f %s, %s)%s: "
         "activations %.2f %s (%.2f %s without recomputation), parameters, gradients and optimizer state %.2f %s; "
         "%.4g FLOPs per micro-batch, +%.1f%% recomputed; the kernels' workspaces are not in it (they are sized "
         "when the kernels are planned on the device, which a dry run does not do): the 15%% margin is for them\n",
         prec_name, s->dev->name, (long long)s->train.batch, need / unit, u, budget / unit, u, device / unit, u,
         device_name, need > budget ? " (DOES NOT FIT)" : "", act / unit, u, without / unit, u, (need - act) / unit, u,
         p->train_flops, p->train_flops > 0 ? 100 * p->recompute_flops / p->train_flops : 0.0);
  return NULL;
}

/* The config, read once; the optimizer's arguments from [optimizer]. */
stoke_err *run_read_config(run_state *s) {
  STOKE_PROPAGATE(stoke_run_config_read(s->cfg, &s->rc));
  s->opt.weight_decay = s->rc.optimizer.weight_decay;
  s->opt.max_norm = s->rc.optimizer.grad_clip;
  const stoke_optimizer_v1 *optimizer = stoke_find_optimizer(s->reg, s->rc.optimizer.name);
  if (optimizer->configure)
    STOKE_TRY(optimizer->configure(s->cfg, "optimizer", &s->opt), "configuring optimizer '%s'", s->rc.optimizer.name);
  return NULL;
}

/* The resolved config, the precision and the plan, printed once the run
 * is set up: an error found before training (a config value, a plugin, a
 * graph the compiler refuses) is the last thing on the screen, not
 * something above a hundred lines of config. */
static void announce(run_state *s) {
  if (s->o->quiet) return;
  printf("stoke: run '%s', resolved config (saved to %s/config.ini):\n", s->run_name, s->dir);
  fputs(s->config_text, stdout);
  run_report_precision(s->prec, s->train.g, 0);
  stoke_plan_report(s->train.plan, stdout);
}

/* A resolved config's text with `key`'s value in `section` replaced by
 * `value_now` (malloc'd; NULL when out of memory or the key is not there). */
static char *config_set(const char *text, const char *section, const char *key, const char *value_now) {
  size_t old;
  const char *v = config_find(text, section, key, &old);
  if (!v) return NULL;
  size_t n = strlen(text) - old + strlen(value_now) + 1;
  char *out = malloc(n);
  if (out) snprintf(out, n, "%.*s%s%s", (int)(v - text), text, value_now, v + old);
  return out;
}

/* The resolved config as this run runs it, in config.ini and in every
 * checkpoint's copy, written once the device is known: after the cpu
 * fallback it says backends = cpu and precision = fp32, so that the file
 * runs again as this run did, not as the GPU run it names. */
static stoke_err *write_config(run_state *s) {
  s->config_text = run_config_text(s->cfg);
  if (!s->config_text) return STOKE_ERR(STOKE_E_OOM, "out of memory for the resolved config");
  static const char *const ran[][3] = {{"run", "backends", "cpu"}, {"run", "precision", "fp32"}};
  for (int i = 0; s->cpu_fallback && i < 2; i++) {
    char *t = config_set(s->config_text, ran[i][0], ran[i][1], ran[i][2]);
    if (!t) continue;
    free(s->config_text);
    s->config_text = t;
  }
  char path[700];
  snprintf(path, sizeof path, "%s/config.ini", s->dir);
  STOKE_TRY(run_write_checked(path, put_text, s->config_text), "[run] out_dir");
  return NULL;
}

stoke_err *run_open(run_state *s) {
  /* before any folder, device or data is opened */
  const stoke_run_config *rc = &s->rc;
  /* resume = auto beside it is a fine-tuning job's restart command: its own checkpoint once there is one */
  if (rc->run.init_from[0] && rc->run.resume[0] && strcmp(rc->run.resume, "auto"))
    return STOKE_ERR(STOKE_E_INVALID, "%s: [run] init_from and resume both given: resume continues a run (its step, "
                     "optimizer and data), init_from starts a new one from weights; keep one (resume = auto beside "
                     "init_from continues the fine-tuning run's own checkpoint once it has one)",
                     stoke_cfg_where(s->cfg, "run", "init_from"));
  if (rc->run.steps <= 0 && !(rc->run.epochs > 0))
    return STOKE_ERR(STOKE_E_INVALID, "%s: [run] steps = 0 and epochs = 0: nothing to train; set one of them",
                     stoke_cfg_where(s->cfg, "run", stoke_cfg_is_set(s->cfg, "run", "epochs") ? "epochs" : "steps"));
  STOKE_PROPAGATE(find_place(s));
  STOKE_PROPAGATE(open_folder(s));
  STOKE_PROPAGATE(run_open_device(s));
  STOKE_PROPAGATE(write_config(s));
  STOKE_PROPAGATE(open_data(s));
  STOKE_PROPAGATE(plan_length(s));
  STOKE_PROPAGATE(choose_graphs(s));
  if (s->rc.run.checkpoint) snprintf(s->ckpt, sizeof s->ckpt, "%s/" RUN_CKPT_NAME, s->dir);
  STOKE_PROPAGATE(run_check_room(s));
  announce(s);
  s->good = s->start_step, s->good_epoch = s->resume.epoch;
  run_signals_catch(&s->sg);
  return NULL;
}
