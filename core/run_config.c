/* core/run_config.c: the core's sections and keys ([run], [plugins], [data],
 * [eval_data], [model], [loss], [optimizer]), `--help-config`, and the one
 * read of them into the typed stoke_run_config the run uses. */
#include <stdlib.h>
#include <string.h>

#include "stoke/core.h"
#include "stoke/registry.h"
#include "stoke/run.h"
#include "stoke/run_config.h"

/* ------------------------------------------------------------ the keys */

static const stoke_cfg_key_v1 run_keys[] = {
    {"config_version", STOKE_CFG_INT, "1", 1, 1, NULL, "version of this config format (1)"},
    {"name", STOKE_CFG_STR, "", 0, 0, NULL, "run name (default: the INI file's name)"},
    {"backends", STOKE_CFG_LIST, "cpu", 0, 0, NULL,
     "ordered compute backends; each node runs on the first that has a kernel for it"},
    {"precision", STOKE_CFG_STR, "fp32", 0, 0, NULL,
     "precision policy: fp32, tf32, bf16, fp16 (dynamic loss scaler), or one from a plugin, loaded by its name "
     "(the cpu backend runs fp32, or f64)"},
    {"comm", STOKE_CFG_STR, "single", 0, 0, NULL,
     "communication: single (one process) or nccl (data parallel, one process per GPU, started by "
     "tools/launch, torchrun, srun or mpirun; each rank reads its shard, gradients are averaged)"},
    {"bucket_mb", STOKE_CFG_FLOAT, "25", 0.001, 1e6, NULL,
     "data parallel: MiB of the flat gradient buffer all-reduced per call, each launched as soon as "
     "backward produced it (the first bucket at most 1 MiB, as DDP's bucket_cap_mb)"},
    {"comm_timeout", STOKE_CFG_FLOAT, "300", 1, 1e6, NULL,
     "data parallel: seconds a collective may take before the communicator is aborted and the run "
     "fails with the rank and the operation (a rank died or stalled)"},
    {"device", STOKE_CFG_ENUM, "auto", 0, 0, "auto|gpu|cpu",
     "auto: the backends given, or the cpu backend (fp32) with a warning when they need a GPU that is "
     "not there; gpu: a missing GPU, or backends that run on the CPU, are an error; cpu: the cpu backend (fp32) "
     "whatever [run] backends lists"},
    {"layout", STOKE_CFG_ENUM, "auto", 0, 0, "auto|nchw|nhwc",
     "memory order of image activations (auto: nhwc on a GPU, as channels_last; nchw on the CPU)"},
    {"device_index", STOKE_CFG_INT, "0", 0, 1024, NULL, "which device of the backend"},
    {"steps", STOKE_CFG_INT, "0", 0, 1e15, NULL, "optimizer steps to run (0: use epochs)"},
    {"epochs", STOKE_CFG_FLOAT, "1", 0, 1e9, NULL, "passes over the training data when steps = 0"},
    {"accumulate", STOKE_CFG_INT, "1", 1, 1 << 20, NULL,
     "micro-batches per optimizer step (gradient accumulation)"},
    {"seed", STOKE_CFG_INT, "0", 0, 9.2e18, NULL, "seed of every random choice"},
    {"log_every", STOKE_CFG_INT, "10", 1, 1e12, NULL,
     "read the loss back and log every N steps (the only host sync)"},
    {"out_dir", STOKE_CFG_STR, "", 0, 0, NULL,
     "where config.ini, plan.txt and metrics.jsonl go (default runs/<name>)"},
    {"progress", STOKE_CFG_ENUM, "auto", 0, 0, "auto|bar|lines|off",
     "progress display: a bar on a terminal (auto), log lines, or nothing"},
    {"eval_every", STOKE_CFG_FLOAT, "1", 0, 1e9, NULL,
     "evaluate on [eval_data] every N epochs (and at the end); 0: only at the end"},
    {"checkpoint_every", STOKE_CFG_INT, "0", 0, 1e15, NULL,
     "write <out_dir>/checkpoint.safetensors every N steps (0: only at the end and on Ctrl-C)"},
    {"profile_ops", STOKE_CFG_BOOL, "false", 0, 0, NULL,
     "time every kernel from the second step on and print GPU time per op, engine and node at the end "
     "(synchronizes every step: for finding where time goes, not for speed figures)"},
    {"detect_anomaly", STOKE_CFG_BOOL, "false", 0, 0, NULL,
     "find where a NaN or inf starts, as PyTorch's torch.autograd.detect_anomaly: every node's outputs read back "
     "and checked after it runs, and the first non-finite value named with its node, op and tensor (eager, "
     "one sync per node: for debugging a diverged run, slow)"},
    {"checkpoint", STOKE_CFG_BOOL, "true", 0, 0, NULL,
     "write checkpoints (false: none at all, e.g. for benchmarks)"},
    {"resume", STOKE_CFG_STR, "", 0, 0, NULL,
     "continue from this checkpoint file; auto: from out_dir's checkpoint when it has one, else start (a "
     "preempted job's restart command)"},
    {"keep_best", STOKE_CFG_BOOL, "false", 0, 0, NULL,
     "also keep the checkpoint of the lowest evaluation loss so far in out_dir/best.safetensors (Lightning's "
     "ModelCheckpoint(monitor=\"val_loss\")), its loss and step in best.json; a resume goes on comparing with it"},
    {"init_from", STOKE_CFG_STR, "", 0, 0, NULL,
     "fine-tune from this checkpoint's weights (nanoGPT's init_from; PyTorch's load_state_dict(strict=False)): step "
     "0 and a fresh optimizer; a tensor the file lacks or has in another shape (a new classifier head) keeps its "
     "initialization, and the log lists them; a PyTorch safetensors state_dict works too"},
    {"overwrite", STOKE_CFG_BOOL, "false", 0, 0, NULL,
     "start over in an out_dir that holds another run's checkpoint (moved aside to checkpoint.safetensors.replaced); without it "
     "such a run is refused unless run.resume names that checkpoint"},
    {"deterministic", STOKE_CFG_BOOL, "false", 0, 0, NULL,
     "bitwise-reproducible runs: deterministic algorithms only (the cpu backend always is)"},
    {"loss_scale_init", STOKE_CFG_FLOAT, "0", 0, 1e38, NULL,
     "fp16: the loss scaler's first scale (0: the policy's, 65536)"},
    {"loss_scale_growth", STOKE_CFG_INT, "0", 0, 1e9, NULL,
     "fp16: clean steps before the scale doubles (0: the policy's, 2000)"},
    {"fuse", STOKE_CFG_BOOL, "false", 0, 0, NULL,
     "let the compiler fuse linear -> relu|gelu(tanh) -> linear into cuBLASLt's activation epilogues "
     "(forward *_AUX_BIAS, backward DRELU/DGELU in the next linear's product) where the backend has them, and "
     "move the bias of a linear whose output only an add_layer_norm reads into it (add_bias_layer_norm: the "
     "bias gradient summed in the layer norm's backward pass); off by default: on an H100 the bf16 mlp bench ran 10% slower with ReLU (cuBLASLt's DRELU product is "
     "slow) and no faster with GELU. Batch norm + ReLU (+ add) fuse without it when an engine listed before "
     "the batch norm's, or the batch norm's own GPU engine, has them (backends = fused, ...)"},
    {"grad_sums_in_place", STOKE_CFG_BOOL, "true", 0, 0, NULL,
     "where two backward paths meet (a residual block's input), the second kernel adds its gradient into the "
     "first's buffer when it can (din_accumulate) instead of a separate add node; false keeps the adds (A/B)"},
    {"fuse_bias_norm", STOKE_CFG_BOOL, "true", 0, 0, NULL,
     "with fuse = true: a linear whose output only an add_layer_norm reads gives its bias to it "
     "(add_bias_layer_norm), whose backward sums the bias gradient in its own pass; false keeps the bias in "
     "the linear (A/B)"},
    {"fwd_in_bwd", STOKE_CFG_BOOL, "true", 0, 0, NULL,
     "the loss's forward (softmax_ce) done by its backward kernel where that kernel can (the GPU's): one read "
     "of the logits for the loss and dlogits instead of two; false runs them as two nodes (A/B)"},
    {"pool_index", STOKE_CFG_BOOL, "true", 0, 0, NULL,
     "in training, max_pool2d saves each window's argmax (one byte per output) in its forward and its backward "
     "reads that instead of the input, as PyTorch's does: the input need not stay alive and the windows are not "
     "scanned again (max_pool2d_idx); false keeps max_pool2d (A/B)"},
    {"filter_layout", STOKE_CFG_ENUM, "auto", 0, 0, "auto|oihw|ohwi",
     "memory order of convolution filters in an NHWC graph: ohwi keeps [O, kh, kw, C] (channels_last, as PyTorch "
     "keeps them), which cuDNN's NHWC kernels read as it is; oihw keeps [O, C, kh, kw], which they transpose on "
     "every call (A/B); auto: ohwi on a GPU. Checkpoints hold [O, C, kh, kw] either way"},
    {"fuse_shortcut", STOKE_CFG_BOOL, "true", 0, 0, NULL,
     "a ResNet block's strided shortcut batch norm joined to the block's batch norm, add and ReLU in one node "
     "(bn_add_bn_relu, where an engine has it: fused): the shortcut's normalized output and the residual's "
     "gradient are neither written nor read back; false keeps the batch_norm node (A/B)"},
    {"wgrad_stream", STOKE_CFG_INT, "0", 0, 64, NULL,
     "0: every kernel on the compute stream. k > 0: backward kernels that can (cuDNN's convolutions) compute "
     "their weight gradients on a second stream, overlapping the input-gradient chain; the compute stream "
     "waits for each before the k-th such node after it. The memory they read stays allocated until then "
     "(the plan's activations grow) and a second workspace is allocated. Off under data parallel and while "
     "profiling (run.profile_ops)"},
    {"cuda_graph", STOKE_CFG_BOOL, "false", 0, 0, NULL,
     "capture the whole step (forward, backward, optimizer, loss scaler) once as a CUDA graph and replay "
     "it: one launch per step instead of one per kernel"},
    {"conv_autotune", STOKE_CFG_BOOL, "true", 0, 0, NULL,
     "time the candidate convolution (cuDNN), matmul (cuBLASLt) and attention (cuDNN) algorithms once per "
     "shape and keep the fastest (cudnn.benchmark)"},
    {"recompute", STOKE_CFG_STR, "none", 0, 0, NULL,
     "activation recomputation: none; auto (the planner re-runs in backward the forward nodes cheapest to "
     "recompute per byte they free, until the plan fits the memory budget); or node-name patterns, each "
     "module they match recomputed as one segment (h.*.attn, layer3.*); the plan report says what is "
     "recomputed, the memory saved and the FLOPs added"},
    {"memory_gb", STOKE_CFG_FLOAT, "0", 0, 1e6, NULL,
     "device memory to plan for, GiB (0: the device's free memory); batch_size = auto and recompute = auto "
     "fit 85% of it. With --dry-run it plans for a GPU this machine does not have (80: an H100)"},
    {"tensorboard", STOKE_CFG_STR, "false", 0, 0, NULL,
     "TensorBoard scalars (loss, lr, samples/s, step times, data wait, MFU, GPU use, loss scale, evaluation) "
     "at every logged step: true writes the event file into out_dir (tensorboard --logdir runs), a folder "
     "writes it there, false none"},
    {"trace", STOKE_CFG_STR, "", 0, 0, NULL,
     "steps to trace into out_dir/trace.json (Chrome trace events: open in ui.perfetto.dev or chrome://tracing), "
     "e.g. 20-24: the step loop, the loader's workers with arrows to the step using each batch, the compute "
     "stream (each node as in plan.txt with its engine); traced steps time every node and wait for the device at "
     "their end, and under cuda_graph run eagerly, outside the graph (eager times, the same results); the others "
     "run as usual"},
    {"nvtx", STOKE_CFG_BOOL, "true", 0, 0, NULL,
     "NVTX ranges around each step, node and loader batch, for Nsight Systems (nsys profile shows stoke's "
     "names); with no profiler attached a range costs a branch"},
};

