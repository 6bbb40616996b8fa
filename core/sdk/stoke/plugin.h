/* stoke/plugin.h: the plugin SDK. A plugin includes the headers of this
 * folder (core/sdk/stoke/) and nothing else of stoke, and exports exactly
 * one symbol: `const stoke_plugin_v1 stoke_plugin_v1_entry`, see the bottom.
 *
 * Every part a plugin registers (op type, backend, source, model, precision
 * policy, comm, optimizer) starts, like the entry, with its ABI version and
 * struct size, checked by the loader before anything else is read:
 * initialize them with STOKE_ABI(type). The ABI history is in
 * plugins/README.md. Once released, a struct is frozen: new fields go into
 * a _v2 struct appended after the _v1 fields, and `struct_size` tells them
 * apart. */
#ifndef STOKE_PLUGIN_H
#define STOKE_PLUGIN_H

#include <stdarg.h>
#include <stdint.h>

#include "stoke/status.h"
#include "stoke/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 5: stoke_kernel_args_v1.side_stream and side_workspace, a backward
 * kernel's parameter gradients on a second stream (STOKE_KCAP_SIDE_GRADS;
 * see plugins/README.md, "ABI history") */
#define STOKE_ABI_VERSION 5u
#define STOKE_PLUGIN_SYMBOL "stoke_plugin_v1_entry"

/* The first fields of every part a plugin registers, in this order. */
typedef struct stoke_part_v1 {
  uint32_t abi_version; /* STOKE_ABI_VERSION the part was built against */
  uint32_t struct_size; /* sizeof its struct, e.g. sizeof(stoke_model_v1) */
  const char *name;
} stoke_part_v1;

/* The initializer of those two fields:
 *   static const stoke_model_v1 model = {STOKE_ABI(stoke_model_v1), "mlp", ...};
 *   static const stoke_comm_v1 c = {STOKE_ABI(stoke_comm_v1), .name = "x", ...}; */
#define STOKE_ABI(type) STOKE_ABI_VERSION, (uint32_t)sizeof(type)

/* ---------------------------------------------------------------- config */

typedef enum stoke_cfg_type {
  STOKE_CFG_INT = 0,
  STOKE_CFG_FLOAT,
  STOKE_CFG_BOOL,    /* true/false, yes/no, on/off, 1/0 */
  STOKE_CFG_STR,
  STOKE_CFG_ENUM,    /* one of `choices`, "a|b|c" */
  STOKE_CFG_INTS,    /* comma-separated integers, e.g. "1024, 1024" */
  STOKE_CFG_LIST     /* comma-separated names, e.g. "cudnn, cuda" */
} stoke_cfg_type;

/* One declared INI key. Keys of plugins (a model's, a source's) are
 * declared without a section: the core puts them under the section that
 * names the plugin ([model] for `name = mlp`, [data] for `source = ...`).
 * `min`/`max` bound INT, FLOAT and each element of INTS; min == max == 0
 * means unbounded. `def` is the default as INI text ("" = empty). */
typedef struct stoke_cfg_key_v1 {
  const char *key;
  stoke_cfg_type type;
  const char *def;
  double min, max;
  const char *choices;
  const char *help;
} stoke_cfg_key_v1;

typedef struct stoke_cfg stoke_cfg; /* opaque: the resolved run config */

#define STOKE_CFG_MAX_LIST 32

/* ------------------------------------------------------------ log levels */

typedef enum stoke_log_level {
  STOKE_LOG_DEBUG = 0,
  STOKE_LOG_INFO,
  STOKE_LOG_WARN,
  STOKE_LOG_ERROR
} stoke_log_level;

/* ---------------------------------------------------------- host services */

/* Handed to every plugin's register function; valid for the whole process.
 * Plugins never print, exit or abort on their own: they log through `log`
 * and return errors made with `err_new` / `err_wrap`. */
