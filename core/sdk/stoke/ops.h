/* stoke/ops.h: the built-in op types (registered by the core) and the
 * index of each attribute, so kernels in any backend read them directly:
 * node->attrs[STOKE_SOFTMAX_CE_LABEL_SMOOTHING].f */
#ifndef STOKE_OPS_H
#define STOKE_OPS_H

#include <stdint.h>

/* linear: in (x[N, in], weight[out, in], bias[out]) -> y[N, out]
 * (PyTorch's nn.Linear layout: y = x W^T + b). No attributes. */
#define STOKE_OP_LINEAR "linear"

/* linear_relu: linear then ReLU in one node, y = max(x W^T + b, 0), what
 * the compiler makes of a linear whose output only a relu reads (so GPU
 * engines can use a ReLU epilogue). Backward reads x, W and y. */
#define STOKE_OP_LINEAR_RELU "linear_relu"

/* relu: x -> max(x, 0), any shape. No attributes. */
#define STOKE_OP_RELU "relu"

/* gelu: x -> x Phi(x), any shape, as nn.GELU: approximate = "none" uses
 * the exact normal CDF, 0.5 x (1 + erf(x / sqrt 2)); "tanh" uses
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Backward reads x. */
#define STOKE_OP_GELU "gelu"
#define STOKE_GELU_APPROXIMATE 0 /* str: "none" (default) or "tanh" */

/* linear_act: linear then an activation in one node, what the compiler
 * (run.fuse) makes of linear -> relu|gelu -> linear, so that a GPU engine
 * applies the activation in the product's epilogue and the next linear's
 * backward applies its gradient (cuBLASLt's *_AUX_BIAS forward, D*_BGRAD
 * backward epilogues).
 *   in (x[N, in], weight[out, in], bias[out]) -> (y[N, out], aux)
 *   y = act(z), z = x W^T + b;  aux: what the gradient needs of z:
 *   act = relu: u8[N, ceil(out / 128) * 16], a bitmask; bit j of row i is
 *     bit j % 8 of byte i * stride + j / 8, set iff z[i, j] > 0 (bits past
 *     `out` are unspecified: cuBLASLt writes whole tiles' bits, so a
 *     reader looks at j < out only). cuBLASLt's RELU_AUX layout: 1 bit per element, a
 *     leading dimension that is a multiple of 128 bits.
 *   act = gelu: z itself, [N, out] in y's dtype (GELU_AUX).
 * It has no backward of its own: the compiler hands the activation's
 * gradient to the next linear's backward (linear_dact below) and what is
 * left of this node's backward is a linear's, reading dz. */
#define STOKE_OP_LINEAR_ACT "linear_act"
#define STOKE_LINEAR_ACT_ACT 0         /* str: "relu" or "gelu" */
#define STOKE_LINEAR_ACT_APPROXIMATE 1 /* str: gelu's, "none" or "tanh" */

/* linear_dact: a backward-only node the compiler makes (never a model):
 * the backward of a linear L2 whose input y1 is the output of a
 * linear_act L1, with L1's activation gradient folded into L2's
 * data-gradient product.
 *   in (y1[N, in], weight[out, in], bias[out], aux1, bias1[in]), dout[0] =
 *   dy2 -> din[0] = dz1 = (dy2 W) * act'(z1), the gradient of L1's
 *   PRE-activation (not of y1); din[1], din[2] as linear's backward (dW,
 *   db of L2); din[4], when asked for, d bias1 = column sums of dz1 (the
 *   D*_BGRAD epilogues; the compiler leaves d bias1 to L1's own backward,
 *   see core/fuse_act.c).
 * Attributes: L1's act and approximate (indices as linear_act's). Reads
 * y1, weight and aux1. */
#define STOKE_OP_LINEAR_DACT "linear_dact"

