/* stoke/checkpoint.h: checkpoints as safetensors files, with the tensor
 * names and layouts of the same architecture's PyTorch state_dict, the
 * optimizer state and the run state; written atomically. */
#ifndef STOKE_CHECKPOINT_H
#define STOKE_CHECKPOINT_H

#include "stoke/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

#define STOKE_CKPT_VERSION 1

typedef struct stoke_ckpt_meta {
  int64_t step;        /* optimizer steps completed */
  int64_t epoch;
  int64_t seed;
  int64_t accumulate;
  double loss_scale;   /* the loss scaler's scale; 0: the run had no scaler (fp32, tf32, bf16) */
  char optimizer[32];  /* the optimizer's name ("sgd", "adamw", ...): its tensors are loaded only into the same */
  int64_t world;       /* processes that trained it (data parallel; 1 when absent) */
  int64_t batch;       /* samples per micro-batch on each (0: not recorded) */
  int64_t skipped_steps; /* of `step`, those the loss scaler skipped (no update applied) */
  /* the loss scaler's clean steps since its scale last changed (it grows the scale after
   * [optimizer] growth_interval of them), so a resumed run grows it when the original would */
  int64_t loss_scale_good_steps;
  /* read back: whether the file had checksums of its run state and data
   * (older files have none and load unverified, with a warning) */
  int meta_checked, data_checked;
} stoke_ckpt_meta;

/* Write parameters, running statistics, optimizer state and `meta` to
 * `path`: a temporary file beside it, fsync, rename, fsync the folder, so
 * a crash leaves the old file or the new one, never a partial one.
 * `config_text` (the resolved INI) goes into the metadata; may be NULL.
 * The metadata also holds a CRC-32C of every tensor's bytes and one of
 * the other metadata entries, checked when the file is loaded. */
stoke_err *stoke_checkpoint_save(stoke_exec *x, const char *path, const stoke_ckpt_meta *meta,
                                 const char *config_text);

/* The temporary file a save writes before its rename,
 * "<path>.tmp.<host>.<pid>": this machine's name (dots and slashes made
 * '_') and this process, so that runs on machines sharing a folder (NFS)
 * never take or remove each other's. */
void stoke_checkpoint_tmp_path(const char *path, char *out, size_t cap);
/* For the part of a file name after "<file>.tmp.": the PID of a temporary
 * file this machine's process wrote ("<host>.<pid>", or "<pid>" as stoke
 * named them before), or 0 for another machine's or no such name. */
long stoke_checkpoint_tmp_pid(const char *suffix);

/* Read `path` back into the executor's buffers. Every tensor the plan
 * needs must be there with its shape and dtype; a truncated or corrupt
 * file, a missing tensor, a shape mismatch, a tensor whose bytes fail their
 * checksum or a run-state field out of its range is an error naming the
 * file and the tensor or field. The optimizer's tensors are loaded when
 * `meta->optimizer` (from the file) matches the plan's. */
stoke_err *stoke_checkpoint_load(stoke_exec *x, const char *path, stoke_ckpt_meta *meta);

/* Only the run state of `path`, checked as stoke_checkpoint_load does
 * (ranges, metadata checksum), without the tensors' checksums. */
stoke_err *stoke_checkpoint_read_meta(const char *path, stoke_ckpt_meta *meta);

/* Everything of `path` a resume checks before it touches the model: the
 * safetensors structure, the run state (ranges, metadata checksum) and
 * every tensor's checksum. meta->data_checked and meta->meta_checked say
 * whether the file had checksums (older files have none). */
stoke_err *stoke_checkpoint_verify(const char *path, stoke_ckpt_meta *meta);

/* The bytes a checkpoint of this plan takes on disk (with its header, at
 * most): what the run checks free space against before it starts. */
size_t stoke_checkpoint_bytes(const stoke_plan *p, const char *optimizer, size_t config_bytes);

/* ---- safetensors, exposed for tests and tools ---- */

typedef struct stoke_st_tensor {
  char name[128];
  char dtype[8];       /* "F32", "I64", ... */
  int ndim;
  int64_t shape[STOKE_MAX_DIMS];
  size_t begin, end;   /* byte offsets into the data section */
} stoke_st_tensor;

typedef struct stoke_st_file {
  unsigned char *bytes; /* the whole file */
  size_t size;
  const unsigned char *data; /* after the header */
  size_t data_size;
  stoke_st_tensor *tensors;
  int n_tensors;
  char (*meta_keys)[64];
  char **meta_values;
  int n_meta;
} stoke_st_file;

/* Parse and validate a whole safetensors file (header JSON, offsets that
 * tile the data section exactly, sizes that match dtype x shape). Anything
 * but a regular file (a FIFO, a device, a folder) is refused unread. */
stoke_err *stoke_st_read(const char *path, stoke_st_file *out);
/* The same on bytes already in memory: `bytes` (malloc'd) become the
 * file's and are freed by stoke_st_free, or at once on an error. `path`
 * names them in messages. */
stoke_err *stoke_st_parse(unsigned char *bytes, size_t size, const char *path, stoke_st_file *out);
/* The run state and the checksums of a parsed file, as stoke_checkpoint_verify. */
stoke_err *stoke_checkpoint_check(const stoke_st_file *f, const char *path, stoke_ckpt_meta *meta);
void stoke_st_free(stoke_st_file *f);
const stoke_st_tensor *stoke_st_find(const stoke_st_file *f, const char *name);
const char *stoke_st_meta(const stoke_st_file *f, const char *key);
/* [run] init_from (fine-tuning, nanoGPT's init_from, PyTorch's
 * load_state_dict(strict=False)): the file's weights and running
 * statistics by name into the plan's, converted across float precisions;
 * a tensor the file lacks or has in another shape (a new classifier head)
 * keeps the model's initialization; the optimizer starts fresh (a bf16 or
 * fp16 plan's master copy takes the file's values unrounded: a bf16 run's
 * fp32 master copies where the file has them). The file is a stoke checkpoint (verified)
 * or a PyTorch safetensors state_dict (row-major, as PyTorch keeps it).
 * `report`: what was loaded, kept and left unused. No tensor that fits is
 * an error. */
stoke_err *stoke_checkpoint_load_weights(stoke_exec *x, const char *path, char *report, size_t report_cap);
/* The run's resolved config that a stoke checkpoint carries (its "config"
 * metadata, as the run's config.ini), read from the file's header alone;
 * *text is malloc'd, or NULL when the file has none (another writer's, or
 * a file of a stoke before configs were saved). Its checksum is checked
 * when the weights are loaded (stoke_checkpoint_load). */
stoke_err *stoke_checkpoint_config(const char *path, char **text);

#ifdef __cplusplus
}
#endif
#endif