typedef struct stoke_host_v1 {
  uint32_t abi_version;
  uint32_t struct_size;

  void (*log)(stoke_log_level level, const char *who, const char *fmt, ...)
      __attribute__((format(printf, 3, 4)));
  stoke_err *(*err_new)(stoke_code code, const char *file, int line,
                        const char *fmt, ...)
      __attribute__((format(printf, 4, 5)));
  stoke_err *(*err_wrap)(stoke_err *e, const char *file, int line,
                         const char *fmt, ...)
      __attribute__((format(printf, 4, 5)));
  void (*err_free)(stoke_err *e);

  /* Host memory; aligned to 64 bytes. NULL when out of memory. */
  void *(*alloc)(size_t bytes);
  void (*free)(void *p);

  /* Typed reads of declared keys; section as in the INI file. */
  stoke_err *(*cfg_int)(const stoke_cfg *c, const char *section,
                        const char *key, int64_t *out);
  stoke_err *(*cfg_float)(const stoke_cfg *c, const char *section,
                          const char *key, double *out);
  stoke_err *(*cfg_bool)(const stoke_cfg *c, const char *section,
                         const char *key, int *out);
  /* STR and ENUM; the string lives as long as the config. */
  stoke_err *(*cfg_str)(const stoke_cfg *c, const char *section,
                        const char *key, const char **out);
  /* INTS: up to STOKE_CFG_MAX_LIST values. */
  stoke_err *(*cfg_ints)(const stoke_cfg *c, const char *section,
                         const char *key, int64_t *out, int *n);
  /* Where a key was set, "run.ini:12" or "default", for messages. */
  const char *(*cfg_where)(const stoke_cfg *c, const char *section,
                           const char *key);
  /* -- appended in ABI 3 */
  /* LIST: up to STOKE_CFG_MAX_LIST names ("cudnn, cuda"); the strings
   * live as long as the config. */
  stoke_err *(*cfg_list)(const stoke_cfg *c, const char *section,
                         const char *key, const char **out, int *n);
} stoke_host_v1;

/* Plugins keep the host table they were given in this hidden global
 * (define it once in the plugin: `const stoke_host_v1 *stoke_host;`). */
extern const stoke_host_v1 *stoke_host;

#define STOKE_PERR(code, ...) \
  stoke_host->err_new((code), __FILE__, __LINE__, __VA_ARGS__)
#define STOKE_PTRY(expr, ...)                                         \
  do {                                                                \
    stoke_err *stoke_e_ = (expr);                                     \
    if (stoke_e_) return stoke_host->err_wrap(stoke_e_, __FILE__,     \
                                              __LINE__, __VA_ARGS__); \
  } while (0)

#define STOKE_PROPAGATE_P(expr)     \
  do {                              \
    stoke_err *stoke_e_ = (expr);   \
    if (stoke_e_) return stoke_e_;  \
  } while (0)

/* --------------------------------------------------------------- op types */

typedef enum stoke_attr_type {
  STOKE_ATTR_INT = 0,
  STOKE_ATTR_FLOAT,
  STOKE_ATTR_INTS,   /* "3" or "3x3" */
  STOKE_ATTR_STR,
  STOKE_ATTR_FLOATS  /* "0.5" or "0.485:0.456:0.406" */
} stoke_attr_type;

#define STOKE_ATTR_MAX_INTS 8
#define STOKE_ATTR_MAX_STR 32
#define STOKE_MAX_ATTRS 8

typedef struct stoke_attr_decl_v1 {
  const char *name;
  stoke_attr_type type;
  const char *def; /* default as text; NULL = required */
  const char *help;
} stoke_attr_decl_v1;

typedef struct stoke_attr_v1 {
  int64_t i;
  double f;
  int n; /* values in ints (INTS) or floats (FLOATS) */
  int64_t ints[STOKE_ATTR_MAX_INTS];
  double floats[STOKE_ATTR_MAX_INTS];
  char s[STOKE_ATTR_MAX_STR];
} stoke_attr_v1;

/* Inputs (and outputs) a node may have. 12 since ABI 5's bn_add_bn_relu
 * (10 inputs); no struct of this SDK holds STOKE_MAX_IO of anything (the
 * test kit's cases keep 8 shapes: STOKE_TESTKIT_MAX_INPUTS), so parts
 * built against 8 load unchanged. */
#define STOKE_MAX_IO 12

/* A graph node as an op or kernel sees it: attributes are in the order the
 * op type declared them, so kernels read them by index. */
typedef struct stoke_node_v1 {
  const char *op;
  const char *name; /* unique in the graph, e.g. "fc1" or "linear_3" */
  int n_attrs;
  stoke_attr_v1 attrs[STOKE_MAX_ATTRS];
} stoke_node_v1;

/* Shape and dtype of one value, for shape inference. */
typedef struct stoke_value_desc_v1 {
  stoke_shape shape;
  stoke_dtype dtype;
} stoke_value_desc_v1;

#define STOKE_BWD_NEEDS_INPUT(i) (1u << (i))
#define STOKE_BWD_NEEDS_OUTPUT(i) (1u << (16 + (i)))
/* A backward that reads nothing but the output gradients (add, reshape):
 * said on purpose, since a bwd_needs left 0 is refused (ABI 3). */
#define STOKE_BWD_NEEDS_NOTHING (1u << 15)

/* stoke_op_type_v1.has_backward: */
#define STOKE_HAS_BACKWARD 1
/* The gradient stops at this op on purpose (torch's .detach()): nothing
 * before it gets a gradient through it. An op left at 0 on a path that
 * needs gradients is refused by the compiler (ABI 3). */
#define STOKE_NO_GRAD (-1)