/* softmax_ce: (logits[N, C], labels[N] i32) -> (loss[1], lse[N]) (both f32;
 * f64 for f64 logits): loss is the mean over the batch of
 * -log softmax(logits)[label], as nn.CrossEntropyLoss; lse[r] is row r's
 * log-sum-exp, saved so that the backward reads the logits once:
 *   dlogits = (softmax - (1 - ls) onehot - ls / C) dloss / N.
 * Large vocabularies (GPT-2's 50,304): kernels never make an f32 copy of
 * bf16/fp16 logits (the forward streams each row once with an online max
 * and sum), and the backward may write dlogits over the logits: din[0]
 * can be the same memory as in[0] (the compiler does that when the loss
 * is the logits' last reader), so each element is read before it is
 * written, by the same thread. The loader rejects labels outside [0, C)
 * per sample; CPU kernels return STOKE_E_DATA; GPU kernels cannot tell the
 * host without a sync, so they clamp the read and make that row's loss
 * NaN, which stops the run at the next log step with the NaN-loss
 * message. */
#define STOKE_OP_SOFTMAX_CE "softmax_ce"
#define STOKE_SOFTMAX_CE_LABEL_SMOOTHING 0 /* float, default 0 */

/* add: (a, b) -> a + b, same shapes (residual connections; also inserted
 * by the compiler to sum the gradients of a value used twice). */
#define STOKE_OP_ADD "add"

/* ---- convolutional ops (CPU kernels support NCHW and NHWC: shapes are
 * always logical (N, C, H, W); the tensor's layout says the memory order) */

/* conv2d: (x[N, C, H, W], weight[O, C/groups, kh, kw]) -> y[N, O, Ho, Wo],
 * as nn.Conv2d(bias=False); Ho = (H + 2p - d(kh-1) - 1)/s + 1. */
#define STOKE_OP_CONV2D "conv2d"
#define STOKE_CONV2D_STRIDE 0   /* ints, "1" or "2x2" */
#define STOKE_CONV2D_PADDING 1  /* ints, "0" */
#define STOKE_CONV2D_DILATION 2 /* ints, "1" */
#define STOKE_CONV2D_GROUPS 3   /* int, 1 */

/* bias_add: (x[N, C, ...], bias[C]) -> x + bias per channel (conv bias). */
#define STOKE_OP_BIAS_ADD "bias_add"

/* flatten: x[N, ...] -> [N, prod(...)] in logical (C, H, W) order, as
 * torch.flatten(x, 1) on an NCHW tensor, whatever the memory layout. */
#define STOKE_OP_FLATTEN "flatten"

/* global_avg_pool: x[N, C, H, W] -> [N, C] (nn.AdaptiveAvgPool2d(1) + flatten). */
#define STOKE_OP_GLOBAL_AVG_POOL "global_avg_pool"

/* max_pool2d / avg_pool2d: x[N, C, H, W] -> [N, C, Ho, Wo], as nn.MaxPool2d /
 * nn.AvgPool2d (count_include_pad=True, ceil_mode=False). */
#define STOKE_OP_MAX_POOL2D "max_pool2d"
#define STOKE_OP_AVG_POOL2D "avg_pool2d"
/* max_pool2d_idx: max_pool2d that also writes, per output, the position of
 * its window's first maximum: x[N, C, H, W] -> (y[N, C, Ho, Wo],
 * index[N, C, Ho, Wo] u8 in y's layout, kh kw positions row-major inside the
 * padded window; at most 127 of them). Its backward reads the index, not x:
 * dx[h, w] = the sum of dy over the windows whose index points at (h, w).
 * The compiler puts it in place of a training graph's max_pool2d when an
 * engine serves it (as PyTorch's max_pool2d saves its indices for backward),
 * so x need not stay alive until backward and is not read again. */
#define STOKE_OP_MAX_POOL2D_IDX "max_pool2d_idx"
#define STOKE_POOL_MAX_INDEX 127 /* window positions a u8 index may name */
#define STOKE_POOL_KERNEL 0  /* ints, required */
#define STOKE_POOL_STRIDE 1  /* ints, default = kernel ("0" means kernel) */
#define STOKE_POOL_PADDING 2 /* ints, "0" */

