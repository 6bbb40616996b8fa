/* core/autocast.c: the compiler pass that makes a precision policy's
 * fp32_ops real: every forward node of those op types computes in f32, with
 * an `autocast` node before each of its float inputs in another dtype and
 * after each output another node reads (its backward casts the gradient
 * back, so parameters keep their dtype and their flat buffer). Runs before
 * fusion and backward derivation, on the forward nodes alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/ops.h"

#define MAX_OPS 32

/* The policy's list, each name a registered op type. */
static stoke_err *parse_ops(const stoke_graph *g, const char *policy, const char *list, char ops[][32], int *n) {
  *n = 0;
  for (const char *p = list; *p;) {
    while (*p == ',' || *p == ' ') p++;
    size_t len = strcspn(p, ", ");
    if (!len) break;
    if (*n == MAX_OPS || len >= sizeof ops[0])
      return STOKE_ERR(STOKE_E_INVALID, "precision '%s': fp32_ops holds more than %d names or one longer than 31",
                       policy, MAX_OPS);
    snprintf(ops[*n], sizeof ops[0], "%.*s", (int)len, p);
    if (!stoke_find_op(g->reg, ops[*n])) {
      char names[1024];
      stoke_registry_names(g->reg, "op", names, sizeof names);
      return STOKE_ERR(STOKE_E_INVALID, "precision '%s': fp32_ops names '%s', which is not an op type (ops: %s)",
                       policy, ops[*n], names);
    }
    (*n)++;
    p += len;
  }
  return NULL;
}

static int is_float(stoke_dtype t) { return t == STOKE_F32 || t == STOKE_F64 || t == STOKE_BF16 || t == STOKE_F16; }

/* Whether forward node `from` or a later one of old[0, n) reads v, or v is
 * the logits or the loss. */
static int read_later(const stoke_graph *g, const stoke_gnode *old, int n, int from, int v) {
  if (v == g->logits || v == g->loss) return 1;
  for (int i = from; i < n; i++)
    for (int k = 0; k < old[i].n_in; k++)
      if (old[i].in[k] == v) return 1;
  return 0;
}

/* Append an autocast node `name` from value `in` to value `out`. */
static stoke_err *append_cast(stoke_graph *g, const char *name, int in, int out) {
  char attrs[32];
  snprintf(attrs, sizeof attrs, "dtype=%s", stoke_dtype_name(g->values[out].dtype));
  return stoke_graph_append_unary(g, STOKE_OP_AUTOCAST, name, attrs, in, out);
}

/* A new activation value like v (shape, layout) in dtype dt. */
static stoke_err *value_like(stoke_graph *g, int v, const char *suffix, stoke_dtype dt, int *out) {
  char name[80];
  snprintf(name, sizeof name, "%.60s.%s", g->values[v].name, suffix);
  stoke_shape shape = g->values[v].shape;
  STOKE_PROPAGATE(stoke_graph_new_value(g, name, STOKE_VAL_ACT, &shape, dt, out));
  g->values[*out].layout = g->values[v].layout;
  return NULL;
}

/* Node f (a copy) in f32: casts of its inputs (one per value: f32[v], for
 * the n_orig values of the graph before the pass), the node, then casts of
 * the outputs others read back to their dtype. */
static stoke_err *island(stoke_graph *g, stoke_gnode f, const stoke_gnode *old, int n, int at, int *f32,
                         int n_orig) {
  for (int k = 0; k < f.n_in; k++) {
    int v = f.in[k];
    const stoke_value *val = &g->values[v];
    if (!is_float(val->dtype) || val->dtype == STOKE_F32 || (f.type->no_grad_inputs & (1u << k))) continue;
    if (val->kind == STOKE_VAL_STATE)
      return STOKE_ERR(STOKE_E_UNSUPPORTED,
                       "node '%s' (%s) kept in fp32 by the precision policy updates state '%s' of dtype %s in "
                       "place; it cannot run on a copy",
                       f.name_buf, f.n.op, val->name, stoke_dtype_name(val->dtype));
    if (f32[v] < 0) {
      char name[80];
      snprintf(name, sizeof name, "%.50s.to_f32", val->name);
      STOKE_PROPAGATE(value_like(g, v, "f32", STOKE_F32, &f32[v]));
      STOKE_PROPAGATE(append_cast(g, name, v, f32[v]));
    }
    f.in[k] = f32[v];
  }
  stoke_value_desc_v1 in[STOKE_MAX_IO], out[STOKE_MAX_IO];
  for (int k = 0; k < f.n_in; k++) in[k] = (stoke_value_desc_v1){g->values[f.in[k]].shape, g->values[f.in[k]].dtype};
  memset(out, 0, sizeof out);
  STOKE_TRY(f.type->infer(&f.n, in, out), "node '%s' in fp32 (the precision policy's fp32_ops)", f.name_buf);
  int back[STOKE_MAX_IO];
  for (int j = 0; j < f.n_out; j++) {
    int y = f.out[j];
    back[j] = -1;
    if (out[j].dtype == g->values[y].dtype) continue;
    if (!read_later(g, old, n, at + 1, y)) { /* only its own backward reads it */
      g->values[y].dtype = out[j].dtype;
      continue;
    }
    STOKE_PROPAGATE(value_like(g, y, "f32", out[j].dtype, &f.out[j]));
    back[j] = y;
    if (out[j].dtype == STOKE_F32 && y < n_orig) f32[y] = f.out[j]; /* a later fp32 op reads it as it is */
  }
  STOKE_PROPAGATE(stoke_graph_append_fwd(g, &f));
  for (int j = 0; j < f.n_out; j++) {
    if (back[j] < 0) continue;
    char name[80];
    snprintf(name, sizeof name, "%.50s.from_f32", g->values[back[j]].name);
    STOKE_PROPAGATE(append_cast(g, name, f.out[j], back[j]));
  }
  return NULL;
}

/* The pass's state: the policy's ops, f32[v] for the values before it. */
typedef struct islands {
  stoke_graph *g;
  char (*ops)[32];
  int n_ops, *f32, n_orig;
} islands;

static stoke_err *place(void *ctx, const stoke_gnode *old, int n, int i) {
  islands *is = ctx;
  for (int k = 0; k < is->n_ops; k++)
    if (!strcmp(old[i].n.op, is->ops[k])) return island(is->g, old[i], old, n, i, is->f32, is->n_orig);
  return stoke_graph_append_fwd(is->g, &old[i]);
}

stoke_err *stoke_autocast_islands(stoke_graph *g, const char *policy, const char *fp32_ops) {
  char ops[MAX_OPS][32];
  int n_ops = 0;
  if (!fp32_ops || !fp32_ops[0]) return NULL;
  STOKE_PROPAGATE(parse_ops(g, policy, fp32_ops, ops, &n_ops));
  if (g->dtype == STOKE_F32 || !n_ops) return NULL;
  islands is = {g, ops, n_ops, malloc(sizeof(int) * (size_t)(g->n_values + 1)), g->n_values};
  if (!is.f32) return STOKE_ERR(STOKE_E_OOM, "out of memory for the fp32 islands");
  for (int v = 0; v < g->n_values; v++) is.f32[v] = -1; /* values added later are never island inputs */
  stoke_err *e = stoke_graph_rewrite_fwd(g, place, &is);
  free(is.f32);
  return e ? stoke_err_wrap(e, __FILE__, __LINE__, "keeping precision '%s''s fp32_ops in fp32", policy) : NULL;
}
