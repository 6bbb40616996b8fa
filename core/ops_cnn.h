/* core/ops_cnn.h: registration of the built-in convolutional and sequence
 * op types (core/ops_conv.c, ops_pool.c, ops_norm.c, ops_seq.c), called by
 * core/builtin.c. */
#ifndef STOKE_CORE_OPS_CNN_H
#define STOKE_CORE_OPS_CNN_H

#include "stoke/plugin.h"

stoke_err *stoke_register_conv_ops(const stoke_registry_v1 *r);
stoke_err *stoke_register_pool_ops(const stoke_registry_v1 *r);
stoke_err *stoke_register_norm_ops(const stoke_registry_v1 *r);
stoke_err *stoke_register_seq_ops(const stoke_registry_v1 *r);

#endif
