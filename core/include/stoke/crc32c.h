/* stoke/crc32c.h: CRC-32C (Castagnoli), the checksum of iSCSI, ext4 and
 * TFRecord, over checkpoint tensors and run state. */
#ifndef STOKE_CRC32C_H
#define STOKE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Extends `crc` (0 to start) by n bytes: the standard CRC-32C, so
 * stoke_crc32c(0, "123456789", 9) == 0xE3069283. */
uint32_t stoke_crc32c(uint32_t crc, const void *p, size_t n);

#ifdef __cplusplus
}
#endif
#endif