static const stoke_cfg_key_v1 plugin_keys[] = {
    {"path", STOKE_CFG_LIST, "", 0, 0, NULL,
     "extra folders searched for libstoke_<name>.so, before STOKE_PLUGIN_PATH and the binary's folder"},
    {"load", STOKE_CFG_LIST, "", 0, 0, NULL, "extra plugins to load by name (e.g. swish: new ops)"},
};

static const stoke_cfg_key_v1 data_keys[] = {
    {"source", STOKE_CFG_STR, "synthetic", 0, 0, NULL, "data source plugin: synthetic, ..."},
    {"batch_size", STOKE_CFG_STR, "128", 0, 0, NULL,
     "samples per micro-batch, or auto: the largest power of two whose plan fits 85% of the device's "
     "free memory"},
    {"workers", STOKE_CFG_STR, "2", 0, 0, NULL,
     "loader worker threads, or auto: time 1, 2, 4, ... up to the core count at start and keep the fastest"},
    {"prefetch", STOKE_CFG_INT, "4", 1, 1024, NULL, "batches prepared ahead (ring of pinned buffers)"},
    {"shuffle", STOKE_CFG_BOOL, "true", 0, 0, NULL, "reshuffle every epoch (seeded by seed, epoch)"},
    {"drop_last", STOKE_CFG_BOOL, "true", 0, 0, NULL,
     "drop the last incomplete batch of an epoch (training needs true: the plan's batch is fixed)"},
    {"mean", STOKE_CFG_LIST, "0", 0, 0, NULL,
     "u8 images: per-channel mean of x/255 (e.g. 0.485, 0.456, 0.406), subtracted on the device"},
    {"std", STOKE_CFG_LIST, "1", 0, 0, NULL, "u8 images: per-channel std of x/255"},
    {"max_skipped", STOKE_CFG_FLOAT, "0.01", 1e-9, 1, NULL,
     "stop when more than this fraction of the first 1000 samples read is unusable (a source error or a label "
     "outside [0, classes)): the data or the source is wrong throughout; below it such samples are replaced and "
     "counted by reason in the summary"},
    {"on_device", STOKE_CFG_BOOL, "false", 0, 0, NULL,
     "copy the first batch to the device once and train on it every step: times the step alone "
     "(BENCH.md's synthetic workloads), not a way to train"},
};