/* dropout: x -> x * mask / (1 - p) in training, x in eval; element i is
 * kept iff stoke_uniform_at(args->seed, i) >= p (i in memory order): the
 * same on every backend, and the backward kernel, which gets the same
 * seed, regenerates the mask instead of storing it. */
#define STOKE_OP_DROPOUT "dropout"
#define STOKE_DROPOUT_P 0 /* float, 0.5 */

/* batch_norm: (x[N, C, ...], weight[C], bias[C], running_mean[C],
 * running_var[C]) -> (y, saved_mean[C], saved_invstd[C]), as nn.BatchNorm2d
 * / BatchNorm1d. Training: normalize by the batch's mean and biased
 * variance, write them as saved_mean and 1/sqrt(var + eps), and update the
 * running statistics IN PLACE (inputs 3 and 4 are STATE values):
 * running = (1 - momentum) running + momentum batch, with the unbiased
 * variance (n/(n-1)) for running_var. Eval: normalize by the running
 * statistics (saved_* then hold them). Running and saved statistics are
 * f32 (f64 for f64 x); weight and bias have x's dtype, statistics are
 * accumulated in f32 or wider. */
#define STOKE_OP_BATCH_NORM "batch_norm"
#define STOKE_BATCH_NORM_EPS 0      /* float, 1e-5 */
#define STOKE_BATCH_NORM_MOMENTUM 1 /* float, 0.1 */

/* bn_relu: batch_norm then ReLU in one node, y = max(bn(x), 0), what the
 * compiler makes of a batch_norm whose output only a relu reads (run.fuse)
 * when an engine has the fused kernels. Inputs, outputs, attributes and
 * running-statistics update as batch_norm's; backward reads x, weight,
 * bias and saved_*, not y: the ReLU's mask, y > 0, is recomputed as
 * (x - saved_mean) (weight saved_invstd) + bias > 0 (rounded to y's dtype),
 * the saved f32 invstd used as the forward uses it.
 * bn_add_relu: y = max(bn(x) + r, 0), the ResNet block's tail (batch_norm
 * -> add -> relu), with the residual r[x's shape] as input 5 and the
 * ReLU's mask as output 3: u8 [stoke_relu_mask_bytes(numel of y)], bit
 * i % 8 of byte i / 8 set when element i of y, in y's memory order and as
 * stored (rounded to its dtype), is > 0 (the padding bits unspecified).
 * Backward reads x, weight, saved_* and the mask (not y: 2 bytes an element
 * of bf16 become 1/8) and also writes dr, the masked output gradient that
 * flows into the add. */
#define STOKE_OP_BN_RELU "bn_relu"
#define STOKE_OP_BN_ADD_RELU "bn_add_relu"
#define STOKE_BN_ADD_RELU_RESIDUAL 5 /* the input index of r */
#define STOKE_BN_ADD_RELU_MASK 3     /* the output index of the ReLU's mask */
/* bn_add_bn_relu: y = max(bn(x) + bn2(r), 0), a ResNet block whose
 * shortcut is a strided convolution and its batch norm (torchvision's
 * downsample): the compiler joins a bn_add_relu and the batch_norm that
 * alone makes its residual (run.fuse_shortcut). Inputs: bn_add_relu's six,
 * r (5) now the shortcut batch norm's x, then that batch norm's weight,
 * bias, running_mean and running_var (6-9, the running statistics STATE,
 * updated in place). Outputs: bn_add_relu's four, then the shortcut's
 * saved_mean and saved_invstd (4, 5). Attributes: eps and momentum of the
 * main batch norm, then of the shortcut's. Each normalized value is rounded
 * to y's dtype before the add, as the unfused nodes round, so it computes
 * what batch_norm -> bn_add_relu computes, without writing bn2(r) and
 * without reading it, or the residual's gradient, back: backward reads x,
 * r, both weights and saved statistics and the mask, and writes dx and dr
 * (r's gradient) from one masked dy. */