typedef struct stoke_op_type_v1 {
  uint32_t abi_version; /* STOKE_ABI_VERSION */
  uint32_t struct_size; /* sizeof(stoke_op_type_v1) */
  const char *name;
  const char *help;
  int n_inputs;  /* parameters are inputs too (linear: x, weight, bias) */
  int n_outputs; /* 0: as many (1 to STOKE_MAX_IO) as infer makes (split) */
  const stoke_attr_decl_v1 *attrs;
  int n_attrs;
  /* Output shapes and dtypes from the inputs'; errors name the node. */
  stoke_err *(*infer)(const stoke_node_v1 *node, const stoke_value_desc_v1 *in,
                      stoke_value_desc_v1 *out);
  /* Forward FLOPs for one call (2 per multiply-add); backward counts 2x.
   * May be NULL: the op then counts 0 in the run's FLOPs and MFU. */
  double (*flops)(const stoke_node_v1 *node, const stoke_value_desc_v1 *in,
                  const stoke_value_desc_v1 *out);
  /* What the backward kernel reads besides the output gradients:
   * STOKE_BWD_NEEDS_INPUT(i) | STOKE_BWD_NEEDS_OUTPUT(j), or
   * STOKE_BWD_NEEDS_NOTHING. The memory planner keeps exactly these alive
   * until backward; the others reach the kernel with data == NULL.
   * Required with a backward: 0 is refused when the op is registered. */
  uint32_t bwd_needs;
  /* Inputs that never receive a gradient (labels): bit i for input i. */
  uint32_t no_grad_inputs;
  /* STOKE_HAS_BACKWARD (1): backward kernels exist (pass STOKE_BWD).
   * STOKE_NO_GRAD: gradients stop here on purpose. 0 (not said): fine
   * where no gradient flows (the input's cast, metrics), refused by the
   * compiler on a path that needs gradients. */
  int has_backward;
} stoke_op_type_v1;

/* ---------------------------------------------------------------- kernels */

typedef enum stoke_pass {
  STOKE_FWD = 0,
  STOKE_BWD,
  STOKE_OPT /* optimizer update over the flat buffers */
} stoke_pass;

/* Optimizer hyper-parameters for this step (STOKE_OPT kernels: updates,
 * the loss scaler's steps, the gradient norm). A zeroed struct plus lr,
 * grad_scale and step is a plain update: every hook below is off when 0 or
 * NULL. The named fields are the built-in optimizers'; a plugin optimizer
 * may use them and keeps its own in hyper[] (its configure() sets both). */
#define STOKE_OPT_MAX_HYPER 8
typedef struct stoke_opt_args_v1 {
  double lr, momentum, weight_decay, beta1, beta2, eps;
  int nesterov;
  int64_t step;       /* updates applied before this one + 1 (AdamW bias correction) */
  double grad_scale;  /* multiply gradients by this first (1/accumulate) */
  /* Loss scaling (fp16), or NULL: device memory, f32
   * [scale, good steps, found_inf, skipped steps]. When amp[2] != 0 the
   * kernel changes nothing (the step is skipped); otherwise gradients are
   * multiplied by grad_scale / amp[0], and the update is the
   * (step - amp[3])-th applied one: skipped steps do not advance AdamW's
   * bias corrections. Decided on the device: no host sync. */
  const float *amp;
  int64_t growth_interval; /* amp_update: clean steps before the scale grows (0: never) */
  /* Whole-step CUDA graphs replay the launch with the arguments it was
   * captured with, so what changes per step is read on the device: when
   * not NULL, device memory f64 [lr, step] that replaces `lr` and `step`
   * (the AdamW bias corrections are then computed on the device). */
  const double *live;
  /* -- appended in ABI 2 */
  double hyper[STOKE_OPT_MAX_HYPER]; /* a plugin optimizer's own, as its configure() set them */
  /* Weight decay by parameter group: NULL, every element of the flat
   * buffer; else device memory, n_decay_ranges sorted, disjoint element
   * ranges [start, end) (int64 pairs) that get weight_decay, the others
   * none (GPT-2's convention: matrices decay, biases and norm scales do
   * not). Ranges start and end at multiples of 4 elements. */
  const int64_t *decay_ranges;
  int n_decay_ranges;
  /* Clipping by the global gradient norm, or NULL: device memory, f32
   * [norm, factor] written by grad_norm this step; updates multiply the
   * gradients by factor (after grad_scale and the loss scale). */
  const float *clip;
  double max_norm;     /* grad_norm: clip the norm to this (torch's clip_grad_norm_) */
  /* amp_update: the scale's growth (0: 2) and back-off on inf/NaN (0: 0.5);
   * a static scale is growth_interval 0 and backoff_factor 1 */
  double growth_factor, backoff_factor;
} stoke_opt_args_v1;

