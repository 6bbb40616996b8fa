/* stoke/registry.h: the registries of op types, kernels, backends,
 * sources, models, precision policies, comms and optimizers, and the plugin loader
 * that fills them (dlopen by name along a search path). */
#ifndef STOKE_REGISTRY_H
#define STOKE_REGISTRY_H

#include <stdio.h>

#include "stoke/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct stoke_registry stoke_registry;

/* A new registry with the core's built-in plugin (op types, precision
 * policies, the `single` comm) already registered. */
stoke_err *stoke_registry_new(stoke_registry **out);
void stoke_registry_free(stoke_registry *r); /* dlcloses the plugins */

/* Search path, tried in order: each added folder, then STOKE_PLUGIN_PATH
 * (colon-separated), then the executable's own folder and its plugins/
 * subfolder. */
void stoke_registry_add_path(stoke_registry *r, const char *dir);

/* Load libstoke_<name>.so (or a path, if `name` contains a '/') once;
 * loading a name again is a no-op. Errors name the file and the reason:
 * not found (with every place looked), dlopen failure, missing symbol,
 * ABI version or struct size mismatch, duplicate registration. */
stoke_err *stoke_registry_load(stoke_registry *r, const char *name);

/* Register a plugin already linked in (the core's built-ins); `origin`
 * names it in messages. Same checks as a loaded one. */
stoke_err *stoke_registry_add_plugin(stoke_registry *r,
                                     const stoke_plugin_v1 *p,
                                     const char *origin);

/* Names of the plugin files on the search path ("cpu, mlp, ..."), for
 * "not found" messages. Writes at most `cap` bytes. */
void stoke_registry_available(stoke_registry *r, char *buf, size_t cap);

/* Lookups: NULL when absent. */
const stoke_op_type_v1 *stoke_find_op(const stoke_registry *r, const char *name);
/* Whether op type `name` is the core's own (registered by core/builtin.c), not a plugin's. */
int stoke_op_is_builtin(const stoke_registry *r, const char *name);
const stoke_backend_v1 *stoke_find_backend(const stoke_registry *r, const char *name);
const stoke_source_v1 *stoke_find_source(const stoke_registry *r, const char *name);
const stoke_model_v1 *stoke_find_model(const stoke_registry *r, const char *name);
const stoke_precision_v1 *stoke_find_precision(const stoke_registry *r, const char *name);
const stoke_comm_v1 *stoke_find_comm(const stoke_registry *r, const char *name);
const stoke_optimizer_v1 *stoke_find_optimizer(const stoke_registry *r, const char *name);
/* Exact match on engine, op, pass and dtype; layout matches exactly or
 * the kernel serves STOKE_LAYOUT_ANY. */
const stoke_kernel_v1 *stoke_find_kernel(const stoke_registry *r,
                                         const char *engine, const char *op,
                                         stoke_pass pass, stoke_dtype dtype,
                                         stoke_layout layout);
/* The i-th registered kernel (0, 1, ... in registration order), NULL past
 * the last: what tests/op/every_kernel_test walks. */
const stoke_kernel_v1 *stoke_registry_kernel(const stoke_registry *r, int i);
/* Every registered part of one kind (as stoke_registry_names names them),
 * in registration order, with the file (or "built-in") that registered
 * it: fn(ctx, part, origin), part a const stoke_<kind>_v1 * (kernels:
 * stoke_kernel_v1, fusions: stoke_fusion_v1). */
typedef void (*stoke_registry_visit)(void *ctx, const void *part, const char *origin);
void stoke_registry_each(const stoke_registry *r, const char *kind, stoke_registry_visit fn, void *ctx);
/* The file a plugin was loaded from (the origin its parts carry), by the
 * name or path it was loaded as; NULL when not loaded. */
const char *stoke_registry_plugin_path(const stoke_registry *r, const char *name);
/* The plugin file (or "built-in") that registered a name of any kind. */
const char *stoke_registry_origin(const stoke_registry *r, const char *name);

/* Loads into r every plugin on `from`'s search path (r's own when NULL),
 * each tried in a child process first (10 s at most): one that ends the
 * process loading it (a foreign build; an ASan-built plugin in a normal
 * process exits with "ASan runtime does not come first") or hangs is left
 * out, and named on `say` when not NULL. Load errors are dropped. For the
 * listings of everything on the search path (a typo's "available",
 * --help-config). */
void stoke_registry_load_every(stoke_registry *r, stoke_registry *from, FILE *say);

/* Names of every registered part of one kind, comma-separated, for
 * messages ("backends: cpu, cuda"). kind: "op", "backend", "source",
 * "model", "precision", "comm", "optimizer", "kernel" (their ops). */
void stoke_registry_names(const stoke_registry *r, const char *kind,
                          char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
