/* tests/common/layout_net.h: the network of the memory-order tests
 * (core/layout.c; tests/unit/layout_test on the CPU, tests/gpu/layout_gpu_test
 * on the GPU). It mixes the two kinds of readers of 4-D values: a vector
 * reshaped into an image and convolved (a decoder's first layer), a
 * convolution's output reshaped and transposed into tokens for a linear (a
 * ViT's patch embedding) and back, an add of a convolution's output and a
 * reshaped one, a one-channel convolution reshaped, a (N, C, 1, 1) reshape
 * given a bias_add, a 4-D parameter added to an activation, a filter made by
 * a reshape, a 4-D parameter as bias_add's image. In an NHWC graph the
 * compiler converts 5 values (img, gelu1, img2, pos, pimg.p) and relabels 3
 * (conv3 for plane, pixel for pixel_bias, pixel_bias for pixel_vec). Include after cmocka.h, with OK(expr)
 * defined. */
#ifndef STOKE_TESTS_LAYOUT_NET_H
#define STOKE_TESTS_LAYOUT_NET_H

#include <stdio.h>

#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/ops.h"

enum { LN_N = 2, LN_C0 = 2, LN_C1 = 3, LN_C2 = 2, LN_H = 3, LN_W = 4, LN_CLASSES = 3 };

static __attribute__((unused)) int ln_param(stoke_graph *g, const char *name, stoke_shape s) {
  stoke_builder_v1 b = stoke_graph_builder(g);
  int v;
  OK(b.param(g, name, &s, (stoke_init_v1){STOKE_INIT_UNIFORM, -0.5, 0.5}, &v));
  return v;
}

static __attribute__((unused)) int ln_node(stoke_graph *g, const char *op, const char *name, const int *in, int n_in,
                                           const char *attrs) {
  stoke_builder_v1 b = stoke_graph_builder(g);
  int y;
  OK(b.node(g, op, name, in, n_in, attrs, &y, 1));
  return y;
}