/* Run-wide choices a kernel honours (stoke_kernel_args_v1.flags). */
#define STOKE_KFLAG_TF32 (1u << 0)          /* fp32 matmul/conv may use TF32 */
#define STOKE_KFLAG_DETERMINISTIC (1u << 1) /* only bitwise-reproducible algorithms */
#define STOKE_KFLAG_AUTOTUNE (1u << 2)      /* plan() may time candidates (cudnn.benchmark) */

/* Everything one kernel call sees. For STOKE_FWD: `in` -> `out`.
 * For STOKE_BWD: the forward's `in` and `out` (only those named in the op's
 * bwd_needs hold live data), `dout` (gradients of the outputs) -> `din`
 * (gradients of the inputs; din[i].data == NULL when input i needs none).
 * Gradients of parameters are accumulated as
 *     din = param_grad_beta * din + computed
 * (0 on the first micro-batch, 1 after: gradient accumulation), gradients
 * of activations are always overwritten.
 * For STOKE_OPT updates: in[0] parameters, in[1] gradients, in[2]
 * optimizer state (flat, 1-D, in the precision policy's master dtype), `opt`
 * the hyper-parameters. When the state's dtype is not the parameters' (bf16
 * or fp16 parameters, f32 master weights) it starts with the master copy of
 * the parameters (numel of in[0]), then the optimizer's own state; the
 * kernel updates the master and writes the rounded working copy to in[0] in
 * the same pass. Otherwise it holds the optimizer's state only. Each of the
 * optimizer's n_state tensors is numel of in[0] long, in its order. */
typedef struct stoke_kernel_args_v1 {
  const stoke_node_v1 *node;
  int n_in, n_out;
  const stoke_tensor *in;
  const stoke_tensor *out;
  const stoke_tensor *din;
  const stoke_tensor *dout;
  uint32_t param_grads;      /* bit i: din[i] is a parameter gradient */
  float param_grad_beta;
  int training;              /* 0 in eval: dropout off, BN running stats */
  uint64_t seed;             /* per node and step, for dropout */
  const stoke_opt_args_v1 *opt;
  void *workspace;
  size_t workspace_bytes;
  void *engine;              /* the engine's state from its open() */
  void *stream;              /* NULL on the CPU */
  uint32_t flags;            /* STOKE_KFLAG_* */
  /* Appended (issue 11): bit i set: ADD this node's gradient of input i
   * into din[i] (beta = 1) instead of overwriting it, because another
   * backward path wrote that value's gradient first (a residual block's
   * input: the shortcut's gradient, then the main branch's). Set only for
   * kernels whose `accumulates` has bit i (stoke_kernel_v1). */
  uint32_t din_accumulate;
  /* Appended (ABI 4): 1 on a backward kernel whose caps has
   * STOKE_KCAP_WITH_FORWARD when the compiler dropped its forward node
   * (the node just before it): the kernel computes the forward's outputs
   * too, from `in`, before or while it makes the gradients. Every `in`
   * and `out` then holds data (bwd_needs or not). */
  int with_forward;
  /* Appended (ABI 5): non-NULL on a backward kernel whose caps has
   * STOKE_KCAP_SIDE_GRADS when the executor lets it compute its parameter
   * gradients (din[i] with param_grads bit i) on this second stream, with
   * this workspace (as large as `workspace`, never shared with it). The
   * side stream already waits for everything issued to `stream` before the
   * call; the executor makes `stream` wait for the side stream before
   * anything reads those gradients or overwrites what the side work reads
   * (the node's in, out and dout). Everything else stays on `stream`.
   * NULL: all on `stream`, as before. */
  void *side_stream;
  void *side_workspace;
  size_t side_workspace_bytes;
} stoke_kernel_args_v1;

/* stoke_kernel_v1.caps bits. STOKE_KCAP_WITH_FORWARD: this backward
 * kernel honours stoke_kernel_args_v1.with_forward (softmax_ce on the
 * GPU: log-sum-exp, loss and dlogits in one read of the logits). */
#define STOKE_KCAP_WITH_FORWARD (1u << 0)
/* STOKE_KCAP_SIDE_GRADS: this backward kernel may put its parameter
 * gradients on stoke_kernel_args_v1.side_stream ([run] wgrad_stream): the
 * weight-gradient product overlaps the input-gradient chain (cuDNN's
 * convolutions). A kernel may ignore the side stream; it must not use it
 * for din of activations. */
#define STOKE_KCAP_SIDE_GRADS (1u << 1)

/* One entry of a backend's kernel table: (op, pass, dtype, layout) ->
 * {plan, run}. `plan` runs once per node when the graph is compiled (it may
 * autotune) and says how much workspace `run` needs; `run` never
 * allocates. The workspace holds whatever the nodes before wrote (the
 * kernel tests fill it with 0xff bytes): a kernel writes the zeros it
 * needs there. `plan` and `destroy` may be NULL (no state, no workspace).
 * STOKE_OPT kernels get plan() once, with `opt` NULL (it may ask for
 * workspace: grad_norm's partial sums); updates always get three inputs,
 * in[2], the state, zeroed before the first step. */
