/* stoke/graph.h: the graph (built by model plugins through the builder),
 * the compiler (shape inference, backward derivation, kernel resolution,
 * memory planning) and the executor that runs a compiled plan. */
#ifndef STOKE_GRAPH_H
#define STOKE_GRAPH_H

#include <stdio.h>

#include "stoke/plugin.h"
#include "stoke/registry.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum stoke_value_kind {
  STOKE_VAL_INPUT = 0, /* the batch's samples, written by the loader */
  STOKE_VAL_LABEL,     /* the batch's labels */
  STOKE_VAL_PARAM,     /* in the flat parameter buffer */
  STOKE_VAL_ACT,       /* forward activation, in the arena */
  STOKE_VAL_GRAD,      /* gradient of an activation, in the arena */
  STOKE_VAL_PARAM_GRAD,/* in the flat gradient buffer */
  STOKE_VAL_SEED,      /* d(loss)/d(loss) = 1, a constant */
  STOKE_VAL_STATE      /* persistent, not trained (batch-norm running stats) */
} stoke_value_kind;

/* Where a value lives. */
typedef enum stoke_buffer_id {
  STOKE_BUF_PARAMS = 0,
  STOKE_BUF_GRADS,
  STOKE_BUF_ARENA,
  STOKE_BUF_STATE,     /* flat: every STATE value, saved with checkpoints */
  STOKE_BUF_COUNT
} stoke_buffer_id;

typedef struct stoke_value {
  char name[64];
  stoke_value_kind kind;
  stoke_shape shape;
  stoke_dtype dtype;
  stoke_layout layout;
  int producer;        /* node index, -1 for inputs and parameters */
  int grad;            /* value id of the gradient, -1 if none */
  stoke_init_v1 init;  /* parameters */
  /* memory plan */
  stoke_buffer_id buffer;
  size_t offset, bytes;
  int first, last;     /* schedule positions where it is live */
  int alias;           /* the value whose memory this one is (a view), or -1 */
  size_t alias_off;    /* bytes into it */
} stoke_value;

typedef struct stoke_gnode {
  stoke_node_v1 n;     /* op, name (points at name_buf), attributes */
  char name_buf[64];
  const stoke_op_type_v1 *type;
  stoke_pass pass;
  int fwd;             /* backward nodes: the forward node; else -1 */
  int n_in, n_out;
  int in[STOKE_MAX_IO], out[STOKE_MAX_IO];     /* forward values */
  int din[STOKE_MAX_IO], dout[STOKE_MAX_IO];   /* backward: -1 = none */
  double flops;
  /* backward nodes: bit k set: add din[k] into its value (the
   * kernel's din_accumulate), set by the compiler where two paths'
   * gradients meet (core/fuse_grad.c) */
  uint32_t din_accumulate;
  /* a second user of a tied parameter: its parameter gradients always
   * accumulate onto what the earlier backward node wrote (beta 1) */
  int param_accumulate;
  /* a forward node run again in the backward pass (core/recompute.c):
   * pass STOKE_FWD, `fwd` the node it repeats (whose seed it takes, so a
   * dropout mask comes out the same) */
  int recompute;
  /* forward-in-backward (core/fuse_grad.c): on a forward node, 1 when the
   * backward node right after it does its work (the executor skips it);
   * on that backward node, 1 (its kernel gets with_forward) */
  int with_forward;
  /* [run] wgrad_stream (core/plan.c): on a backward node whose kernel may
   * put its parameter gradients on the side stream (STOKE_KCAP_SIDE_GRADS),
   * `side` is the key's value, the lag; `side_join` the node before which
   * the main stream waits for that side work (n_nodes: the backward's end).
   * The liveness keeps what the side work reads alive until then. 0: none. */
  int side, side_join;
  /* kernel resolution */
  const stoke_kernel_v1 *kernel;
  void *kstate;
  size_t workspace;
} stoke_gnode;

/* A forward node whose work the backward node after it does (the
 * executor skips it; core/fuse_grad.c). */
static inline int stoke_node_in_bwd(const stoke_gnode *n) { return n->with_forward && n->pass == STOKE_FWD; }

/* What an op's infer() must give for each output: 1 to STOKE_MAX_DIMS
 * dimensions of at least 1 and a known dtype (the graph builder and the
 * plugin test kit both check it). */