static const stoke_cfg_key_v1 eval_data_keys[] = {
    {"source", STOKE_CFG_STR, "", 0, 0, NULL,
     "held-out data source (empty: no evaluation); its own keys go here too"},
    {"batch_size", STOKE_CFG_STR, "256", 0, 0, NULL, "samples per evaluation batch (auto: the training one)"},
    {"workers", STOKE_CFG_STR, "2", 0, 0, NULL, "loader worker threads (auto: as for training)"},
    {"prefetch", STOKE_CFG_INT, "4", 1, 1024, NULL, "batches prepared ahead"},
};

static const stoke_cfg_key_v1 model_keys[] = {
    {"name", STOKE_CFG_STR, "mlp", 0, 0, NULL, "model builder plugin: mlp, ..."},
};

static const stoke_cfg_key_v1 loss_keys[] = {
    {"label_smoothing", STOKE_CFG_FLOAT, "0", 0, 0.999, NULL, "as nn.CrossEntropyLoss(label_smoothing)"},
};

static const stoke_cfg_key_v1 optimizer_keys[] = {
    {"name", STOKE_CFG_STR, "sgd", 0, 0, NULL,
     "the optimizer: sgd (torch.optim.SGD) or adamw (torch.optim.AdamW), or one from a plugin; its own keys "
     "(momentum, nesterov; beta1, beta2, eps) go here too"},
    {"lr", STOKE_CFG_FLOAT, "0.01", 0, 1e6, NULL, "learning rate"},
    {"weight_decay", STOKE_CFG_FLOAT, "0", 0, 1e3, NULL,
     "L2 penalty (SGD) or decoupled weight decay (AdamW)"},
    {"weight_decay_1d", STOKE_CFG_BOOL, "true", 0, 0, NULL,
     "weight decay on 1-D parameters too (biases, norm scales), as torch.optim does; false: only on parameters "
     "of 2 or more dimensions (GPT-2's and nanoGPT's groups)"},
    {"grad_clip", STOKE_CFG_FLOAT, "0", 0, 1e12, NULL,
     "clip the gradients to this global L2 norm before each update (torch.nn.utils.clip_grad_norm_; 0: off); "
     "the norm is computed on the device, with no host sync"},
    {"schedule", STOKE_CFG_ENUM, "constant", 0, 0, "constant|cosine|step",
     "after warm-up: constant lr, cosine decay to min_lr at the last step (nanoGPT's get_lr), or x gamma every step_epochs"},
    {"warmup_epochs", STOKE_CFG_FLOAT, "0", 0, 1e6, NULL, "linear warm-up from ~0 to lr"},
    {"min_lr", STOKE_CFG_FLOAT, "0", 0, 1e6, NULL,
     "cosine: the lr of the last step, at most lr (scaled with lr by lr_scale_with_batch)"},
    {"step_epochs", STOKE_CFG_FLOAT, "0", 0, 1e6, NULL, "step: epochs between decays"},
    {"gamma", STOKE_CFG_FLOAT, "0.1", 0, 1, NULL, "step: decay factor"},
    {"lr_scale_with_batch", STOKE_CFG_BOOL, "false", 0, 0, NULL,
     "linear scaling rule: lr x global batch / base_batch (Goyal et al.)"},
    {"base_batch", STOKE_CFG_INT, "256", 1, 1 << 24, NULL, "the batch size lr is given for"},
};

