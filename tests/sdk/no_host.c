/* tests/sdk/no_host.c: a plugin whose register() forgets `stoke_host = h;`
 * (the mistake plugins/README.md warns of): its op `no_host_act` logs
 * through stoke_host in its forward kernel, a read through a NULL pointer.
 * tools/plugin_check and train's crash note must say what it likely is. */
#include "stoke/plugin.h"

const stoke_host_v1 *stoke_host;

static stoke_err *infer(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out) {
  out[0] = in[0];
  return NULL;
}

#define COPY_KERNELS(T, SUFFIX)                                                             \
  static stoke_err *fwd_##SUFFIX(const stoke_kernel_args_v1 *a, void *st) {               \
    stoke_host->log(STOKE_LOG_INFO, "no_host", "forward of '%s'", a->node->name); /* NULL */ \
    const T *x = a->in[0].data;                                                             \
    T *y = a->out[0].data;                                                                  \
    for (int64_t i = 0; i < stoke_numel(&a->in[0].shape); i++) y[i] = x[i];                 \
    return NULL;                                                                            \
  }                                                                                         \
  static stoke_err *bwd_##SUFFIX(const stoke_kernel_args_v1 *a, void *st) {               \
    const T *dy = a->dout[0].data;                                                          \
    T *dx = a->din[0].data;                                                                 \
    for (int64_t i = 0; dx && i < stoke_numel(&a->in[0].shape); i++) dx[i] = dy[i];        \
    return NULL;                                                                            \
  }
COPY_KERNELS(float, f32)
COPY_KERNELS(double, f64)

static const stoke_op_type_v1 op = {STOKE_ABI(stoke_op_type_v1), .name = "no_host_act", .help = "identity",
                                    .n_inputs = 1, .n_outputs = 1, .infer = infer,
                                    .bwd_needs = STOKE_BWD_NEEDS_NOTHING, .has_backward = STOKE_HAS_BACKWARD};
#define K(p, dt, fn) {.engine = "cpu", .op = "no_host_act", .pass = p, .dtype = dt, .run = fn}
static const stoke_kernel_v1 kernels[] = {K(STOKE_FWD, STOKE_F32, fwd_f32), K(STOKE_BWD, STOKE_F32, bwd_f32),
                                          K(STOKE_FWD, STOKE_F64, fwd_f64), K(STOKE_BWD, STOKE_F64, bwd_f64)};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  (void)h; /* the mistake: stoke_host is not set */
  STOKE_PROPAGATE_P(r->add_op(r->self, &op));
  for (unsigned i = 0; i < sizeof kernels / sizeof *kernels; i++) STOKE_PROPAGATE_P(r->add_kernel(r->self, &kernels[i]));
  return NULL;
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "no_host",
                                                            "a plugin that forgets stoke_host", reg};