static inline int stoke_desc_valid(const stoke_value_desc_v1 *d) {
  int ok = d->shape.ndim >= 1 && d->shape.ndim <= STOKE_MAX_DIMS && (unsigned)d->dtype < STOKE_DTYPE_COUNT;
  for (int k = 0; ok && k < d->shape.ndim; k++) ok = d->shape.d[k] >= 1;
  return ok;
}

/* A parameter's second name in checkpoints (a tied weight). */
typedef struct stoke_tied_name {
  int value;
  char name[64];
} stoke_tied_name;

struct stoke_graph {
  const stoke_registry *reg;
  stoke_value *values;
  int n_values, cap_values;
  stoke_gnode *nodes;
  int n_nodes, cap_nodes;
  int n_fwd;           /* nodes [0, n_fwd) are the forward pass */
  int input, label, logits, loss, seed;
  stoke_dtype dtype;   /* of inputs/params/activations */
  stoke_layout layout; /* of 4-D activations */
  stoke_tied_name *tied;
  int n_tied;
};

stoke_err *stoke_graph_new(const stoke_registry *reg, stoke_dtype dtype,
                           stoke_layout layout, stoke_graph **out);
void stoke_graph_free(stoke_graph *g);
/* A stand-alone node of `op` with attributes parsed from `attrs` (as for
 * builder nodes), for tests and tools that call kernels directly. `name`
 * must outlive the node. */
stoke_err *stoke_node_init(const stoke_registry *reg, const char *op, const char *name,
                           const char *attrs, stoke_node_v1 *node);
/* The builder table models receive. */
stoke_builder_v1 stoke_graph_builder(stoke_graph *g);
/* Values the run adds around the model. */
stoke_err *stoke_graph_input(stoke_graph *g, const char *name,
                             stoke_value_kind kind, const stoke_shape *shape,
                             stoke_dtype dtype, int *value);
/* Attach softmax cross-entropy on `logits` against the label value;
 * `attrs` as for builder nodes ("label_smoothing=0.1"). */
stoke_err *stoke_graph_loss(stoke_graph *g, int logits, const char *attrs);
/* The same against another i32 value of labels (a language model's next
 * tokens, cut from its input on the device). */
stoke_err *stoke_graph_loss_on(stoke_graph *g, int logits, int labels, const char *attrs);
/* A language model's batch of token windows [B, T + 1] (i32) as the tokens
 * [B, T] its model reads and the targets [B T] (the next tokens) its loss
 * is taken against, cut on the device (core/lm.c). */
stoke_err *stoke_lm_inputs(stoke_graph *g, int windows, int *tokens, int *targets);

/* What the compiler's passes (core/autocast.c, layout.c, graph.c) use to change a graph. */
stoke_err *stoke_graph_new_value(stoke_graph *g, const char *name, stoke_value_kind kind, const stoke_shape *shape,
                                 stoke_dtype dtype, int *id);
/* Appends a copy of forward node n, its outputs' producer. */
stoke_err *stoke_graph_append_fwd(stoke_graph *g, const stoke_gnode *n);
/* A new forward node: `op` named `name` (63 characters kept) with
 * attributes `attrs`, from value `in` to value `out`. */
stoke_err *stoke_graph_append_unary(stoke_graph *g, const char *op, const char *name, const char *attrs, int in,
                                    int out);
/* A reshape (a view where core/alias.c can): a new activation `name` of
 * `shape`, in memory order `layout` when 4-D, from value `in`. */
stoke_err *stoke_graph_append_reshape(stoke_graph *g, const char *name, int in, const stoke_shape *shape,
                                      stoke_layout layout, int *out);
/* A reshape from value `in` to the existing value `out` (its shape and
 * layout as they are): a node that only relabels memory takes its place. */
stoke_err *stoke_graph_append_view_into(stoke_graph *g, const char *name, int in, int out);
/* A pass over the forward nodes in order, before backward derivation: the
 * forward list is emptied and `place` called with each old node i of the
 * n, to append it, changed or not, with any new nodes around it. */
typedef stoke_err *(*stoke_fwd_place)(void *ctx, const stoke_gnode *old, int n, int i);
stoke_err *stoke_graph_rewrite_fwd(stoke_graph *g, stoke_fwd_place place, void *ctx);
/* Whether value v is read as a convolution's filter by a forward node,
 * directly or through autocasts and reshapes (core/layout.c): [O, C, kh,
 * kw] in memory on every engine and in every checkpoint, whatever the
 * graph's layout. */