typedef struct stoke_kernel_v1 {
  const char *engine;   /* backend name: "cpu", "cudnn", ... */
  const char *op;
  stoke_pass pass;
  stoke_dtype dtype;    /* dtype of the op's first input */
  stoke_layout layout;  /* STOKE_LAYOUT_ANY: serves every layout */
  stoke_err *(*plan)(const stoke_kernel_args_v1 *a, void **state,
                     size_t *workspace_bytes);
  stoke_err *(*run)(const stoke_kernel_args_v1 *a, void *state);
  void (*destroy)(void *state);
  /* Appended (issue 11): bit i: this backward kernel can add its gradient
   * of input i into din[i] (stoke_kernel_args_v1.din_accumulate), so the
   * compiler needs no separate add node where two gradients meet. */
  uint32_t accumulates;
  /* Appended (ABI 4): STOKE_KCAP_* bits. */
  uint32_t caps;
} stoke_kernel_v1;

/* --------------------------------------------------------------- backends */

typedef enum stoke_copy_kind {
  STOKE_COPY_H2D = 0,
  STOKE_COPY_D2H,
  STOKE_COPY_D2D
} stoke_copy_kind;

typedef struct stoke_device_info_v1 {
  char name[128];
  size_t total_bytes, free_bytes;
  /* Peak dense FLOP/s by dtype of compute (0 = unknown: MFU shows n/a). */
  double peak_flops[STOKE_DTYPE_COUNT];
  double peak_tf32; /* f32 matmul/conv on tensor cores */
  int cc_major, cc_minor; /* compute capability; 0 on the CPU */
} stoke_device_info_v1;

/* A compute backend ("engine"). An engine that owns a device (cpu, cuda)
 * fills the memory/stream functions; an engine that only adds kernels on
 * another's device (cudnn, cublaslt, fused) leaves them NULL and names
 * that device's engine in `device_engine`. */
typedef struct stoke_backend_v1 {
  uint32_t abi_version; /* STOKE_ABI_VERSION */
  uint32_t struct_size; /* sizeof(stoke_backend_v1) */
  const char *name;
  const char *help;
  stoke_device_kind device;
  const char *device_engine; /* NULL when this engine owns the device */

  stoke_err *(*open)(int device_index, void *device_self, void **self);
  void (*close)(void *self);
  stoke_err *(*info)(void *self, stoke_device_info_v1 *out);

  stoke_err *(*alloc)(void *self, size_t bytes, void **ptr);
  void (*free)(void *self, void *ptr);
  /* Page-locked host memory for batches (plain memory on the CPU). */
  stoke_err *(*alloc_host)(void *self, size_t bytes, void **ptr);
  void (*free_host)(void *self, void *ptr);
  stoke_err *(*copy)(void *self, void *dst, const void *src, size_t bytes,
                     stoke_copy_kind kind, void *stream);
  stoke_err *(*fill)(void *self, void *dst, int byte, size_t bytes,
                     void *stream);
  stoke_err *(*stream_create)(void *self, void **stream);
  void (*stream_destroy)(void *self, void *stream);
  stoke_err *(*stream_sync)(void *self, void *stream);
  /* The stream every kernel of this device runs on (args->stream); NULL
   * for the CPU. A NULL stream in copy/fill/stream_sync means this one. */
  void *(*default_stream)(void *self);
  /* Timers for the per-op profile (CUDA events on a GPU, the host clock
   * on the CPU): record on a stream, read the time between two recorded
   * timers once both completed. May be NULL: no profile. */
  stoke_err *(*timer_create)(void *self, void **timer);
  void (*timer_destroy)(void *self, void *timer);
  stoke_err *(*timer_record)(void *self, void *timer, void *stream);
  stoke_err *(*timer_elapsed_ms)(void *self, void *start, void *end, float *ms);
  /* Overlapped batch copies (NULL on the CPU: copies are synchronous):
   * the stream host-to-device batch copies run on, a stream waiting for a
   * recorded timer (an event), and the host waiting for one. */
  void *(*copy_stream)(void *self);
  stoke_err *(*stream_wait)(void *self, void *stream, void *timer);
  stoke_err *(*timer_sync)(void *self, void *timer);
  /* Whole-step graphs (CUDA graphs; NULL: not supported). Everything
   * issued to `stream` between capture_begin and capture_end is recorded,
   * not run, into one graph (*ops: the GPU operations it holds, i.e. the
   * launches it replaces); graph_launch replays it on `stream`. A kernel
   * that synchronizes or allocates inside run() makes capture_end fail.
   * (Appended before the v1 SDK is released: a backend built against an
   * earlier header must be rebuilt.) */
  stoke_err *(*capture_begin)(void *self, void *stream);
  stoke_err *(*capture_end)(void *self, void *stream, void **graph, int64_t *ops);
  stoke_err *(*graph_launch)(void *self, void *graph, void *stream);
  void (*graph_destroy)(void *self, void *graph);
} stoke_backend_v1;

