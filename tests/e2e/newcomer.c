/* tests/e2e/newcomer.c: a plugin with the mistakes a newcomer makes (issue
 * 18), for newcomer_test: an op left without a backward (`frozen`), a
 * source whose labels count from 1 (`off_by_one`), and an f32 source that
 * writes HWC images and says so (`hwc`) read by a model whose first op
 * checks every element's place (`probe`). Built from the SDK alone. */
#include <string.h>

#include "stoke/plugin.h"

const stoke_host_v1 *stoke_host;

static stoke_err *infer_same(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out) {
  out[0] = in[0];
  return NULL;
}

static stoke_err *copy_fwd(const stoke_kernel_args_v1 *a, void *st) {
  memcpy(a->out[0].data, a->in[0].data, (size_t)stoke_numel(&a->in[0].shape) * sizeof(float));
  return NULL;
}

/* The mistake: has_backward and bwd_needs left 0 (the defaults). */
static const stoke_op_type_v1 frozen_op = {STOKE_ABI(stoke_op_type_v1), .name = "frozen",
                                           .help = "identity without a backward", .n_inputs = 1,
                                           .n_outputs = 1, .infer = infer_same};

/* Sample i of `hwc`: x[c, h, w] = 100 c + 10 h + w + (i % 2), written HWC. */
enum { C = 3, H = 2, W = 4 };

static float probe_value(int64_t c, int64_t h, int64_t w, int label) { return (float)(100 * c + 10 * h + w + label); }

/* layout_probe: y = x after checking that x[n, c, h, w] is where the
 * tensor's layout says (the batch's labels are not known here: the value
 * minus its place must be 0 or 1). */
static stoke_err *probe_fwd(const stoke_kernel_args_v1 *a, void *st) {
  const stoke_tensor *x = &a->in[0];
  const float *p = x->data;
  int nhwc = x->layout == STOKE_NHWC;
  for (int64_t n = 0; n < x->shape.d[0]; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t w = 0; w < W; w++) {
          int64_t i = nhwc ? ((n * H + h) * W + w) * C + c : ((n * C + c) * H + h) * W + w;
          float d = p[i] - probe_value(c, h, w, 0);
          if (d != 0 && d != 1)
            return STOKE_PERR(STOKE_E_DATA,
                              "layout_probe: x[%lld, %lld, %lld, %lld] is %g, expected %g or %g: the images "
                              "were read in another memory order than the source wrote",
                              (long long)n, (long long)c, (long long)h, (long long)w, p[i],
                              probe_value(c, h, w, 0), probe_value(c, h, w, 1));
        }
  return copy_fwd(a, st);
}

static const stoke_op_type_v1 probe_op = {STOKE_ABI(stoke_op_type_v1), .name = "layout_probe",
                                          .help = "identity that checks the image memory order", .n_inputs = 1,
                                          .n_outputs = 1, .infer = infer_same, .has_backward = STOKE_NO_GRAD};

static const stoke_kernel_v1 kernels[] = {
    {.engine = "cpu", .op = "frozen", .pass = STOKE_FWD, .dtype = STOKE_F32, .run = copy_fwd},
    {.engine = "cpu", .op = "layout_probe", .pass = STOKE_FWD, .dtype = STOKE_F32, .run = probe_fwd},
};

/* probe: layout_probe -> flatten -> linear to the classes. */
static stoke_err *probe_build(const stoke_cfg *cfg, const char *sec, const stoke_builder_v1 *b, int x,
                              int64_t classes, int *logits) {
  int y, f, wt, bias;
  STOKE_PROPAGATE_P(b->node(b->g, "layout_probe", "probe", &x, 1, "", &y, 1));
  STOKE_PROPAGATE_P(b->node(b->g, "flatten", "flat", &y, 1, "", &f, 1));
  stoke_init_v1 init = {STOKE_INIT_UNIFORM, -0.1, 0.1};
  STOKE_PROPAGATE_P(b->param(b->g, "fc.weight", &(stoke_shape){2, {classes, C * H * W}}, init, &wt));
  STOKE_PROPAGATE_P(b->param(b->g, "fc.bias", &(stoke_shape){1, {classes}}, init, &bias));
  return b->node(b->g, "linear", "fc", (int[]){f, wt, bias}, 3, "", logits, 1);
}

static const stoke_model_v1 probe_model = {STOKE_ABI(stoke_model_v1), "probe", "checks the input's memory order",
                                           NULL, 0, probe_build};

/* ------------------------------------------------------------- sources */

typedef struct src {
  int hwc;
} src;

static src hwc_src = {1}, off_src = {0};

static stoke_err *hwc_open(const stoke_cfg *c, const char *sec, void **self) {
  *self = &hwc_src;
  return NULL;
}
static stoke_err *off_open(const stoke_cfg *c, const char *sec, void **self) {
  *self = &off_src;
  return NULL;
}
static void src_close(void *self) {}
static int64_t src_length(void *self) { return 512; }

static stoke_err *src_info(void *self, stoke_sample_info_v1 *o) {
  memset(o, 0, sizeof *o);
  if (((src *)self)->hwc) {
    o->shape = (stoke_shape){3, {C, H, W}};
    o->layout = STOKE_NHWC; /* written HWC, and said */
  } else {
    o->shape = (stoke_shape){1, {8}};
  }
  o->dtype = STOKE_F32;
  o->classes = 2;
  return NULL;
}

static stoke_err *src_read(void *self, int64_t index, uint64_t seed, void *dst, int32_t *label) {
  float *x = dst;
  int y = (int)(index % 2);
  if (((src *)self)->hwc) {
    for (int h = 0; h < H; h++)
      for (int w = 0; w < W; w++)
        for (int c = 0; c < C; c++) x[(h * W + w) * C + c] = probe_value(c, h, w, y);
    *label = y;
  } else {
    for (int i = 0; i < 8; i++) x[i] = (float)(y ? i : -i);
    *label = y + 1; /* the mistake: classes 1 and 2 of 2 */
  }
  return NULL;
}

static const stoke_source_v1 hwc_source = {STOKE_ABI(stoke_source_v1), "hwc", "f32 HWC images, said STOKE_NHWC",
                                           NULL, 0, hwc_open, src_close, src_length, src_info, src_read};
static const stoke_source_v1 off_source = {STOKE_ABI(stoke_source_v1), "off_by_one", "labels 1 and 2 of 2 classes",
                                           NULL, 0, off_open, src_close, src_length, src_info, src_read};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  STOKE_PROPAGATE_P(r->add_op(r->self, &frozen_op));
  STOKE_PROPAGATE_P(r->add_op(r->self, &probe_op));
  for (size_t i = 0; i < sizeof kernels / sizeof *kernels; i++) STOKE_PROPAGATE_P(r->add_kernel(r->self, &kernels[i]));
  STOKE_PROPAGATE_P(r->add_model(r->self, &probe_model));
  STOKE_PROPAGATE_P(r->add_source(r->self, &hwc_source));
  return r->add_source(r->self, &off_source);
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "newcomer",
                                                            "a newcomer's mistakes, for tests", reg};