int stoke_value_is_filter(const stoke_graph *g, int v);
/* Whether value v is a parameter kept [O, kh, kw, C] in memory (an NHWC
 * graph compiled with filter_ohwi: a 4-D parameter labelled NHWC). */
int stoke_value_is_ohwi(const stoke_graph *g, int v);
/* One 4-D tensor of `dt` elements, logical shape [a, b, c, d], between
 * row-major order [a, b, c, d] and [a, c, d, b] (to_nhwc) in place; `tmp`
 * holds b c d elements. */
void stoke_permute_nhwc(void *data, stoke_dtype dt, const stoke_shape *s, int to_nhwc, void *tmp);

/* -------------------------------------------------------------- compile */

typedef struct stoke_plan_opts {
  const char *const *engines; /* ordered backend list, e.g. {"cpu"} */
  int n_engines;
  void **engine_selves;       /* state of each engine from its open() */
  const char *optimizer;      /* a registered optimizer's name ("sgd", "adamw", ...) | NULL (no update) */
  int training;               /* 0: forward-only plan, keeps nothing */
  uint32_t flags;             /* STOKE_KFLAG_* passed to every kernel */
  int loss_scaling;           /* dynamic loss scaler (fp16) */
  double init_scale;
  int fuse;                   /* fuse linear + relu/gelu(tanh) into cuBLASLt epilogues (batch-norm fusions need no flag) */
  double grad_clip;           /* > 0: a grad_norm kernel before the update (clipping by the global norm) */
  int decay_2d_only;          /* weight decay only on parameters of >= 2 dimensions (GPT-2's groups) */
  int no_grad_accumulate;     /* keep gradient sums as add nodes (core/fuse_grad.c; for A/B runs and tests) */
  /* The precision policy: its fp32_ops run in f32 (autocast around them)
   * and its master_dtype is the optimizer state's. NULL: the graph's dtype
   * for everything, f32 master weights for bf16/fp16 parameters. */
  const stoke_precision_v1 *precision;
  /* Activation recomputation (core/recompute.c): NULL or "none"; "auto":
   * the forward nodes cheapest to run again per byte they free are re-run
   * in backward until the plan fits memory_budget; or a comma-separated
   * list of node-name patterns ("h.*.attn, layer3.*"), each module they
   * match recomputed as one segment. */
  const char *recompute;
  double memory_budget;       /* bytes the whole plan may take (recompute = auto); 0: no limit */
  int no_fwd_in_bwd;          /* run softmax_ce's forward as its own node even when its backward kernel
                               * could do both (core/fuse_grad.c; for A/B runs and tests) */
  int no_bias_fold;           /* with fuse: keep linears' biases out of the add_layer_norms after them
                               * (core/fuse_act.c's stoke_fuse_bias_ln; for A/B runs) */
  /* [run] wgrad_stream: 0 runs everything on the compute stream; k > 0 lets
   * backward kernels with STOKE_KCAP_SIDE_GRADS compute their parameter
   * gradients on a second stream, each waited for before the k-th such node
   * after it (or before the first node that touches those gradients). */
  int wgrad_stream;
  /* keep max_pool2d as it is in training instead of max_pool2d_idx, whose
   * forward saves the window indices its backward reads (core/plan.c's
   * index_max_pools; [run] pool_index = false, for A/B runs and tests) */
  int no_pool_index;
  /* keep a ResNet block's shortcut batch_norm apart from its bn_add_relu
   * instead of joining them into bn_add_bn_relu (core/plan.c's
   * fuse_shortcut_bns; [run] fuse_shortcut = false, for A/B runs and tests) */
  int no_fuse_shortcut;
  /* in an NHWC graph, a parameter read only as convolutions' filters is kept
   * [O, kh, kw, C/groups] in memory (labelled NHWC: channels_last, as
   * PyTorch's model.to(memory_format=torch.channels_last) keeps it), so
   * cuDNN's NHWC kernels read it as it is; 0 keeps [O, C/groups, kh, kw],
   * which cuDNN's engines transposed on every call (BENCHMARKS.md run 32).
   * Checkpoints and initial values are [O, C, kh, kw] either way
   * (stoke_plan_filters_permute). [run] filter_layout. */
  int filter_ohwi;
} stoke_plan_opts;

#define STOKE_MAX_ENGINES 32