/* ---------------------------------------------------------------- sources */

typedef struct stoke_sample_info_v1 {
  stoke_shape shape;   /* one sample, e.g. (F) or (C, H, W) */
  stoke_dtype dtype;   /* what read() writes: F32 or U8 */
  /* Images' memory order, honoured by the core: f32 samples are CHW
   * unless STOKE_NHWC (HWC) is said; u8 images are HWC (STOKE_NHWC or
   * ANY; STOKE_NCHW is refused). */
  stoke_layout layout;
  int64_t classes;
} stoke_sample_info_v1;

/* A data source. Sources own no threads: the core's loader calls read()
 * from its workers, concurrently, for different indices. */
typedef struct stoke_source_v1 {
  uint32_t abi_version; /* STOKE_ABI_VERSION */
  uint32_t struct_size; /* sizeof(stoke_source_v1) */
  const char *name;
  const char *help;
  const stoke_cfg_key_v1 *keys; /* declared in the section naming it */
  int n_keys;
  stoke_err *(*open)(const stoke_cfg *cfg, const char *section, void **self);
  void (*close)(void *self);
  int64_t (*length)(void *self);
  stoke_err *(*info)(void *self, stoke_sample_info_v1 *out);
  /* Decode and augment sample `index` into `dst` (one sample's bytes) and
   * its class into *label, 0 to classes - 1. `seed` is derived from (run
   * seed, epoch, index), so it changes every epoch: draw augmentation from
   * it; what the sample itself is should depend on the index (and a seed
   * key of the source's own for generated data). The same (index, seed)
   * must give the same bytes on any thread; write every byte of `dst`. */
  stoke_err *(*read)(void *self, int64_t index, uint64_t seed, void *dst,
                     int32_t *label);
} stoke_source_v1;

/* ----------------------------------------------------------------- models */

typedef enum stoke_init_kind {
  STOKE_INIT_ZEROS = 0,
  STOKE_INIT_ONES,
  STOKE_INIT_UNIFORM, /* U(a, b) */
  STOKE_INIT_NORMAL   /* N(a, b^2) */
} stoke_init_kind;

typedef struct stoke_init_v1 {
  stoke_init_kind kind;
  double a, b;
} stoke_init_v1;

typedef struct stoke_graph stoke_graph; /* opaque, owned by the core */

/* What a model builder calls to emit its forward graph. Value ids are
 * small ints. Attributes are text, "stride=2, padding=1", checked against
 * the op's declaration (errors name the node). */
typedef struct stoke_builder_v1 {
  stoke_graph *g;
  stoke_err *(*param)(stoke_graph *g, const char *name,
                      const stoke_shape *shape, stoke_init_v1 init,
                      int *value);
  stoke_err *(*node)(stoke_graph *g, const char *op, const char *name,
                     const int *inputs, int n_inputs, const char *attrs,
                     int *outputs, int n_outputs);
  stoke_err *(*shape_of)(stoke_graph *g, int value, stoke_shape *out);
  /* Persistent state that is not trained (batch-norm running mean/var):
   * kept across steps, saved in checkpoints, no gradient. */
  stoke_err *(*state)(stoke_graph *g, const char *name,
                      const stoke_shape *shape, stoke_init_v1 init,
                      int *value);
  /* A second name for parameter `value` in checkpoints, for a weight that
   * two nodes use (tied): nanoGPT's state_dict holds GPT-2's token
   * embedding as transformer.wte.weight and as lm_head.weight, and
   * load_state_dict(strict=True) wants both. (Appended before the v1 SDK
   * is released: the core fills it, so older plugins are unaffected.) */
  stoke_err *(*param_alias)(stoke_graph *g, int value, const char *name);
} stoke_builder_v1;

typedef struct stoke_model_v1 {
  uint32_t abi_version; /* STOKE_ABI_VERSION */
  uint32_t struct_size; /* sizeof(stoke_model_v1) */
  const char *name;
  const char *help;
  const stoke_cfg_key_v1 *keys; /* declared in [model] */
  int n_keys;
  /* Emit the forward graph from `input` (shape (N, ...) of the source) to
   * logits of shape (N, classes) in *logits. */
  stoke_err *(*build)(const stoke_cfg *cfg, const char *section,
                      const stoke_builder_v1 *b, int input, int64_t classes,
                      int *logits);
} stoke_model_v1;

