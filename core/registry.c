/* core/registry.c: the registries of every part kind and the plugin loader
 * (dlopen libstoke_<name>.so along a search path, check its versioned
 * entry struct, let it register its parts). */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "stoke/check.h"
#include "stoke/core.h"
#include "stoke/registry.h"

extern const stoke_plugin_v1 stoke_builtin_plugin; /* core/builtin.c */

typedef enum { K_OP, K_BACKEND, K_SOURCE, K_MODEL, K_PRECISION, K_COMM, K_OPTIMIZER, K_FUSION, K_KERNEL, K_COUNT } part_kind;
static const char *kind_names[K_COUNT] = {"op", "backend", "source", "model", "precision", "comm", "optimizer",
                                          "fusion", "kernel"};

/* every versioned part has its name where stoke_part_v1 says */
#define NAME_AT_PART_OFFSET(T) \
  _Static_assert(offsetof(T, name) == offsetof(stoke_part_v1, name), #T ": name after the version fields")
NAME_AT_PART_OFFSET(stoke_op_type_v1);
NAME_AT_PART_OFFSET(stoke_backend_v1);
NAME_AT_PART_OFFSET(stoke_source_v1);
NAME_AT_PART_OFFSET(stoke_model_v1);
NAME_AT_PART_OFFSET(stoke_precision_v1);
NAME_AT_PART_OFFSET(stoke_comm_v1);
NAME_AT_PART_OFFSET(stoke_optimizer_v1);
NAME_AT_PART_OFFSET(stoke_fusion_v1);

typedef struct part {
  part_kind kind;
  const char *name; /* for kernels: the op */
  const void *def;
  const char *origin;
} part;

typedef struct loaded {
  char *name;   /* as asked for */
  char *path;   /* file loaded */
  void *handle; /* NULL for built-ins */
} loaded;

struct stoke_registry {
  part *parts;
  int n_parts, cap_parts;
  loaded *libs;
  int n_libs, cap_libs;
  char **paths;
  int n_paths;
  const char *current_origin; /* the plugin registering right now */
  stoke_registry_v1 api;
};

static const char *kernel_pass_name(stoke_pass p) {
  return p == STOKE_FWD ? "forward" : p == STOKE_BWD ? "backward" : "update";
}

static int same_kernel(const stoke_kernel_v1 *a, const stoke_kernel_v1 *b) {
  return !strcmp(a->engine, b->engine) && !strcmp(a->op, b->op) &&
         a->pass == b->pass && a->dtype == b->dtype && a->layout == b->layout;
}

/* sizeof the struct of each kind (kernels carry no version of their own:
 * the plugin's entry covers them) */
static const size_t kind_sizes[K_COUNT] = {sizeof(stoke_op_type_v1), sizeof(stoke_backend_v1),
                                           sizeof(stoke_source_v1),  sizeof(stoke_model_v1),
                                           sizeof(stoke_precision_v1), sizeof(stoke_comm_v1),
                                           sizeof(stoke_optimizer_v1), sizeof(stoke_fusion_v1), 0};

/* The versioned header every part but kernels starts with, checked before
 * any other field is read (a part built for another ABI may have another
 * layout: its name is not printed). */
static stoke_err *check_part_abi(const stoke_registry *r, part_kind kind, const void *def) {
  const stoke_part_v1 *h = def;
  if (!def)
    return STOKE_ERR(STOKE_E_INVALID, "%s: a %s was registered as NULL", r->current_origin, kind_names[kind]);
  if (h->abi_version != STOKE_ABI_VERSION)
    return STOKE_ERR(STOKE_E_ABI,
                     "%s: a %s part says stoke ABI version %u, this stoke expects version %u (parts built "
                     "before version 2 carry no version: any number); rebuild the plugin against this "
                     "stoke's SDK headers (core/sdk/stoke/)",
                     r->current_origin, kind_names[kind], h->abi_version, STOKE_ABI_VERSION);
  if (h->struct_size != kind_sizes[kind])
    return STOKE_ERR(STOKE_E_ABI,
                     "%s: %s '%s' says its struct is %u bytes, this stoke's stoke_%s_v1 is %zu; rebuild "
                     "the plugin against this stoke's SDK headers (core/sdk/stoke/)",
                     r->current_origin, kind_names[kind], h->name ? h->name : "?", h->struct_size,
                     kind == K_OP ? "op_type" : kind_names[kind], kind_sizes[kind]);
  return NULL;
}

static stoke_err *add_part(stoke_registry *r, part_kind kind, const char *name,
                           const void *def) {
  if (!name || !name[0])
    return STOKE_ERR(STOKE_E_INVALID, "%s: a %s was registered without a name",
                     r->current_origin, kind_names[kind]);
  /* an INI list names parts ("backends = cudnn, cuda"): a space or a comma in a name could not be chosen */
  if (kind != K_KERNEL && name[strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")])
    return STOKE_ERR(STOKE_E_INVALID, "%s: %s '%s': a name is letters, digits, '_', '.' and '-' only (an INI "
                     "file names it, in lists too)", r->current_origin, kind_names[kind], name);
  for (int i = 0; i < r->n_parts; i++) {
    part *p = &r->parts[i];
    if (p->kind != kind) continue;
    if (kind == K_KERNEL ? same_kernel(p->def, def) : !strcmp(p->name, name)) {
      if (kind == K_KERNEL) {
        const stoke_kernel_v1 *k = def;
        return STOKE_ERR(STOKE_E_DUPLICATE,
                         "%s: duplicate registration: kernel %s/%s %s %s %s is already "
                         "registered by %s",
                         r->current_origin, k->engine, k->op, kernel_pass_name(k->pass),
                         stoke_dtype_name(k->dtype), stoke_layout_name(k->layout), p->origin);
      }
      return STOKE_ERR(STOKE_E_DUPLICATE,
                       "%s: duplicate registration: %s '%s' is already registered by %s",
                       r->current_origin, kind_names[kind], name, p->origin);
    }
  }
  if (r->n_parts == r->cap_parts) {
    int cap = r->cap_parts ? r->cap_parts * 2 : 64;
    part *np = realloc(r->parts, (size_t)cap * sizeof *np);
    if (!np) return STOKE_ERR(STOKE_E_OOM, "out of memory growing the registry");
    r->parts = np;
    r->cap_parts = cap;
  }
  r->parts[r->n_parts++] = (part){kind, name, def, r->current_origin};
  return NULL;
}

/* What an op says about its backward, checked where it is registered (a
 * newcomer's usual mistakes: a backward with bwd_needs left 0 is handed
 * NULL inputs; has_backward is 1, 0 or STOKE_NO_GRAD). */
static stoke_err *check_op_backward(const stoke_registry *r, const stoke_op_type_v1 *o) {
  const char *nm = o->name ? o->name : "?";
  if (o->has_backward != 0 && o->has_backward != STOKE_HAS_BACKWARD && o->has_backward != STOKE_NO_GRAD)
    return STOKE_ERR(STOKE_E_INVALID,
                     "%s: op '%s': has_backward = %d; say STOKE_HAS_BACKWARD (1: it has backward kernels) or "
                     "STOKE_NO_GRAD (gradients stop here on purpose)", r->current_origin, nm, o->has_backward);
  uint32_t known = STOKE_BWD_NEEDS_NOTHING;
  for (int i = 0; i < o->n_inputs; i++) known |= STOKE_BWD_NEEDS_INPUT(i);
  for (int j = 0; j < (o->n_outputs ? o->n_outputs : STOKE_MAX_IO); j++) known |= STOKE_BWD_NEEDS_OUTPUT(j);
  if (o->has_backward == STOKE_HAS_BACKWARD && !o->bwd_needs)
    return STOKE_ERR(STOKE_E_INVALID,
                     "%s: op '%s' has a backward (has_backward = 1) but bwd_needs is 0: say what its backward kernel "
                     "reads besides the output gradients, e.g. .bwd_needs = STOKE_BWD_NEEDS_INPUT(0) (x) or "
                     "STOKE_BWD_NEEDS_OUTPUT(0) (y); STOKE_BWD_NEEDS_NOTHING if it reads neither. Inputs and "
                     "outputs not named there reach the backward kernel with data == NULL",
                     r->current_origin, nm);
  if (o->bwd_needs & ~known)
    return STOKE_ERR(STOKE_E_INVALID,
                     "%s: op '%s': bwd_needs 0x%x names inputs or outputs the op does not have (%d inputs, %d "
                     "outputs)", r->current_origin, nm, o->bwd_needs & ~known, o->n_inputs, o->n_outputs);
  if ((o->bwd_needs & STOKE_BWD_NEEDS_NOTHING) && (o->bwd_needs & ~STOKE_BWD_NEEDS_NOTHING))
    return STOKE_ERR(STOKE_E_INVALID, "%s: op '%s': bwd_needs says STOKE_BWD_NEEDS_NOTHING and names values too",
                     r->current_origin, nm);
  return NULL;
}

/* The callbacks a part of `kind` cannot work without: NULL ones are the
 * plugin writer's mistake, said here rather than as a crash at the first
 * use (a run, or the test kit). */
static stoke_err *check_callbacks(const stoke_registry *r, part_kind kind, const void *def) {
  const char *missing = NULL;
  switch (kind) {
    case K_OP: {
      const stoke_op_type_v1 *o = def;
      if (!o->infer) missing = "infer";
      else if (o->n_attrs > 0 && !o->attrs) missing = "attrs (n_attrs > 0)";
      break;
    }
    case K_SOURCE: {
      const stoke_source_v1 *x = def;
      missing = !x->open ? "open" : !x->length ? "length" : !x->info ? "info" : !x->read ? "read" : NULL;
      break;
    }
    case K_MODEL: missing = !((const stoke_model_v1 *)def)->build ? "build" : NULL; break;
    case K_COMM: {
      const stoke_comm_v1 *c = def;
      missing = !c->open ? "open" : !c->all_reduce ? "all_reduce" : NULL;
      break;
    }
    default: break;
  }
  if (!missing) return NULL;
  const char *name = ((const stoke_part_v1 *)def)->name; /* an op type starts with the same header */
  return STOKE_ERR(STOKE_E_INVALID, "%s: %s '%s' has no %s function (NULL): set it in the struct the plugin registers",
                   r->current_origin, kind_names[kind], name ? name : "?", missing);
}

static stoke_err *api_add_op(void *s, const stoke_op_type_v1 *o) {
  STOKE_PROPAGATE(check_part_abi(s, K_OP, o));
  STOKE_PROPAGATE(check_callbacks(s, K_OP, o));
  if (o->n_inputs > STOKE_MAX_IO || o->n_outputs > STOKE_MAX_IO || o->n_attrs > STOKE_MAX_ATTRS)
    return STOKE_ERR(STOKE_E_INVALID, "op '%s': more than %d inputs/outputs or %d attributes",
                     o->name, STOKE_MAX_IO, STOKE_MAX_ATTRS);
  STOKE_PROPAGATE(check_op_backward(s, o));
  return add_part(s, K_OP, o->name, o);
}
static stoke_err *api_add_kernel(void *s, const stoke_kernel_v1 *k) {
  if (k && (!k->engine || !k->run))
    return STOKE_ERR(STOKE_E_INVALID, "kernel for op '%s' has no engine or run function",
                     k->op ? k->op : "?");
  return add_part(s, K_KERNEL, k ? k->op : NULL, k);
}
/* A versioned part of `kind`: its header first, then the name. */
static stoke_err *add_versioned(void *s, part_kind kind, const void *def) {
  STOKE_PROPAGATE(check_part_abi(s, kind, def));
  STOKE_PROPAGATE(check_callbacks(s, kind, def));
  return add_part(s, kind, ((const stoke_part_v1 *)def)->name, def);
}
static stoke_err *api_add_backend(void *s, const stoke_backend_v1 *b) { return add_versioned(s, K_BACKEND, b); }
static stoke_err *api_add_source(void *s, const stoke_source_v1 *x) { return add_versioned(s, K_SOURCE, x); }
static stoke_err *api_add_model(void *s, const stoke_model_v1 *m) { return add_versioned(s, K_MODEL, m); }
static stoke_err *api_add_precision(void *s, const stoke_precision_v1 *p) { return add_versioned(s, K_PRECISION, p); }
static stoke_err *api_add_comm(void *s, const stoke_comm_v1 *c) { return add_versioned(s, K_COMM, c); }
static stoke_err *api_add_optimizer(void *s, const stoke_optimizer_v1 *o) {
  STOKE_PROPAGATE(check_part_abi(s, K_OPTIMIZER, o));
  if (o->n_state < 0 || o->n_state > STOKE_OPT_MAX_STATE)
    return STOKE_ERR(STOKE_E_INVALID, "%s: optimizer '%s' has %d state tensors per parameter (0 to %d)",
                     ((const stoke_registry *)s)->current_origin, o->name ? o->name : "?", o->n_state,
                     STOKE_OPT_MAX_STATE);
  for (int i = 0; i < o->n_state; i++)
    if (!o->state_names[i] || !o->state_names[i][0])
      return STOKE_ERR(STOKE_E_INVALID, "%s: optimizer '%s': state tensor %d has no name (checkpoints need one)",
                       ((const stoke_registry *)s)->current_origin, o->name ? o->name : "?", i);
  return add_part(s, K_OPTIMIZER, o->name, o);
}

static stoke_err *api_add_fusion(void *s, const stoke_fusion_v1 *f) {
  STOKE_PROPAGATE(check_part_abi(s, K_FUSION, f));
  if (!f->head || !f->tail || !f->fused || !f->head[0] || !f->tail[0] || !f->fused[0])
    return STOKE_ERR(STOKE_E_INVALID, "%s: fusion pattern '%s' needs the head, tail and fused ops' names",
                     ((const stoke_registry *)s)->current_origin, f->name ? f->name : "?");
  return add_part(s, K_FUSION, f->name, f);
}

stoke_err *stoke_registry_new(stoke_registry **out) {
  stoke_registry *r = calloc(1, sizeof *r);
  if (!r) return STOKE_ERR(STOKE_E_OOM, "out of memory creating the registry");
  r->api = (stoke_registry_v1){r, api_add_op, api_add_kernel, api_add_backend,
                               api_add_source, api_add_model, api_add_precision,
                               api_add_comm, api_add_optimizer, api_add_fusion};
  stoke_err *e = stoke_registry_add_plugin(r, &stoke_builtin_plugin, "built-in");
  if (e) {
    stoke_registry_free(r);
    return e;
  }
  *out = r;
  return NULL;
}

void stoke_registry_free(stoke_registry *r) {
  if (!r) return;
  for (int i = r->n_libs - 1; i >= 0; i--) {
    if (r->libs[i].handle) dlclose(r->libs[i].handle);
    free(r->libs[i].name);
    free(r->libs[i].path);
  }
  for (int i = 0; i < r->n_paths; i++) free(r->paths[i]);
  free(r->paths);
  free(r->libs);
  free(r->parts);
  free(r);
}

void stoke_registry_add_path(stoke_registry *r, const char *dir) {
  char **np = realloc(r->paths, (size_t)(r->n_paths + 1) * sizeof *np);
  if (!np) return;
  r->paths = np;
  r->paths[r->n_paths] = strdup(dir);
  if (r->paths[r->n_paths]) r->n_paths++;
}

/* The search path as a list of folders: added ones, STOKE_PLUGIN_PATH, the
 * executable's folder and its plugins/ subfolder. Returns the count. */
static int search_dirs(const stoke_registry *r, char dirs[][PATH_MAX], int cap) {
  int n = 0;
  for (int i = 0; i < r->n_paths && n < cap; i++) snprintf(dirs[n++], PATH_MAX, "%s", r->paths[i]);
  const char *env = getenv("STOKE_PLUGIN_PATH");
  if (env) {
    const char *p = env;
    while (*p && n < cap) {
      const char *q = strchr(p, ':');
      size_t len = q ? (size_t)(q - p) : strlen(p);
      if (len > 0 && len < PATH_MAX) {
        memcpy(dirs[n], p, len);
        dirs[n++][len] = 0;
      }
      if (!q) break;
      p = q + 1;
    }
  }
  char exe[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len > 0 && n + 2 <= cap) {
    exe[len] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    snprintf(dirs[n++], PATH_MAX, "%s", exe);
    snprintf(dirs[n++], PATH_MAX, "%.*s/plugins", PATH_MAX - 16, exe);
  }
  return n;
}

#define MAX_DIRS 32

static stoke_err *register_plugin(stoke_registry *r, const stoke_plugin_v1 *p,
                                  const char *origin) {
  if (p->abi_version != STOKE_ABI_VERSION)
    return STOKE_ERR(STOKE_E_ABI,
                     "%s: plugin ABI version mismatch: stoke expects version %u, the "
                     "plugin was built for version %u; rebuild it against this "
                     "stoke's SDK headers (core/sdk/stoke/plugin.h)",
                     origin, STOKE_ABI_VERSION, p->abi_version);
  if (p->struct_size != sizeof(stoke_plugin_v1))
    return STOKE_ERR(STOKE_E_ABI,
                     "%s: plugin struct size mismatch: stoke expects "
                     "sizeof(stoke_plugin_v1) = %zu, the plugin says %u; rebuild it "
                     "against this stoke's SDK headers",
                     origin, sizeof(stoke_plugin_v1), p->struct_size);
  if (!p->register_parts)
    return STOKE_ERR(STOKE_E_ABI, "%s: plugin '%s' has no register function", origin,
                     p->name ? p->name : "?");
  r->current_origin = origin;
  int before = r->n_parts;
  stoke_err *e = p->register_parts(stoke_host_table(), &r->api);
  r->current_origin = "a plugin after its registration";
  if (e) {
    r->n_parts = before; /* nothing of a failed plugin stays registered */
    return stoke_err_wrap(e, __FILE__, __LINE__, "registering plugin %s", origin);
  }
  return NULL;
}

stoke_err *stoke_registry_add_plugin(stoke_registry *r, const stoke_plugin_v1 *p,
                                     const char *origin) {
  if (r->n_libs == r->cap_libs) {
    int cap = r->cap_libs ? r->cap_libs * 2 : 16;
    loaded *nl = realloc(r->libs, (size_t)cap * sizeof *nl);
    if (!nl) return STOKE_ERR(STOKE_E_OOM, "out of memory");
    r->libs = nl;
    r->cap_libs = cap;
  }
  loaded *l = &r->libs[r->n_libs];
  l->name = strdup(p->name ? p->name : origin);
  l->path = strdup(origin);
  l->handle = NULL;
  if (!l->name || !l->path) {
    free(l->name);
    free(l->path);
    return STOKE_ERR(STOKE_E_OOM, "out of memory");
  }
  r->n_libs++;
  stoke_err *e = register_plugin(r, p, l->path);
  if (e) {
    r->n_libs--;
    free(l->name);
    free(l->path);
  }
  return e;
}

/* Whether loading plugin `name` leaves the process alive, tried in a child
 * process (10 s at most): 0 for a library that ends the process loading it
 * or hangs; 1 otherwise, a load failing with an error included (loading it
 * here returns the error). The child says it came back from the load by a
 * byte through a pipe: its exit code alone cannot tell, since a library
 * may end the process with any code, 0 included. */
static int load_survives(stoke_registry *r, const char *name) {
  int fds[2];
  if (pipe(fds)) return 1; /* no pipe: load it here as before */
  fflush(NULL); /* the child's exit must not write the parent's buffers again */
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]), close(fds[1]);
    return 1; /* no child: load it here as before */
  }
  if (pid == 0) {
    close(fds[0]);
    stoke_err *e = stoke_registry_load(r, name);
    ssize_t w = write(fds[1], e ? "E" : "S", 1);
    _exit(w == 1 ? 0 : 3);
  }
  close(fds[1]);
  int st = 0;
  for (int i = 0; i < 1000; i++) { /* 10 s */
    pid_t w = waitpid(pid, &st, WNOHANG);
    if (w == pid) {
      char b = 0;
      int alive = WIFEXITED(st) && WEXITSTATUS(st) == 0 && read(fds[0], &b, 1) == 1 && (b == 'S' || b == 'E');
      close(fds[0]);
      return alive;
    }
    if (w < 0 && errno != EINTR) break;
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  close(fds[0]);
  return 0;
}

stoke_err *stoke_registry_load(stoke_registry *r, const char *name) {
  for (int i = 0; i < r->n_libs; i++)
    if (r->libs[i].handle && !strcmp(r->libs[i].name, name)) return NULL;

  char path[PATH_MAX] = "";
  if (strchr(name, '/')) {
    if (access(name, F_OK) != 0)
      return STOKE_ERR(STOKE_E_NOT_FOUND, "plugin file '%s' not found: %s", name,
                       strerror(errno));
    snprintf(path, sizeof path, "%s", name);
  } else {
    static char dirs[MAX_DIRS][PATH_MAX];
    int n = search_dirs(r, dirs, MAX_DIRS);
    char looked[4096] = "";
    size_t used = 0;
    for (int i = 0; i < n && !path[0]; i++) {
      char cand[PATH_MAX];
      snprintf(cand, sizeof cand, "%.*s/libstoke_%s.so", PATH_MAX - 64, dirs[i], name);
      if (access(cand, F_OK) == 0) snprintf(path, sizeof path, "%s", cand);
      else if (used < sizeof looked)
        used += (size_t)snprintf(looked + used, sizeof looked - used, "\n    %s", cand);
    }
    if (!path[0]) {
      char avail[1024];
      stoke_registry_available(r, avail, sizeof avail);
      return STOKE_ERR(STOKE_E_NOT_FOUND,
                       "plugin '%s' not found (no libstoke_%s.so). Looked in:%s\n"
                       "  plugins found on the search path: %s\n"
                       "  add a folder with [plugins] path = ... or STOKE_PLUGIN_PATH",
                       name, name, looked[0] ? looked : " (no folders)", avail[0] ? avail : "none");
    }
  }

  /* the same file under another spelling is loaded already: a no-op */
  char real[PATH_MAX];
  if (realpath(path, real))
    for (int i = 0; i < r->n_libs; i++) {
      char other[PATH_MAX];
      if (r->libs[i].handle && realpath(r->libs[i].path, other) && !strcmp(real, other)) return NULL;
    }
  dlerror();
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *why = dlerror();
    return STOKE_ERR(STOKE_E_IO, "%s: cannot load plugin: %s", path, why ? why : "dlopen failed");
  }
  const stoke_plugin_v1 *p = dlsym(h, STOKE_PLUGIN_SYMBOL);
  if (!p) {
    dlclose(h);
    return STOKE_ERR(STOKE_E_ABI,
                     "%s: not a stoke plugin: it does not export the symbol '%s' "
                     "(define `STOKE_EXPORT const stoke_plugin_v1 %s` as in "
                     "plugins/README.md)",
                     path, STOKE_PLUGIN_SYMBOL, STOKE_PLUGIN_SYMBOL);
  }
  if (r->n_libs == r->cap_libs) {
    int cap = r->cap_libs ? r->cap_libs * 2 : 16;
    loaded *nl = realloc(r->libs, (size_t)cap * sizeof *nl);
    if (!nl) {
      dlclose(h);
      return STOKE_ERR(STOKE_E_OOM, "out of memory");
    }
    r->libs = nl;
    r->cap_libs = cap;
  }
  loaded *l = &r->libs[r->n_libs];
  l->name = strdup(name);
  l->path = strdup(path);
  l->handle = h;
  if (!l->name || !l->path) {
    free(l->name);
    free(l->path);
    dlclose(h);
    return STOKE_ERR(STOKE_E_OOM, "out of memory");
  }
  r->n_libs++;
  stoke_err *e = register_plugin(r, p, l->path);
  if (e) {
    r->n_libs--;
    free(l->name);
    free(l->path);
    dlclose(h);
  }
  return e;
}