typedef struct stoke_plan {
  stoke_graph *g;
  stoke_plan_opts opts;           /* engines/selves point at the copies below */
  const char *engines[STOKE_MAX_ENGINES];
  void *engine_selves[STOKE_MAX_ENGINES];
  size_t bytes[STOKE_BUF_COUNT];
  size_t opt_state_bytes;
  const stoke_optimizer_v1 *opt;  /* NULL: no update (eval plans) */
  int opt_state_per_param;        /* the optimizer's n_state: 1 (sgd momentum), 2 (adamw m, v) */
  stoke_dtype state_dtype;        /* of the optimizer state (the master dtype) */
  int has_master;                 /* state_dtype is not the params': their master copy leads the state */
  int64_t n_params;               /* elements */
  const stoke_kernel_v1 *opt_kernel;
  const stoke_kernel_v1 *amp_check, *amp_update; /* loss scaler, or NULL */
  const stoke_kernel_v1 *grad_norm; /* clipping by the global norm, or NULL */
  /* weight decay by group: n_decay element ranges [start, end) of the flat
   * buffer (pairs in decay[]); n_decay = -1: every element */
  int64_t *decay;
  int n_decay;
  double fwd_flops;               /* per step, whole graph */
  double train_flops;             /* forward + backward (3x convention) */
  double step_bytes;              /* least memory traffic of a step run node by node */
  size_t workspace_bytes;         /* largest node workspace */
  int n_schedule;                 /* nodes executed per micro-batch */
  int n_accumulated;              /* gradient sums done in place by their producers */
  int n_fwd_in_bwd;               /* forward nodes whose backward kernel does their work */
  int n_pool_index;               /* max_pool2d nodes made max_pool2d_idx (their indices saved for backward) */
  int n_shortcut_bn;              /* shortcut batch_norms joined to their bn_add_relu (bn_add_bn_relu) */
  /* core/layout.c: 4-D values converted between NHWC and row-major order for a reader that assumes the other
   * (a copy each), values relabelled where both orders are one memory (C or H W is 1), the first names */
  int n_layout_converted, n_layout_relabelled;
  int n_filters_ohwi;             /* parameters kept [O, kh, kw, C] (opts.filter_ohwi) */
  char layout_converted[256];
  int n_side;                     /* backward nodes whose parameter gradients may run on the side stream ([run] wgrad_stream) */
  /* recomputation: forward nodes re-run in backward, their segments, the
   * FLOPs they add per micro-batch (not in train_flops: MFU counts the
   * model's FLOPs), the activation arena without them, and the report's
   * list of segments (NULL: none) */
  int n_recomputed, n_recompute_segments;
  double recompute_flops;
  size_t arena_without_recompute;
  char *recompute_report;
} stoke_plan;

/* Derive backward (when opts->training), resolve every node to a kernel
 * over the ordered engine list, plan memory. The graph must have its loss
 * attached when training. */
stoke_err *stoke_compile(stoke_graph *g, const stoke_plan_opts *opts,
                         stoke_plan **out);
void stoke_plan_free(stoke_plan *p);
/* Host copies of the flat parameter buffer and of the optimizer state
 * (either may be NULL) between the order checkpoints and initial values
 * use, every parameter row-major ([O, C, kh, kw]), and the device's, where
 * a parameter kept [O, kh, kw, C] (filter_ohwi) is so in the parameters
 * and in each optimizer tensor over them (to_device 1: into the device's
 * order; 0: back). opt_regions: how many of the optimizer's tensors
 * opt_state holds from its start (the master copy first where the plan has
 * one: 1 for that alone); < 0, all the plan's. Nothing to do (and no
 * allocation) without such parameters. */
stoke_err *stoke_plan_filters_permute(const stoke_plan *p, void *params, void *opt_state, int opt_regions,
                                      int to_device);
/* The value whose memory v is (itself unless v is a view or an in-place
 * gradient; core/alias.c) and v's byte offset in it. */
int stoke_alias_root(const stoke_graph *g, int v, size_t *off);
/* Bytes a compiled plan asks of the device besides the kernels'
 * workspace: the flat buffers, the optimizer state and the arena. */
double stoke_plan_device_bytes(const stoke_plan *p);
/* The report: each node, its shapes, engine, FLOPs; memory by kind. */
void stoke_plan_report(const stoke_plan *p, FILE *f);

/* ------------------------------------------------------------- execute */

typedef struct stoke_exec stoke_exec;