/* ----------------------------------------------------- precision policies */

/* How the loss is scaled before backward (fp16's narrow range). The
 * scale's state lives on the device and the step is skipped there when a
 * gradient is inf or NaN: no host sync. */
typedef enum stoke_loss_scaling {
  STOKE_SCALING_NONE = 0,
  STOKE_SCALING_STATIC,  /* init_scale, fixed (steps with inf/NaN gradients are skipped) */
  STOKE_SCALING_DYNAMIC  /* torch.amp.GradScaler: x growth_factor after growth_interval clean steps, x backoff_factor on inf/NaN */
} stoke_loss_scaling;

/* A precision policy, `[run] precision = name`. Two classes of ops: every
 * op computes in param_dtype (activations and gradients too), except the
 * op types named in fp32_ops, which the compiler runs in f32 with
 * `autocast` nodes around them (their backward casts the gradients back).
 * The optimizer updates master_dtype: when that is not param_dtype, it
 * keeps a master copy of the parameters and writes their rounding to the
 * working copy. */
typedef struct stoke_precision_v1 {
  uint32_t abi_version; /* STOKE_ABI_VERSION */
  uint32_t struct_size; /* sizeof(stoke_precision_v1) */
  const char *name;
  const char *help;
  stoke_dtype param_dtype;   /* parameters' working copy, activations, gradients */
  stoke_dtype compute_dtype; /* what matmul/conv-class ops compute in (the MFU peak); param_dtype here */
  stoke_dtype master_dtype;  /* what the optimizer updates and keeps its state in */
  int tf32;                  /* f32 matmul/conv may use TF32 tensor cores */
  stoke_loss_scaling loss_scaling;
  double init_scale;         /* the first scale (static: the scale) */
  int64_t growth_interval;   /* dynamic: clean steps before the scale grows */
  /* Op types computed in f32, comma-separated ("batch_norm, softmax_ce"). */
  const char *fp32_ops;
  double growth_factor, backoff_factor; /* dynamic: 2 and 0.5 when 0 */
} stoke_precision_v1;

/* ------------------------------------------------------------- optimizers */

#define STOKE_OPT_MAX_STATE 4

/* An optimizer, `[optimizer] name = ...`: its hyper-parameter keys, its
 * state per parameter and configure(), which turns the keys into the
 * update's arguments once before training. The update itself is a kernel
 * of op `name`, pass STOKE_OPT, one per backend and parameter dtype (see
 * stoke_kernel_args_v1), over the flat buffers in one launch. What every
 * optimizer gets from the core without code of its own: the learning-rate
 * schedule (lr, live), gradient accumulation and loss scaling
 * (grad_scale, amp), weight decay by parameter group (decay_ranges) and
 * clipping by the global norm (clip), all in stoke_opt_args_v1. */
typedef struct stoke_optimizer_v1 {
  uint32_t abi_version; /* STOKE_ABI_VERSION */
  uint32_t struct_size; /* sizeof(stoke_optimizer_v1) */
  const char *name;
  const char *help;
  const stoke_cfg_key_v1 *keys; /* its own keys, declared in [optimizer] when chosen */
  int n_keys;
  /* State tensors per parameter (at most STOKE_OPT_MAX_STATE), each the
   * parameter's shape in the master dtype, in this order after the master
   * copy; their names as in torch.optim's state_dict ("momentum_buffer";
   * "exp_avg", "exp_avg_sq"): checkpoints hold optimizer.<param>.<name>. */
  int n_state;
  const char *state_names[STOKE_OPT_MAX_STATE];
  /* Read its keys from [optimizer] into *args (the named fields it uses,
   * and hyper[]); errors name the key (host->cfg_where). NULL: no keys. */
  stoke_err *(*configure)(const stoke_cfg *cfg, const char *section, stoke_opt_args_v1 *args);
} stoke_optimizer_v1;

/* ------------------------------------------------------------------ comms */

typedef enum stoke_reduce_op { STOKE_SUM = 0, STOKE_AVG } stoke_reduce_op;

/* Where this process sits in the job. The core reads it once from the
 * launcher's variables (torchrun's RANK, WORLD_SIZE, LOCAL_RANK,
 * MASTER_ADDR/PORT; Open MPI's; Slurm's) and hands it to the comm: a comm
 * plugin does not read them again. */
typedef struct stoke_comm_place_v1 {
  int rank, world;
  int local_rank;         /* on this node: the GPU is [run] device_index + local_rank */
  const char *rendezvous; /* "host:port" where rank 0's bootstrap listens ("" for one process) */
  const char *launcher;   /* whose variables: "torchrun", "openmpi", "slurm" or "none" */
} stoke_comm_place_v1;

/* A communicator over the processes of a job; its collectives are
 * enqueued on `stream` (the device's) and never make the host wait. */