#define DECLARE(c, sec, help, keys) stoke_cfg_declare(c, sec, help, keys, (int)(sizeof keys / sizeof *keys))

stoke_err *stoke_declare_core_keys(stoke_cfg *c) {
  STOKE_PROPAGATE(DECLARE(c, "run", "the run: backends, precision, length, seed, logging", run_keys));
  STOKE_PROPAGATE(DECLARE(c, "plugins", "where plugins are found and extra ones to load", plugin_keys));
  STOKE_PROPAGATE(DECLARE(c, "data", "training data: the source and the loader; the source's own keys go here too", data_keys));
  STOKE_PROPAGATE(DECLARE(c, "eval_data", "held-out data for evaluation (loss, top-1 accuracy)", eval_data_keys));
  STOKE_PROPAGATE(DECLARE(c, "model", "the model builder; its own keys go here too", model_keys));
  STOKE_PROPAGATE(DECLARE(c, "loss", "softmax cross-entropy on the model's logits", loss_keys));
  STOKE_PROPAGATE(DECLARE(c, "optimizer", "the optimizer, updating the flat parameter buffer", optimizer_keys));
  return NULL;
}


static void print_op(void *ctx, const void *part, const char *origin) {
  static const char *types[] = {"int", "float", "ints", "str", "floats"};
  const stoke_op_type_v1 *op = part;
  FILE *f = ctx;
  fprintf(f, "  %s: %s%s%s%s\n", op->name, op->help ? op->help : "", strcmp(origin, "built-in") ? " [" : "",
          strcmp(origin, "built-in") ? origin : "", strcmp(origin, "built-in") ? "]" : "");
  for (int i = 0; i < op->n_attrs; i++)
    fprintf(f, "      %s (%s, %s%s): %s\n", op->attrs[i].name,
            (unsigned)op->attrs[i].type < 5 ? types[op->attrs[i].type] : "?", op->attrs[i].def ? "default " : "required",
            op->attrs[i].def ? op->attrs[i].def : "", op->attrs[i].help ? op->attrs[i].help : "");
}