#define STOKE_OP_BN_ADD_BN_RELU "bn_add_bn_relu"
#define STOKE_BN2_WEIGHT 6       /* the shortcut's weight; bias 7, running_mean 8, running_var 9 */
#define STOKE_BN2_SAVED_MEAN 4   /* the shortcut's saved_mean; saved_invstd 5 */
#define STOKE_BN2_EPS 2          /* the shortcut's eps; momentum 3 */
/* Bytes of a ReLU bitmask over n elements: one bit each, rounded up to 16. */
static inline int64_t stoke_relu_mask_bytes(int64_t n) { return (n + 127) / 128 * 16; }

/* ---- batch norm folded into convolutions (core/ops_convbn.c; CPU
 * reference kernels in backends/cpu/convbn.c). No compiler pass makes them
 * yet, and no GPU backend serves them: cuDNN 9.14's runtime-fusion engines
 * run none of these graphs in bf16 and gain nothing in fp16 on the H100
 * (BENCHMARKS.md run 7), so a model or plugin that wants them builds them
 * itself. A conv2d -> batch_norm pair becomes a conv_bn, which writes
 * the convolution and the batch statistics of its output, and an apply op
 * where the batch_norm's output was read, which normalizes with those
 * statistics.
 * Statistics (mean, invstd, running) are f32 (f64 for f64 x), weights and
 * biases have x's dtype; 4-D tensors are NCHW or NHWC by their layout.
 *
 * The statistics contract: in training, mean and invstd are the batch
 * statistics of the value they normalize, and no gradient flows into them:
 * every op that reads them applies the full batch-norm backward through
 * them in its own backward (they are cached functions of that value). In
 * eval they are the running statistics, constants. */

/* conv_bn: (x[N, C, H, W], weight[K, C/groups, kh, kw], running_mean[K],
 * running_var[K]) -> (y[N, K, Ho, Wo], saved_mean[K], saved_invstd[K]):
 * y = conv2d(x, weight); training: the batch mean and 1/sqrt(biased var +
 * eps) of y per channel, and the running statistics updated IN PLACE as
 * batch_norm does (unbiased variance for running_var); eval: the running
 * statistics (running_mean, 1/sqrt(running_var + eps)), left alone.
 * Backward: dx and dweight from dy as conv2d's (no gradient reaches
 * saved_*, see above). Attributes: conv2d's (same indices), then eps and
 * momentum. Backward reads x and weight. */
#define STOKE_OP_CONV_BN "conv_bn"
#define STOKE_CONV_BN_EPS 4      /* float, 1e-5 */
#define STOKE_CONV_BN_MOMENTUM 5 /* float, 0.1 */
#define STOKE_CONV_BN_RUNNING_MEAN 2 /* input indices */
#define STOKE_CONV_BN_RUNNING_VAR 3

/* bn_relu_conv_bn: conv_bn whose input is the previous batch norm's
 * normalized, ReLU'd output, applied on the fly (x is never stored):
 *   in (p, p_mean[C], p_invstd[C], p_weight[C], p_bias[C], weight,
 *       running_mean[K], running_var[K])
 *   x = relu(p_weight (p - p_mean) p_invstd + p_bias), rounded to p's dtype
 *   (y, saved_mean, saved_invstd) = conv_bn(x, weight, running_*)
 * p_mean / p_invstd are the statistics of p (a conv_bn's or another
 * bn_relu_conv_bn's outputs). Backward from dy, with x recomputed:
 *   dweight = wgrad(x, dy);  dz = dgrad(dy, weight) [pre-activation > 0]
 *   d p_weight = sum dz p_hat;  d p_bias = sum dz   (p_hat = (p - p_mean) p_invstd)
 *   training: dp = p_weight p_invstd / M (M dz - sum dz - p_hat sum dz p_hat)
 *   eval:     dp = p_weight p_invstd dz
 * (sums per channel over M = N H W of p). Attributes and eps / momentum
 * (of the output statistics) as conv_bn's. Backward reads inputs 0-5. */
