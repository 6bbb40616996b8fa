/* stoke/tensorboard.h: TensorBoard scalars: an events.out.tfevents.* file
 * of Event protobufs in TFRecord framing, written without TensorFlow. */
#ifndef STOKE_TENSORBOARD_H
#define STOKE_TENSORBOARD_H

#include <stdint.h>

#include "stoke/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct stoke_tb stoke_tb;

/* Creates `dir` (and its parents) and in it a new event file named as
 * TensorFlow's writer names them; its first event says the file version. */
stoke_err *stoke_tb_open(const char *dir, stoke_tb **out);
/* One event at `step`: n scalars (tags such as "train/loss"); NaN values
 * (not measured) are left out. Flushed, so `tensorboard` sees it at once. */
__attribute__((warn_unused_result)) stoke_err *stoke_tb_scalars(stoke_tb *tb, int64_t step, const char *const *tags,
                                                                const double *values, int n);
const char *stoke_tb_path(const stoke_tb *tb);
void stoke_tb_close(stoke_tb *tb);

/* TFRecord's checksum: CRC-32C rotated right by 15 bits plus 0xa282ead8. */
uint32_t stoke_tb_masked_crc(const void *p, size_t n);

#ifdef __cplusplus
}
#endif
#endif