/* Bind the plan to memory of `device` (the device engine): allocates the
 * buffers, the optimizer state and the workspace once, builds every
 * kernel's arguments and calls each kernel's plan(). Parameters are
 * initialized from `seed` (the same on any backend). */
stoke_err *stoke_exec_new(stoke_plan *p, const stoke_backend_v1 *device,
                          void *device_self, uint64_t seed, stoke_exec **out);
/* Same, but parameters and state live in `share`'s buffers (an eval plan
 * of the same model sharing the training plan's weights). The two graphs
 * must declare the same parameters and state in the same order. */
stoke_err *stoke_exec_new_shared(stoke_plan *p, stoke_exec *share, stoke_exec **out);
void stoke_exec_free(stoke_exec *x);
/* Device memory the exec allocated (its buffers, optimizer state and
 * workspace; a shared exec counts only its own), all of it held from
 * stoke_exec_new to stoke_exec_free: the step's peak, as PyTorch's
 * max_memory_allocated counts tensors and workspaces. */
size_t stoke_exec_device_bytes(const stoke_exec *x);
stoke_plan *stoke_exec_plan(stoke_exec *x);
/* A copy between host and the executor's device (synchronizes). */
stoke_err *stoke_exec_copy(stoke_exec *x, void *dst, const void *src, size_t bytes,
                           stoke_copy_kind kind);
/* A step of several micro-batches that a signal drops halfway: each
 * micro-batch's forward has updated the state buffer (batch norms' running
 * statistics) already, and the resume redoes them. keep copies the state
 * buffer on the device (in stream order, no sync) at the step's start;
 * restore puts it back (synchronizes). No-ops without a state buffer. */
stoke_err *stoke_exec_state_keep(stoke_exec *x);
stoke_err *stoke_exec_state_restore(stoke_exec *x);
/* Copy `value`'s contents to host memory (synchronizes). */
stoke_err *stoke_exec_read(stoke_exec *x, int value, void *host, size_t bytes);

/* Device pointers of the batch values (write them before a step). */
void *stoke_exec_input(stoke_exec *x);
void *stoke_exec_labels(stoke_exec *x);
/* A value's tensor (device pointer) by id, for tests and reports. */
stoke_tensor stoke_exec_tensor(stoke_exec *x, int value);
/* The flat buffers (device pointers). */
void *stoke_exec_buffer(stoke_exec *x, stoke_buffer_id b);
void *stoke_exec_opt_state(stoke_exec *x);

/* One micro-batch: forward, and backward when training. `first_micro`
 * selects overwrite (1) or accumulation (0) of parameter gradients. */
stoke_err *stoke_exec_forward_backward(stoke_exec *x, int first_micro,
                                       uint64_t step_seed);
/* Called on the host after each node that forward_backward enqueued
 * (`node`: its index in the schedule), and with node = -1 before the
 * update of stoke_exec_micro's last micro-batch; data-parallel training
 * launches gradient all-reduces from here and makes the update wait for
 * them. NULL removes it. */
typedef stoke_err *(*stoke_exec_hook)(void *ctx, int node);
/* The hook's node argument besides a schedule index: the update comes
 * next; a captured step graph was just launched (its collectives, captured
 * from the hook's own calls, run inside it). */
#define STOKE_EXEC_HOOK_UPDATE (-1)
#define STOKE_EXEC_HOOK_REPLAYED (-2)
void stoke_exec_set_hook(stoke_exec *x, stoke_exec_hook hook, void *ctx);
/* Crash notes (core/crash.c): the executor names the kernel it runs (NULL
 * after it), and once installed a SIGSEGV or SIGBUS inside it prints the
 * node, op, pass and engine, and for a backward the inputs and outputs it
 * got without data (not in the op's bwd_needs), before dying of it. */
void stoke_crash_note_kernel(const stoke_kernel_v1 *k, const stoke_kernel_args_v1 *a);
void stoke_crash_guard_install(void);
/* One optimizer update over the flat buffers. */
stoke_err *stoke_exec_update(stoke_exec *x, const stoke_opt_args_v1 *opt);
/* The loss scaler's state (scale, good steps, found_inf, skipped steps);
 * returns 0 without a scaler. Synchronizes. */
int stoke_exec_read_scaler(stoke_exec *x, float out[4]);
/* Restore the scaler (resume): the scale and its count of clean steps
 * since it last changed; the flags start at 0, and the loss seed takes the
 * scale. No-op without a scaler. */