#define STOKE_OP_BN_RELU_CONV_BN "bn_relu_conv_bn"
#define STOKE_BN_RELU_CONV_BN_P_MEAN 1 /* input indices */
#define STOKE_BN_RELU_CONV_BN_P_INVSTD 2
#define STOKE_BN_RELU_CONV_BN_P_WEIGHT 3
#define STOKE_BN_RELU_CONV_BN_P_BIAS 4
#define STOKE_BN_RELU_CONV_BN_WEIGHT 5
#define STOKE_BN_RELU_CONV_BN_RUNNING_MEAN 6
#define STOKE_BN_RELU_CONV_BN_RUNNING_VAR 7

/* The apply ops: (y[N, C, ...], mean[C], invstd[C], weight[C], bias[C]
 * [, r]) -> out of y's shape, with b = weight (y - mean) invstd + bias
 * rounded to y's dtype:
 *   bn_apply:          out = b
 *   bn_apply_relu:     out = max(b, 0)
 *   bn_apply_add_relu: out = max(b + r, 0) (the sum rounded to y's dtype),
 *                      r of y's shape (a ResNet block's tail)
 * Backward: dweight = sum g y_hat, dbias = sum g (y_hat = (y - mean)
 * invstd), g = dout masked by the pre-activation > 0 (recomputed from the
 * inputs: the output is not kept); dy is the full batch-norm backward in
 * training (through y's batch statistics, as bn_relu_conv_bn's dp), weight
 * invstd g in eval; bn_apply_add_relu's dr = g. No attributes. Backward
 * reads y, mean, invstd and weight, and for the ReLU's mask bias (and r). */
#define STOKE_OP_BN_APPLY "bn_apply"
#define STOKE_OP_BN_APPLY_RELU "bn_apply_relu"
#define STOKE_OP_BN_APPLY_ADD_RELU "bn_apply_add_relu"
#define STOKE_BN_APPLY_MEAN 1 /* input indices */
#define STOKE_BN_APPLY_INVSTD 2
#define STOKE_BN_APPLY_WEIGHT 3
#define STOKE_BN_APPLY_BIAS 4
#define STOKE_BN_APPLY_RESIDUAL 5

/* normalize: u8 images x[N, C, H, W] (memory HWC: layout NHWC) -> float
 * (x / 255 - mean[c]) / std[c] in the graph's layout, as torchvision's
 * ToTensor + Normalize, in one pass. The first node of image models. */
#define STOKE_OP_NORMALIZE "normalize"
#define STOKE_NORMALIZE_MEAN 0 /* floats, one per channel, "0.485:0.456:0.406" */
#define STOKE_NORMALIZE_STD 1  /* floats */
#define STOKE_NORMALIZE_LAYOUT 2 /* str: "nchw" or "nhwc", the output's memory order */
#define STOKE_NORMALIZE_DTYPE 3  /* str: "f32", "bf16" or "f16", the output's dtype (the graph's) */

/* cast: f32 samples -> the graph's float dtype (f32, bf16, f16) and, for
 * 4-D images, from the memory order the source declares (CHW unless it
 * says STOKE_NHWC) to the output's layout (NHWC on the GPU): the first node
 * when an f32 source feeds a graph of another dtype or layout. No
 * backward. */
#define STOKE_OP_CAST "cast"
#define STOKE_CAST_DTYPE 0 /* str: "f32", "bf16", "f16" or "f64" */

/* ---- sequence ops (transformers); rows are the product of all but the
 * last dimension. Memory is always dense row-major (no strides). */

/* embedding: (weight[V, C], idx[...] i32) -> out[..., C], out row i =
 * weight row idx[i], as nn.Embedding (the weight comes first so that a
 * kernel is chosen by its dtype). Backward: dweight[v] accumulates the
 * sum of the dout rows whose index is v (a scatter-add); with
 * STOKE_KFLAG_DETERMINISTIC a GPU kernel sums them in a fixed order.
 * Indices outside [0, V): CPU kernels return STOKE_E_DATA naming the
 * position; GPU kernels write NaN into that row (the loss turns NaN and
 * the run stops at the next log step). A weight used by a second node as
 * well (a tied output head) gets both gradients summed. */
