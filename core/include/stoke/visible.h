/* stoke/visible.h: one CUDA_VISIBLE_DEVICES entry as CUDA reads it, for
 * the two places that read the list themselves: core/nvml.c (which of
 * NVML's GPUs the run's device is) and tools/launch.c (how many ranks to
 * start), a binary of its own without the core. Header-only. */
#ifndef STOKE_VISIBLE_H
#define STOKE_VISIBLE_H

#include <stddef.h>
#include <string.h>

typedef enum stoke_visible_kind {
  STOKE_VISIBLE_INVALID = 0, /* CUDA stops reading the list here ("-1", "x", empty) */
  STOKE_VISIBLE_INDEX,       /* digits */
  STOKE_VISIBLE_GPU_UUID,    /* "GPU-..." (a prefix of a GPU's UUID) */
  STOKE_VISIBLE_MIG_UUID     /* "MIG-..." (a MIG slice) */
} stoke_visible_kind;

/* The entry of `*n` bytes at `*p` (up to its comma), spaces and tabs around
 * it dropped: *p and *n are moved onto what is left. */
static inline stoke_visible_kind stoke_visible_entry(const char **p, size_t *n) {
  const char *s = *p;
  size_t k = *n;
  while (k && (*s == ' ' || *s == '\t')) s++, k--;
  while (k && (s[k - 1] == ' ' || s[k - 1] == '\t')) k--;
  *p = s, *n = k;
  if (k > 4 && !strncmp(s, "GPU-", 4)) return STOKE_VISIBLE_GPU_UUID;
  if (k > 4 && !strncmp(s, "MIG-", 4)) return STOKE_VISIBLE_MIG_UUID;
  if (!k) return STOKE_VISIBLE_INVALID;
  for (size_t i = 0; i < k; i++)
    if (s[i] < '0' || s[i] > '9') return STOKE_VISIBLE_INVALID;
  return STOKE_VISIBLE_INDEX;
}

#endif