stoke_err *stoke_exec_set_scale(stoke_exec *x, float scale, float good_steps);
/* Per-op profile: when on, every kernel of the following steps is timed
 * with the device's timers (this synchronizes once per step: a profiling
 * mode, not for speed runs). The report gives time per node and per op
 * type and pass, over the profiled steps. */
stoke_err *stoke_exec_profile(stoke_exec *x, int on);
/* [run] detect_anomaly, PyTorch's torch.autograd.detect_anomaly: when on,
 * the batch before the first node, every float tensor each node writes,
 * and the parameters after the update are read back and checked; the
 * first NaN or inf is an STOKE_E_NUMERIC error naming the node (op, pass,
 * engine), the tensor, its shape and the first bad element. Eager only
 * (graphs off), one sync per node: for finding a divergence, not for
 * speed. skip_backward: the backward's gradients are not checked (the fp16
 * loss scaler's overflows are expected there; it skips those steps). */
stoke_err *stoke_exec_anomaly(stoke_exec *x, int on, int skip_backward);
void stoke_exec_profile_report(stoke_exec *x, FILE *f);
/* One micro-batch of a step: forward and backward, then the optimizer
 * update when `last_micro` (forward_backward + update). With graphs on,
 * each (first, last) kind runs eagerly once, is captured on its second
 * use and replayed from then on: no launch but the graph's, and the
 * update reads lr and step from the device. While the profile is on
 * (run.trace's window) a micro-batch runs eagerly instead, each kernel
 * timed: the launches the graph holds, with the same buffers and
 * arguments, so the result is the replay's; the graph is kept and
 * replayed again once the profile is off. */
stoke_err *stoke_exec_micro(stoke_exec *x, int first_micro, int last_micro, uint64_t step_seed,
                            const stoke_opt_args_v1 *opt);
/* Whole-step graphs on or off: an error names why they cannot be used (a
 * device without capture, dropout, the per-op profile). Off destroys the
 * graphs captured so far: before a comm that captured collectives into
 * them closes (NCCL's abort waits for every graph holding its work). */
stoke_err *stoke_exec_graphs(stoke_exec *x, int on);
/* GPU operations in one step of `accumulate` micro-batches as captured
 * (the first, middle and last micro-batch each have their graph; 0 until
 * each graph that step uses is captured). */
int64_t stoke_exec_graph_ops(const stoke_exec *x, int64_t accumulate);
/* Data parallel's view of a compiled graph (core/dp.c): each parameter
 * gradient's place in the flat buffer and `ready`, the schedule index of
 * the last backward node that writes it (recomputed forward copies write
 * none), in value order; out has room for g->n_values. Returns how many,
 * or -1 out of memory. */
struct stoke_dist_grad;
int stoke_graph_param_grads(const stoke_graph *g, struct stoke_dist_grad *out);
/* Micro-batches run as a launch of their captured graph so far. */
int64_t stoke_exec_graph_replays(const stoke_exec *x);
/* Count them without graphs on: records the step once (nothing runs) and
 * throws the graph away; 0 where the device cannot capture. */
stoke_err *stoke_exec_count_ops(stoke_exec *x, const stoke_opt_args_v1 *opt, int64_t *ops);
/* The profile as rows, one per op type, pass and engine (the optimizer
 * with the loss scaler is op "optimizer+scaler"), slowest first: what the
 * report's first table prints, for tools (bench). Fills at most `cap`
 * rows; returns how many there are (0: nothing profiled). */
typedef struct stoke_op_time {
  char op[32], pass[4], engine[32]; /* pass: "fwd", "bwd", "rec" (recomputed in backward) or "" */
  int nodes;                        /* nodes of this op, pass and engine */
  double ms;                        /* their time per profiled step */
} stoke_op_time;
int stoke_exec_profile_rows(stoke_exec *x, stoke_op_time *rows, int cap);
/* The last profiled step's device time in ms per node, in plan order, then
 * the update's: n_nodes + 1 values (0: no step profiled yet). */
int stoke_exec_profile_last(const stoke_exec *x, const double **ms);
/* The timer recorded on the compute stream before the last profiled step's
 * first node (NULL: none): where that step's node times start. */
void *stoke_exec_profile_start(const stoke_exec *x);
/* Read the loss of the last forward (synchronizes with the device). */
stoke_err *stoke_exec_read_loss(stoke_exec *x, double *loss);

#ifdef __cplusplus
}
#endif
#endif
