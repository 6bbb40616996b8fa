/* core/ops_cnn.h: registration of the built-in convolutional and sequence
 * op types (core/ops_conv.c, ops_pool.c, ops_norm.c, ops_convbn.c,
 * ops_seq.c), called by core/builtin.c, and the conv2d pieces the fused
 * ops share. */
#ifndef STOKE_CORE_OPS_CNN_H
#define STOKE_CORE_OPS_CNN_H

#include "stoke/check.h" /* stoke_shape_str, for messages */
#include "stoke/plugin.h"

stoke_err *stoke_register_conv_ops(const stoke_registry_v1 *r);
stoke_err *stoke_register_pool_ops(const stoke_registry_v1 *r);
stoke_err *stoke_register_norm_ops(const stoke_registry_v1 *r);
stoke_err *stoke_register_seq_ops(const stoke_registry_v1 *r);
stoke_err *stoke_register_convbn_ops(const stoke_registry_v1 *r);

/* conv2d's shape inference and FLOPs (core/ops_conv.c), which conv_bn and
 * bn_relu_conv_bn (core/ops_convbn.c) share: inputs 0 and 1 are x and the
 * weight, attributes 0-3 conv2d's; messages name the node's op. */
stoke_err *stoke_conv2d_infer(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out);
double stoke_conv2d_flops(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, const stoke_value_desc_v1 *out);

#endif