void stoke_registry_available(stoke_registry *r, char *buf, size_t cap) {
  static char dirs[MAX_DIRS][PATH_MAX];
  int n = search_dirs(r, dirs, MAX_DIRS);
  size_t used = 0;
  buf[0] = 0;
  char seen[64][64];
  int n_seen = 0;
  for (int i = 0; i < n; i++) {
    DIR *d = opendir(dirs[i]);
    if (!d) continue;
    struct dirent *de;
    while ((de = readdir(d))) {
      size_t len = strlen(de->d_name);
      if (strncmp(de->d_name, "libstoke_", 9) || len < 13 || strcmp(de->d_name + len - 3, ".so"))
        continue;
      char nm[64];
      snprintf(nm, sizeof nm, "%.*s", (int)(len - 12), de->d_name + 9);
      int dup = 0;
      for (int j = 0; j < n_seen; j++) dup |= !strcmp(seen[j], nm);
      if (dup || n_seen == 64) continue;
      snprintf(seen[n_seen++], 64, "%s", nm);
    }
    closedir(d);
  }
  /* sorted, for stable messages */
  qsort(seen, (size_t)n_seen, sizeof seen[0], (int (*)(const void *, const void *))strcmp);
  for (int j = 0; j < n_seen && used < cap; j++)
    used += (size_t)snprintf(buf + used, cap - used, "%s%s", j ? ", " : "", seen[j]);
}