stoke_err *stoke_help_config(const char *const *plugin_dirs, int n_plugin_dirs, FILE *f) {
  stoke_cfg *c = stoke_cfg_new();
  if (!c) return STOKE_ERR(STOKE_E_OOM, "out of memory");
  stoke_err *e = stoke_declare_core_keys(c);
  if (e) {
    stoke_cfg_free(c);
    return e;
  }
  fprintf(f, "stoke run configuration: every section and key, with type, default and help.\n"
             "Set keys in the INI file or on the command line as section.key=value.\n\n");
  stoke_cfg_help(c, f);
  stoke_cfg_free(c);
  /* the keys of every model, source and optimizer, built in or a plugin on the search path */
  stoke_registry *r = NULL;
  STOKE_PROPAGATE(stoke_registry_new(&r));
  for (int i = 0; i < n_plugin_dirs; i++) stoke_registry_add_path(r, plugin_dirs[i]);
  stoke_registry_load_every(r, NULL, f);
  static const char *kinds[] = {"model", "source", "optimizer"}, *sections[] = {"model", "data", "optimizer"};
  static const char *keys_of[] = {"name", "source", "name"};
  for (int k = 0; k < 3; k++) {
    char names[1024];
    stoke_registry_names(r, kinds[k], names, sizeof names);
    for (char *save = NULL, *t = strtok_r(names, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
      const stoke_cfg_key_v1 *keys = NULL;
      int n = 0;
      const char *help = "";
      if (k == 0) {
        const stoke_model_v1 *m = stoke_find_model(r, t);
        keys = m->keys, n = m->n_keys, help = m->help;
      } else if (k == 1) {
        const stoke_source_v1 *s = stoke_find_source(r, t);
        keys = s->keys, n = s->n_keys, help = s->help;
      } else {
        const stoke_optimizer_v1 *o = stoke_find_optimizer(r, t);
        keys = o->keys, n = o->n_keys, help = o->help;
      }
      stoke_cfg *pc = stoke_cfg_new();
      if (!pc) break;
      char sh[256];
      snprintf(sh, sizeof sh, "with %s = %s: %s", keys_of[k], t, help);
      stoke_err_free(stoke_cfg_declare(pc, sections[k], sh, keys, n));
      fprintf(f, "\n");
      stoke_cfg_help(pc, f);
      stoke_cfg_free(pc);
    }
  }
  /* the ops, with their attributes: what a model's activation key (or a
   * builder's node()) takes, as name(attr=value, ...) */
  fprintf(f, "\nops (an INI key naming an op may give its attributes: leaky_relu(negative_slope=0.1)):\n");
  stoke_registry_each(r, "op", print_op, f);
  stoke_registry_free(r);
  return NULL;
}


/* "0.485, 0.456" (a LIST key) as the attribute text "0.485:0.456". */
static stoke_err *floats_attr(const stoke_cfg *c, const char *key, char *out, size_t cap) {
  const char *items[STOKE_CFG_MAX_LIST];
  int n;
  STOKE_PROPAGATE(stoke_cfg_list(c, "data", key, items, &n));
  size_t used = 0;
  out[0] = 0;
  for (int i = 0; i < n; i++) {
    char *end;
    double v = strtod(items[i], &end);
    if (end == items[i] || *end || !isfinite(v))
      return STOKE_ERR(STOKE_E_INVALID, "%s: [data] %s: '%s' is not a finite number",
                       stoke_cfg_where(c, "data", key), key, items[i]);
    if (!strcmp(key, "std") && !(v > 0))
      return STOKE_ERR(STOKE_E_INVALID, "%s: [data] std: %s must be > 0 (the inputs are divided by it)",
                       stoke_cfg_where(c, "data", key), items[i]);
    int k = snprintf(out + used, cap - used, "%s%s", i ? ":" : "", items[i]);
    if (k < 0 || (size_t)k >= cap - used)
      return STOKE_ERR(STOKE_E_INVALID, "%s: [data] %s: the list is longer than %zu characters (one value a "
                       "channel, e.g. 0.485, 0.456, 0.406)", stoke_cfg_where(c, "data", key), key, cap - 1);
    used += (size_t)k;
  }
  return NULL;
}

/* A count key that may also say "auto" (*n = 0): batch_size, workers. */
static stoke_err *count_or_auto(const stoke_cfg *c, const char *section, const char *key, int64_t max,
                                const char *what, int64_t *n) {
  const char *v;
  STOKE_PROPAGATE(stoke_cfg_str(c, section, key, &v));
  if (!strcmp(v, "auto")) {
    *n = 0;
    return NULL;
  }
  char *end;
  long long x = strtoll(v, &end, 10);
  if (end == v || *end || x < 1 || x > max)
    return STOKE_ERR(STOKE_E_INVALID, "%s: [%s] %s = '%s': a %s (1 to %lld) or auto",
                     stoke_cfg_where(c, section, key), section, key, v, what, (long long)max);
  *n = x;
  return NULL;
}

/* One of the names of an ENUM key's choices, by its index. */
static int choice(const char *v, const char *const *names, int n) {
  for (int i = 0; i < n; i++)
    if (!strcmp(v, names[i])) return i;
  return 0;
}

static stoke_err *read_data(const stoke_cfg *c, const char *section, stoke_data_config *d) {
  d->section = section; /* the source's name: stoke_run_config_names */
  if (!d->source[0]) return NULL; /* [eval_data] without a source: no evaluation */
  STOKE_PROPAGATE(count_or_auto(c, section, "batch_size", 1 << 24, "number of samples", &d->batch));
  STOKE_PROPAGATE(count_or_auto(c, section, "workers", 1024, "thread count", &d->workers));
  STOKE_PROPAGATE(stoke_cfg_int(c, section, "prefetch", &d->prefetch));
  if (strcmp(section, "data")) return NULL;
  STOKE_PROPAGATE(stoke_cfg_bool(c, section, "shuffle", &d->shuffle));
  STOKE_PROPAGATE(stoke_cfg_bool(c, section, "drop_last", &d->drop_last));
  /* The plan's batch is fixed (one compiled graph, CUDA graphs), so a short last batch would run with the
   * previous batch's rows (or never-written ones) in its tail: refused, not trained on. */
  if (!d->drop_last)
    return STOKE_ERR(STOKE_E_INVALID,
                     "%s: [data] drop_last = false is not supported for training: every step runs the plan's fixed "
                     "batch of batch_size samples, so the last short batch of an epoch cannot be trained on its own. "
                     "Keep drop_last = true (the default: each epoch's remainder is dropped, a different one each "
                     "epoch when shuffled), or pick a batch_size that divides the data set",
                     stoke_cfg_where(c, section, "drop_last"));
  STOKE_PROPAGATE(stoke_cfg_bool(c, section, "on_device", &d->on_device));
  STOKE_PROPAGATE(stoke_cfg_float(c, section, "max_skipped", &d->max_skipped));
  STOKE_PROPAGATE(floats_attr(c, "mean", d->mean, sizeof d->mean));
  STOKE_PROPAGATE(floats_attr(c, "std", d->std, sizeof d->std));
  return NULL;
}

static stoke_err *read_run(const stoke_cfg *c, stoke_run_config *rc) {
  static const char *devices[] = {"auto", "gpu", "cpu"}, *shows[] = {"auto", "bar", "lines", "off"};
  static const char *layouts[] = {"auto", "nchw", "nhwc"};
  const char *v;
#define RUN(fn, key, out) STOKE_PROPAGATE(fn(c, "run", key, out))
  RUN(stoke_cfg_str, "name", &rc->run.name);
  RUN(stoke_cfg_str, "out_dir", &rc->run.out_dir);
  RUN(stoke_cfg_str, "resume", &rc->run.resume);
  RUN(stoke_cfg_str, "init_from", &rc->run.init_from);
  RUN(stoke_cfg_str, "device", &v);
  rc->run.device = (stoke_device_choice)choice(v, devices, 3);
  RUN(stoke_cfg_str, "layout", &v);
  rc->run.layout = (stoke_layout)choice(v, layouts, 3); /* STOKE_LAYOUT_ANY, STOKE_NCHW, STOKE_NHWC */
  static const char *filter_layouts[] = {"auto", "oihw", "ohwi"};
  RUN(stoke_cfg_str, "filter_layout", &v);
  rc->run.filter_layout = choice(v, filter_layouts, 3);
  RUN(stoke_cfg_str, "progress", &v);
  rc->run.progress = (stoke_show)choice(v, shows, 4);
  RUN(stoke_cfg_int, "device_index", &rc->run.device_index);
  RUN(stoke_cfg_int, "steps", &rc->run.steps);
  RUN(stoke_cfg_int, "wgrad_stream", &rc->run.wgrad_stream);
  RUN(stoke_cfg_int, "accumulate", &rc->run.accumulate);
  RUN(stoke_cfg_int, "seed", &rc->run.seed);
  RUN(stoke_cfg_int, "log_every", &rc->run.log_every);
  RUN(stoke_cfg_int, "checkpoint_every", &rc->run.checkpoint_every);
  RUN(stoke_cfg_int, "loss_scale_growth", &rc->run.loss_scale_growth);
  RUN(stoke_cfg_float, "bucket_mb", &rc->run.bucket_mb);
  RUN(stoke_cfg_float, "comm_timeout", &rc->run.comm_timeout);
  RUN(stoke_cfg_float, "epochs", &rc->run.epochs);
  RUN(stoke_cfg_float, "eval_every", &rc->run.eval_every);
  RUN(stoke_cfg_float, "loss_scale_init", &rc->run.loss_scale_init);
  RUN(stoke_cfg_bool, "profile_ops", &rc->run.profile_ops);
  RUN(stoke_cfg_bool, "detect_anomaly", &rc->run.detect_anomaly);
  RUN(stoke_cfg_bool, "keep_best", &rc->run.keep_best);
  RUN(stoke_cfg_bool, "checkpoint", &rc->run.checkpoint);
  RUN(stoke_cfg_bool, "overwrite", &rc->run.overwrite);
  RUN(stoke_cfg_bool, "deterministic", &rc->run.deterministic);
  RUN(stoke_cfg_bool, "fuse", &rc->run.fuse);
  RUN(stoke_cfg_bool, "grad_sums_in_place", &rc->run.grad_sums_in_place);
  RUN(stoke_cfg_bool, "fwd_in_bwd", &rc->run.fwd_in_bwd);
  RUN(stoke_cfg_bool, "pool_index", &rc->run.pool_index);
  RUN(stoke_cfg_bool, "fuse_shortcut", &rc->run.fuse_shortcut);
  RUN(stoke_cfg_bool, "fuse_bias_norm", &rc->run.fuse_bias_norm);
  RUN(stoke_cfg_bool, "cuda_graph", &rc->run.cuda_graph);
  RUN(stoke_cfg_bool, "conv_autotune", &rc->run.conv_autotune);
  RUN(stoke_cfg_str, "recompute", &rc->run.recompute);
  RUN(stoke_cfg_float, "memory_gb", &rc->run.memory_gb);
  RUN(stoke_cfg_str, "tensorboard", &rc->run.tensorboard);
  if (!rc->run.tensorboard[0])
    return STOKE_ERR(STOKE_E_INVALID, "%s: [run] tensorboard is empty: true (the event file in out_dir), false, or "
                     "a folder", stoke_cfg_where(c, "run", "tensorboard"));
  RUN(stoke_cfg_str, "trace", &rc->run.trace);
  RUN(stoke_cfg_bool, "nvtx", &rc->run.nvtx);
#undef RUN
  return NULL;
}

static stoke_err *read_optimizer(const stoke_cfg *c, stoke_run_config *rc) {
  static const char *kinds[] = {"constant", "cosine", "step"}; /* stoke_lr_kind's order */
  const char *v;
#define OPT(fn, key, out) STOKE_PROPAGATE(fn(c, "optimizer", key, out))
  OPT(stoke_cfg_float, "lr", &rc->optimizer.lr);
  OPT(stoke_cfg_float, "weight_decay", &rc->optimizer.weight_decay);
  OPT(stoke_cfg_bool, "weight_decay_1d", &rc->optimizer.weight_decay_1d);
  OPT(stoke_cfg_float, "grad_clip", &rc->optimizer.grad_clip);
  OPT(stoke_cfg_str, "schedule", &v);
  rc->optimizer.schedule = (stoke_lr_kind)choice(v, kinds, 3);
  OPT(stoke_cfg_float, "warmup_epochs", &rc->optimizer.warmup_epochs);
  OPT(stoke_cfg_float, "min_lr", &rc->optimizer.min_lr);
  OPT(stoke_cfg_float, "step_epochs", &rc->optimizer.step_epochs);
  OPT(stoke_cfg_float, "gamma", &rc->optimizer.gamma);
  OPT(stoke_cfg_bool, "lr_scale_with_batch", &rc->optimizer.lr_scale_with_batch);
  OPT(stoke_cfg_int, "base_batch", &rc->optimizer.base_batch);
#undef OPT
  return NULL;
}

stoke_err *stoke_run_config_names(const stoke_cfg *c, stoke_run_config *rc) {
  *rc = (stoke_run_config){.cfg = c};
  STOKE_PROPAGATE(stoke_cfg_list(c, "plugins", "path", rc->plugins.path, &rc->plugins.n_path));
  STOKE_PROPAGATE(stoke_cfg_list(c, "plugins", "load", rc->plugins.load, &rc->plugins.n_load));
  STOKE_PROPAGATE(stoke_cfg_list(c, "run", "backends", rc->run.backends, &rc->run.n_backends));
  STOKE_PROPAGATE(stoke_cfg_str(c, "model", "name", &rc->model.name));
  STOKE_PROPAGATE(stoke_cfg_str(c, "data", "source", &rc->data.source));
  STOKE_PROPAGATE(stoke_cfg_str(c, "eval_data", "source", &rc->eval_data.source));
  STOKE_PROPAGATE(stoke_cfg_str(c, "optimizer", "name", &rc->optimizer.name));
  STOKE_PROPAGATE(stoke_cfg_str(c, "run", "precision", &rc->run.precision));
  return stoke_cfg_str(c, "run", "comm", &rc->run.comm);
}

stoke_err *stoke_run_config_read(const stoke_cfg *c, stoke_run_config *rc) {
  STOKE_PROPAGATE(stoke_run_config_names(c, rc));
  STOKE_PROPAGATE(read_run(c, rc));
  STOKE_PROPAGATE(read_data(c, "data", &rc->data));
  STOKE_PROPAGATE(read_data(c, "eval_data", &rc->eval_data));
  STOKE_PROPAGATE(stoke_cfg_float(c, "loss", "label_smoothing", &rc->loss.label_smoothing));
  return read_optimizer(c, rc);
}