static __attribute__((unused)) stoke_graph *layout_net(stoke_registry *reg, stoke_layout layout, stoke_dtype dt) {
  stoke_graph *g;
  OK(stoke_graph_new(reg, dt, layout, &g));
  int x, lab;
  OK(stoke_graph_input(g, "input", STOKE_VAL_INPUT, &(stoke_shape){2, {LN_N, LN_C0 * LN_H * LN_W}}, dt, &x));
  OK(stoke_graph_input(g, "label", STOKE_VAL_LABEL, &(stoke_shape){1, {LN_N}}, STOKE_I32, &lab));
  char a[96];
  snprintf(a, sizeof a, "shape=%dx%dx%dx%d", LN_N, LN_C0, LN_H, LN_W);
  int img = ln_node(g, STOKE_OP_RESHAPE, "img", &x, 1, a); /* a vector made an image, then convolved */
  int c1 = ln_node(g, STOKE_OP_CONV2D, "conv1",
                   (int[]){img, ln_param(g, "conv1.weight", (stoke_shape){4, {LN_C1, LN_C0, 3, 3}})}, 2, "padding=1");
  int r1 = ln_node(g, STOKE_OP_GELU, "gelu1", &c1, 1, ""); /* smooth: no ReLU decision rounding could flip */
  /* patch embedding: (N, C, H W) -> tokens (N, H W, C) -> a linear per token -> back to an image */
  snprintf(a, sizeof a, "shape=%dx%dx%d", LN_N, LN_C1, LN_H * LN_W);
  int seq = ln_node(g, STOKE_OP_RESHAPE, "seq", &r1, 1, a);
  int tok = ln_node(g, STOKE_OP_TRANSPOSE, "tokens", &seq, 1, "dim0=1, dim1=2");
  snprintf(a, sizeof a, "shape=%dx%d", LN_N * LN_H * LN_W, LN_C1);
  int flat = ln_node(g, STOKE_OP_RESHAPE, "rows", &tok, 1, a);
  int mix = ln_node(g, STOKE_OP_LINEAR, "mix",
                    (int[]){flat, ln_param(g, "mix.weight", (stoke_shape){2, {LN_C1, LN_C1}}),
                            ln_param(g, "mix.bias", (stoke_shape){1, {LN_C1}})},
                    3, "");
  snprintf(a, sizeof a, "shape=%dx%dx%d", LN_N, LN_H * LN_W, LN_C1);
  int tok2 = ln_node(g, STOKE_OP_RESHAPE, "tokens2", &mix, 1, a);
  int seq2 = ln_node(g, STOKE_OP_TRANSPOSE, "seq2", &tok2, 1, "dim0=1, dim1=2");
  snprintf(a, sizeof a, "shape=%dx%dx%dx%d", LN_N, LN_C1, LN_H, LN_W);
  int img2 = ln_node(g, STOKE_OP_RESHAPE, "img2", &seq2, 1, a);
  int sum0 = ln_node(g, STOKE_OP_ADD, "sum0", (int[]){r1, img2}, 2, ""); /* NHWC + row-major */
  /* a 4-D parameter (a learned position table): row-major in memory, converted for the NHWC add */
  int sum = ln_node(g, STOKE_OP_ADD, "sum",
                    (int[]){sum0, ln_param(g, "pos", (stoke_shape){4, {LN_N, LN_C1, LN_H, LN_W}})}, 2, "");
  int c2 = ln_node(g, STOKE_OP_CONV2D, "conv2",
                   (int[]){sum, ln_param(g, "conv2.weight", (stoke_shape){4, {LN_C2, LN_C1, 1, 1}})}, 2, "");
  /* a filter made by ops (a reshaped matrix: row-major, as every engine's filters are) */
  snprintf(a, sizeof a, "shape=%dx%dx3x3", LN_C2, LN_C1);
  int wv = ln_node(g, STOKE_OP_RESHAPE, "conv4.filter",
                   (int[]){ln_param(g, "conv4.w2d", (stoke_shape){2, {LN_C2, LN_C1 * 9}})}, 1, a);
  int c4 = ln_node(g, STOKE_OP_CONV2D, "conv4", (int[]){sum, wv}, 2, "padding=1");
  /* a 4-D parameter as an image: converted for bias_add */
  int pimg = ln_node(g, STOKE_OP_BIAS_ADD, "pimg",
                     (int[]){ln_param(g, "pimg.p", (stoke_shape){4, {LN_N, LN_C2, LN_H, LN_W}}),
                             ln_param(g, "pimg.b", (stoke_shape){1, {LN_C2}})},
                     2, "");
  int c24 = ln_node(g, STOKE_OP_ADD, "c24", (int[]){c2, c4}, 2, "");
  c2 = ln_node(g, STOKE_OP_ADD, "c2all", (int[]){c24, pimg}, 2, "");
  int f = ln_node(g, STOKE_OP_FLATTEN, "flatten", &c2, 1, "");
  int logits = ln_node(g, STOKE_OP_LINEAR, "fc",
                       (int[]){f, ln_param(g, "fc.weight", (stoke_shape){2, {LN_CLASSES, LN_C2 * LN_H * LN_W}}),
                               ln_param(g, "fc.bias", (stoke_shape){1, {LN_CLASSES}})},
                       3, "");
  /* one channel: either order is one memory, the reshape reads it as it is */
  int c3 = ln_node(g, STOKE_OP_CONV2D, "conv3",
                   (int[]){sum, ln_param(g, "conv3.weight", (stoke_shape){4, {1, LN_C1, 1, 1}})}, 2, "");
  snprintf(a, sizeof a, "shape=%dx%d", LN_N, LN_H * LN_W);
  int p3 = ln_node(g, STOKE_OP_RESHAPE, "plane", &c3, 1, a);
  int l3 = ln_node(g, STOKE_OP_LINEAR, "fc3",
                   (int[]){p3, ln_param(g, "fc3.weight", (stoke_shape){2, {LN_CLASSES, LN_H * LN_W}}),
                           ln_param(g, "fc3.bias", (stoke_shape){1, {LN_CLASSES}})},
                   3, "");
  /* (N, C, 1, 1) from a reshape, given a per-channel bias (relabelled, no copy)
   */
  int gap = ln_node(g, STOKE_OP_GLOBAL_AVG_POOL, "gap", &c2, 1, "");
  snprintf(a, sizeof a, "shape=%dx%dx1x1", LN_N, LN_C2);
  int px = ln_node(g, STOKE_OP_RESHAPE, "pixel", &gap, 1, a);
  int pb = ln_node(g, STOKE_OP_BIAS_ADD, "pixel_bias",
                   (int[]){px, ln_param(g, "pixel.bias", (stoke_shape){1, {LN_C2}})}, 2, "");
  snprintf(a, sizeof a, "shape=%dx%d", LN_N, LN_C2);
  int pv = ln_node(g, STOKE_OP_RESHAPE, "pixel_vec", &pb, 1, a);
  int l4 = ln_node(g, STOKE_OP_LINEAR, "fc4",
                   (int[]){pv, ln_param(g, "fc4.weight", (stoke_shape){2, {LN_CLASSES, LN_C2}}),
                           ln_param(g, "fc4.bias", (stoke_shape){1, {LN_CLASSES}})},
                   3, "");
  int out = ln_node(g, STOKE_OP_ADD, "logits3", (int[]){logits, l3}, 2, "");
  out = ln_node(g, STOKE_OP_ADD, "logits", (int[]){out, l4}, 2, "");
  OK(stoke_graph_loss(g, out, ""));
  return g;
}

#endif
