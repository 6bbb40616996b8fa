/* stoke/status.h: the error type every stoke call returns (NULL = success).
 * Errors carry a message and the chain of contexts it climbed through. */
#ifndef STOKE_STATUS_H
#define STOKE_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum stoke_code {
  STOKE_OK = 0,
  STOKE_E_INVALID,     /* bad argument, config value or graph */
  STOKE_E_NOT_FOUND,   /* file, plugin, key or name that does not exist */
  STOKE_E_IO,          /* read/write failure */
  STOKE_E_ABI,         /* plugin ABI version or struct size mismatch */
  STOKE_E_DUPLICATE,   /* a name registered twice */
  STOKE_E_UNSUPPORTED, /* no kernel / feature for this combination */
  STOKE_E_OOM,         /* out of host or device memory */
  STOKE_E_DEVICE,      /* CUDA / cuDNN / cuBLASLt / NCCL failure */
  STOKE_E_DATA,        /* corrupt sample or record */
  STOKE_E_NUMERIC,     /* NaN / inf where it must not be */
  STOKE_E_INTERRUPTED, /* SIGINT / SIGTERM */
  STOKE_E_INTERNAL
} stoke_code;

/* An error: `msg` is the first cause, then one "  while ..." line per
 * context added on the way up. Owned by whoever receives it; free with
 * stoke_err_free (core) or host->err_free (plugins). */
typedef struct stoke_err {
  stoke_code code;
  char *msg;
} stoke_err;

#ifdef __cplusplus
}
#endif
#endif