typedef struct stoke_comm_v1 {
  uint32_t abi_version; /* STOKE_ABI_VERSION */
  uint32_t struct_size; /* sizeof(stoke_comm_v1) */
  const char *name;
  const char *help;
  /* Join the job as `place` says (called once, after the device is open). */
  stoke_err *(*open)(const stoke_cfg *cfg, const stoke_comm_place_v1 *place, void **self);
  void (*close)(void *self);
  stoke_err *(*all_reduce)(void *self, void *buf, size_t count,
                           stoke_dtype dtype, stoke_reduce_op op,
                           void *stream);
  stoke_err *(*broadcast)(void *self, void *buf, size_t count,
                          stoke_dtype dtype, int root, void *stream);
  stoke_err *(*barrier)(void *self);
  /* Appended (issue 11): the step ran as a replayed CUDA graph that holds
   * collectives (captured from all_reduce calls made while `stream` was
   * capturing): follow everything enqueued on `stream` so far as one unit
   * of work, `what`, under the comm's failure checks and timeout, as an
   * eager collective is followed. NULL: the comm cannot, and the core
   * keeps such steps out of graphs. */
  stoke_err *(*watch)(void *self, void *stream, const char *what);
} stoke_comm_v1;

/* ------------------------------------------------------ fusion patterns */

/* A fusion pattern (ABI 3), in the table the core's own patterns are in
 * (linear -> relu, batch_norm -> [add ->] relu): a chain of forward nodes
 * head -> [add ->] tail, each intermediate value read by the next node
 * alone, becomes one node of op `fused` where an engine has the fused
 * op's forward and backward kernels and comes no later in [run] backends
 * than the engine serving the head (the head's own engine only with
 * [run] fuse = true). The fused node takes the head's inputs (then the
 * add's other input), the head's attributes followed by the tail's (the
 * fused op declares both, in that order), the head's name and the tail's
 * output. The ops may come from any plugin; the compiler looks them up by
 * name when it compiles. */
typedef struct stoke_fusion_v1 {
  uint32_t abi_version; /* STOKE_ABI_VERSION */
  uint32_t struct_size; /* sizeof(stoke_fusion_v1) */
  const char *name;     /* the pattern's, unique: "linear_leaky_relu" */
  const char *help;
  const char *head, *tail, *fused; /* op names */
  int add;              /* 1: head -> add -> tail, the add's other input joins */
  int gpu_own;          /* 1: a GPU engine serving the head fuses it without [run] fuse (never slower) */
} stoke_fusion_v1;

/* -------------------------------------------------------------- registry */

/* Where a plugin adds its parts. Each add fails with STOKE_E_ABI when the
 * part's abi_version or struct_size is not this header's (naming the
 * plugin file, the part, the expected and the found values), and with
 * STOKE_E_DUPLICATE if the name (for kernels: engine, op, pass, dtype,
 * layout) is taken, naming the plugin that took it. The structs must
 * outlive the process (static). */
typedef struct stoke_registry_v1 {
  void *self;
  stoke_err *(*add_op)(void *self, const stoke_op_type_v1 *op);
  stoke_err *(*add_kernel)(void *self, const stoke_kernel_v1 *k);
  stoke_err *(*add_backend)(void *self, const stoke_backend_v1 *b);
  stoke_err *(*add_source)(void *self, const stoke_source_v1 *s);
  stoke_err *(*add_model)(void *self, const stoke_model_v1 *m);
  stoke_err *(*add_precision)(void *self, const stoke_precision_v1 *p);
  stoke_err *(*add_comm)(void *self, const stoke_comm_v1 *c);
  stoke_err *(*add_optimizer)(void *self, const stoke_optimizer_v1 *o); /* ABI 2 */
  stoke_err *(*add_fusion)(void *self, const stoke_fusion_v1 *f);       /* ABI 3 */
} stoke_registry_v1;

/* ----------------------------------------------------------- the entry */

/* The one symbol a plugin exports, named STOKE_PLUGIN_SYMBOL:
 *
 *   const stoke_host_v1 *stoke_host;
 *   static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r)
 *   { stoke_host = h; return r->add_op(r->self, &swish_op); }
 *   STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
 *     STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "swish", "...", reg};
 */
typedef struct stoke_plugin_v1 {
  uint32_t abi_version; /* STOKE_ABI_VERSION the plugin was built against */
  uint32_t struct_size; /* sizeof(stoke_plugin_v1) */
  const char *name;
  const char *description;
  stoke_err *(*register_parts)(const stoke_host_v1 *host,
                               const stoke_registry_v1 *reg);
} stoke_plugin_v1;

#define STOKE_EXPORT __attribute__((visibility("default")))

#ifdef __cplusplus
}
#endif
#endif