void stoke_registry_load_every(stoke_registry *r, stoke_registry *from, FILE *say) {
  char files[2048];
  stoke_registry_available(from ? from : r, files, sizeof files);
  for (char *save = NULL, *t = strtok_r(files, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
    if (load_survives(r, t)) stoke_err_free(stoke_registry_load(r, t));
    else if (say) fprintf(say, "(plugin '%s' on the search path ends the process that loads it: left out)\n", t);
  }
}

static const void *find(const stoke_registry *r, part_kind kind, const char *name) {
  if (!name) return NULL;
  for (int i = 0; i < r->n_parts; i++)
    if (r->parts[i].kind == kind && !strcmp(r->parts[i].name, name)) return r->parts[i].def;
  return NULL;
}

const stoke_op_type_v1 *stoke_find_op(const stoke_registry *r, const char *n) { return find(r, K_OP, n); }
int stoke_op_is_builtin(const stoke_registry *r, const char *n) {
  for (int i = 0; n && i < r->n_parts; i++)
    if (r->parts[i].kind == K_OP && !strcmp(r->parts[i].name, n))
      return r->parts[i].def && !strcmp(r->parts[i].origin, "built-in");
  return 0;
}
const stoke_backend_v1 *stoke_find_backend(const stoke_registry *r, const char *n) { return find(r, K_BACKEND, n); }
const stoke_source_v1 *stoke_find_source(const stoke_registry *r, const char *n) { return find(r, K_SOURCE, n); }
const stoke_model_v1 *stoke_find_model(const stoke_registry *r, const char *n) { return find(r, K_MODEL, n); }
const stoke_precision_v1 *stoke_find_precision(const stoke_registry *r, const char *n) { return find(r, K_PRECISION, n); }
const stoke_comm_v1 *stoke_find_comm(const stoke_registry *r, const char *n) { return find(r, K_COMM, n); }
const stoke_optimizer_v1 *stoke_find_optimizer(const stoke_registry *r, const char *n) {
  return find(r, K_OPTIMIZER, n);
}

const stoke_kernel_v1 *stoke_find_kernel(const stoke_registry *r, const char *engine,
                                         const char *op, stoke_pass pass, stoke_dtype dtype,
                                         stoke_layout layout) {
  const stoke_kernel_v1 *any = NULL;
  for (int i = 0; i < r->n_parts; i++) {
    if (r->parts[i].kind != K_KERNEL) continue;
    const stoke_kernel_v1 *k = r->parts[i].def;
    if (strcmp(k->engine, engine) || strcmp(k->op, op) || k->pass != pass || k->dtype != dtype)
      continue;
    if (k->layout == layout) return k;
    if (k->layout == STOKE_LAYOUT_ANY) any = k;
  }
  return any;
}

const stoke_kernel_v1 *stoke_registry_kernel(const stoke_registry *r, int i) {
  for (int j = 0; j < r->n_parts; j++)
    if (r->parts[j].kind == K_KERNEL && i-- == 0) return r->parts[j].def;
  return NULL;
}

const char *stoke_registry_origin(const stoke_registry *r, const char *name) {
  for (int i = 0; i < r->n_parts; i++)
    if (!strcmp(r->parts[i].name, name)) return r->parts[i].origin;
  return NULL;
}

void stoke_registry_names(const stoke_registry *r, const char *kind, char *buf, size_t cap) {
  size_t used = 0;
  int first = 1;
  buf[0] = 0;
  for (int i = 0; i < r->n_parts && used < cap; i++) {
    if (strcmp(kind_names[r->parts[i].kind], kind)) continue;
    used += (size_t)snprintf(buf + used, cap - used, "%s%s", first ? "" : ", ", r->parts[i].name);
    first = 0;
  }
}

void stoke_registry_each(const stoke_registry *r, const char *kind, stoke_registry_visit fn, void *ctx) {
  for (int i = 0; i < r->n_parts; i++)
    if (!strcmp(kind_names[r->parts[i].kind], kind)) fn(ctx, r->parts[i].def, r->parts[i].origin);
}

const char *stoke_registry_plugin_path(const stoke_registry *r, const char *name) {
  char real[PATH_MAX], other[PATH_MAX];
  int have_real = realpath(name, real) != NULL;
  for (int i = 0; i < r->n_libs; i++)
    if (!strcmp(r->libs[i].name, name) || !strcmp(r->libs[i].path, name) ||
        (have_real && realpath(r->libs[i].path, other) && !strcmp(real, other)))
      return r->libs[i].path;
  return NULL;
}