#define STOKE_OP_EMBEDDING "embedding"

/* position_embedding: (x[B, T, C], weight[P, C]) -> x + weight[t] for every
 * (b, t), P >= T: nanoGPT's `wte(idx) + wpe(arange(T))`. Backward: dx = dy,
 * dweight[t] accumulates sum over b of dy[b, t] (rows t >= T get 0). */
#define STOKE_OP_POSITION_EMBEDDING "position_embedding"

/* layer_norm: (x[..., C], weight[C], bias[C]) -> (y[x's shape], mean[R],
 * rstd[R]), R rows, as nn.LayerNorm(C): y = (x - mean) rstd weight + bias
 * per row, rstd = 1/sqrt(biased var + eps). mean and rstd are f32 (f64 for
 * f64 x) and computed in f32 or wider whatever x's dtype. */
#define STOKE_OP_LAYER_NORM "layer_norm"
#define STOKE_LAYER_NORM_EPS 0 /* float, 1e-5 */

/* add_layer_norm: the residual add and the layer norm after it in one
 * node, (a, b, weight[C], bias[C]) -> (s = a + b, y = layer_norm(s), mean,
 * rstd), s rounded to the dtype before it is normalized (what the two
 * nodes compute). Backward: g = ds + dlayer_norm(dy), din[0] = din[1] = g
 * (ds may be absent: only y read downstream). din[0] and din[1] may be the
 * same memory (the compiler gives a and b one gradient value when it can):
 * a kernel then writes it once. Attributes as layer_norm's. */
#define STOKE_OP_ADD_LAYER_NORM "add_layer_norm"

/* add_bias_layer_norm: add_layer_norm with a per-channel vector added to
 * the sum, (a, b, weight[C], bias[C], c[C]) -> (s = a + b + c, y =
 * layer_norm(s), mean, rstd), s rounded once to the dtype. What the
 * compiler makes of a linear whose output only an add_layer_norm reads
 * (run.fuse, core/fuse_bias_ln.c): the linear loses its bias to c, so the
 * bias gradient, the column sums of g over the rows, comes out of the pass
 * that makes g instead of a pass of its own over the linear's output
 * gradient. Backward as add_layer_norm's, and din[4] = sum over rows of g.
 * Attributes as layer_norm's. */
#define STOKE_OP_ADD_BIAS_LAYER_NORM "add_bias_layer_norm"

/* attention: causal scaled dot-product attention over the packed output of
 * one linear, qkv[B, T, 3C] -> (y[B, T, C], lse[B, H, T]), H heads of
 * D = C / H: q, k, v are qkv[..., 0:C], [C:2C], [2C:3C], each viewed as
 * [B, T, H, D] (nanoGPT's c_attn split; llm.c's layout), and
 *   y[b, t, h D + d] = sum_s softmax_s(scale q.k) v[b, s, h, d]
 * over s <= t (causal) or all s, as F.scaled_dot_product_attention;
 * lse[b, h, t] = log sum_s exp(scale q_t.k_s) (natural log, f32; f64 for
 * f64), what flash attention keeps for its backward (cuDNN's Stats).
 * FLOPs: 4 B T^2 C forward, not halved for the mask (nanoGPT's count). */
#define STOKE_OP_ATTENTION "attention"
#define STOKE_ATTENTION_N_HEAD 0 /* int, required */
#define STOKE_ATTENTION_CAUSAL 1 /* int, 1 */
#define STOKE_ATTENTION_SCALE 2  /* float, 0 = 1/sqrt(D) */

/* Views: reshape, slice, split and transpose change how a dense tensor is
 * indexed. Where the memory order allows (always for reshape; for slice
 * and split when every dimension before `dim` is 1; for transpose when at
 * most one dimension from dim0 to dim1 is larger than 1) the compiler
 * makes the output the same memory as the input (and the same for the
 * gradients of reshape and transpose), and the kernel, finding
 * out.data already at its place, does nothing; otherwise it copies.
 * reshape: x -> x with `shape` (ints "16x1024x768"; one -1 is inferred). */
