/* stoke/ops.h: the built-in op types (registered by the core) and the
 * index of each attribute, so kernels in any backend read them directly:
 * node->attrs[STOKE_SOFTMAX_CE_LABEL_SMOOTHING].f */
#ifndef STOKE_OPS_H
#define STOKE_OPS_H

/* linear: in (x[N, in], weight[out, in], bias[out]) -> y[N, out]
 * (PyTorch's nn.Linear layout: y = x W^T + b). No attributes. */
#define STOKE_OP_LINEAR "linear"

/* relu: x -> max(x, 0), any shape. No attributes. */
#define STOKE_OP_RELU "relu"

/* softmax_ce: (logits[N, C], labels[N] i32) -> loss[1] (f32; f64 for f64
 * logits), the mean over the batch of -log softmax(logits)[label], as
 * nn.CrossEntropyLoss. The loader rejects labels outside [0, C) per sample;
 * kernels still check them (STOKE_E_DATA) rather than read out of a row. */
#define STOKE_OP_SOFTMAX_CE "softmax_ce"
#define STOKE_SOFTMAX_CE_LABEL_SMOOTHING 0 /* float, default 0 */

/* add: (a, b) -> a + b, same shapes (residual connections; also inserted
 * by the compiler to sum the gradients of a value used twice). */
#define STOKE_OP_ADD "add"

/* Optimizer updates (pass STOKE_OPT) over the flat buffers. */
#define STOKE_OP_SGD "sgd"     /* state: momentum buffer (1x params) */
#define STOKE_OP_ADAMW "adamw" /* state: m then v (2x params) */

#endif