#define STOKE_OP_RESHAPE "reshape"
#define STOKE_RESHAPE_SHAPE 0 /* ints, required */

/* slice: x -> x narrowed along `dim` to [start, start + length), as
 * torch.narrow (dim < 0 counts from the end). Backward: din is dout
 * inside the slice and 0 outside. */
#define STOKE_OP_SLICE "slice"
#define STOKE_SLICE_DIM 0    /* int, required */
#define STOKE_SLICE_START 1  /* int, required */
#define STOKE_SLICE_LENGTH 2 /* int, required */

/* split: x -> one output per entry of `sizes` along `dim`, as
 * torch.split(x, sizes, dim) (the sizes sum to x's dimension): the op
 * takes as many outputs as `sizes` has values. */
#define STOKE_OP_SPLIT "split"
#define STOKE_SPLIT_DIM 0   /* int, required */
#define STOKE_SPLIT_SIZES 1 /* ints, required ("768x768x768") */

/* transpose: x -> x with dimensions dim0 and dim1 swapped, as
 * x.transpose(dim0, dim1).contiguous(). */
#define STOKE_OP_TRANSPOSE "transpose"
#define STOKE_TRANSPOSE_DIM0 0 /* int, required */
#define STOKE_TRANSPOSE_DIM1 1 /* int, required */

/* matmul: (x[N, in], weight[out, in]) -> x W^T, a linear without bias
 * (nn.Linear(bias=False): GPT-2's output head, tied to the token
 * embedding). */
#define STOKE_OP_MATMUL "matmul"

/* autocast: x -> x in another float dtype (attribute dtype: f32, bf16, f16
 * or f64), same shape and layout: what the compiler puts around an op the
 * precision policy computes in f32 (stoke_precision_v1.fp32_ops). Backward
 * casts the gradient back, accumulating into a parameter's (param_grad_beta).
 * No model emits it. */
#define STOKE_OP_AUTOCAST "autocast"
#define STOKE_AUTOCAST_DTYPE 0 /* str: the output's dtype */

/* Optimizer updates (pass STOKE_OPT) over the flat buffers: the op is the
 * optimizer's name (stoke_optimizer_v1). */
#define STOKE_OP_SGD "sgd"     /* state: momentum buffer (1x params) */
#define STOKE_OP_ADAMW "adamw" /* state: m then v (2x params) */

/* grad_norm (pass STOKE_OPT), before the update when [optimizer] grad_clip
 * > 0: in[0] the flat gradients, in[1] f32[2] -> [norm, factor], norm the
 * L2 norm of every gradient times opt->grad_scale / the loss scale (opt->amp,
 * when there), factor = min(1, opt->max_norm / (norm + 1e-6)) as torch's
 * clip_grad_norm_; a step the loss scaler skips writes [inf, 1]. Summed in
 * double, in a fixed order (deterministic); plan() sizes its workspace. */
#define STOKE_OP_GRAD_NORM "grad_norm"

/* The dynamic loss scaler's device-side steps (pass STOKE_OPT, fp16), on
 * the scaler state f32[4] = (scale, good steps, found_inf, skipped):
 * amp_check: in[0] the flat gradients, in[1] the state -> found_inf = 1 if
 *   any gradient is not finite (else left as it is).
 * amp_update: in[0] the state, in[1] the loss seed (one element of the
 *   loss's dtype, d loss fed to backward) -> on found_inf: scale *=
 *   opt->backoff_factor (0: 0.5), good = 0, skipped += 1; else good += 1
 *   and, after opt->growth_interval clean steps (0: never), scale *=
 *   opt->growth_factor (0: 2) and good = 0; then seed = scale and
 *   found_inf = 0. */
#define STOKE_OP_AMP_CHECK "amp_check"
#define STOKE_OP_AMP_UPDATE "amp_update"

#endif
