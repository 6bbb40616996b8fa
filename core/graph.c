/* core/graph.c: the graph and the builder API models use: values, nodes,
 * attribute parsing against the op declaration, shape inference as nodes
 * are added, and the loss attached by the run. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/check.h"
#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/ops.h"

stoke_err *stoke_graph_new(const stoke_registry *reg, stoke_dtype dtype, stoke_layout layout,
                           stoke_graph **out) {
  stoke_graph *g = calloc(1, sizeof *g);
  if (!g) return STOKE_ERR(STOKE_E_OOM, "out of memory creating a graph");
  g->reg = reg;
  g->dtype = dtype;
  g->layout = layout;
  g->input = g->label = g->logits = g->loss = g->seed = -1;
  *out = g;
  return NULL;
}

void stoke_graph_free(stoke_graph *g) {
  if (!g) return;
  free(g->values);
  free(g->nodes);
  free(g->tied);
  free(g);
}

static stoke_err *new_value(stoke_graph *g, const char *name, stoke_value_kind kind,
                            const stoke_shape *shape_in, stoke_dtype dtype, int *id) {
  const stoke_shape copy = *shape_in, *shape = &copy; /* shape_in may point into g->values */
  if (g->n_values == g->cap_values) {
    int cap = g->cap_values ? 2 * g->cap_values : 64;
    stoke_value *nv = realloc(g->values, (size_t)cap * sizeof *nv);
    if (!nv) return STOKE_ERR(STOKE_E_OOM, "out of memory growing the graph");
    g->values = nv;
    g->cap_values = cap;
  }
  stoke_value *v = &g->values[g->n_values];
  memset(v, 0, sizeof *v);
  snprintf(v->name, sizeof v->name, "%s", name);
  v->kind = kind;
  v->shape = *shape;
  v->dtype = dtype;
  v->layout = shape->ndim == 4 ? g->layout : STOKE_LAYOUT_ANY;
  v->producer = -1;
  v->grad = -1;
  v->alias = -1;
  *id = g->n_values++;
  return NULL;
}

static stoke_err *new_node(stoke_graph *g, int *id) {
  if (g->n_nodes == g->cap_nodes) {
    int cap = g->cap_nodes ? 2 * g->cap_nodes : 64;
    stoke_gnode *nn = realloc(g->nodes, (size_t)cap * sizeof *nn);
    if (!nn) return STOKE_ERR(STOKE_E_OOM, "out of memory growing the graph");
    g->nodes = nn;
    g->cap_nodes = cap;
    for (int i = 0; i < g->n_nodes; i++) nn[i].n.name = nn[i].name_buf;
  }
  stoke_gnode *n = &g->nodes[g->n_nodes];
  memset(n, 0, sizeof *n);
  n->n.name = n->name_buf;
  n->fwd = -1;
  for (int i = 0; i < STOKE_MAX_IO; i++) n->in[i] = n->out[i] = n->din[i] = n->dout[i] = -1;
  *id = g->n_nodes++;
  return NULL;
}

/* For compiler passes (core/autocast.c): a new value, and a prepared
 * forward node appended as it is (its outputs' producer set to it). */
stoke_err *stoke_graph_new_value(stoke_graph *g, const char *name, stoke_value_kind kind, const stoke_shape *shape,
                                 stoke_dtype dtype, int *id) {
  return new_value(g, name, kind, shape, dtype, id);
}

stoke_err *stoke_graph_append_fwd(stoke_graph *g, const stoke_gnode *src) {
  int id;
  STOKE_PROPAGATE(new_node(g, &id));
  g->nodes[id] = *src;
  g->nodes[id].n.name = g->nodes[id].name_buf;
  for (int j = 0; j < src->n_out; j++) g->values[src->out[j]].producer = id;
  g->n_fwd = g->n_nodes;
  return NULL;
}

/* A compiler pass's new forward node: `op` named `name` (at most 63
 * characters kept) with attributes `attrs`, from value `in` to value `out`. */
stoke_err *stoke_graph_append_unary(stoke_graph *g, const char *op, const char *name, const char *attrs, int in,
                                    int out) {
  stoke_gnode c;
  memset(&c, 0, sizeof c);
  for (int i = 0; i < STOKE_MAX_IO; i++) c.in[i] = c.out[i] = c.din[i] = c.dout[i] = -1;
  snprintf(c.name_buf, sizeof c.name_buf, "%.63s", name);
  STOKE_PROPAGATE(stoke_node_init(g->reg, op, c.name_buf, attrs, &c.n));
  c.type = stoke_find_op(g->reg, op);
  c.pass = STOKE_FWD;
  c.fwd = -1;
  c.n_in = c.n_out = 1;
  c.in[0] = in;
  c.out[0] = out;
  return stoke_graph_append_fwd(g, &c);
}

/* A reshape's attributes: "shape=AxBx...". */
static void reshape_attrs(const stoke_shape *shape, char *attrs, size_t cap) {
  snprintf(attrs, cap, "shape=");
  for (int d = 0; d < shape->ndim; d++)
    snprintf(attrs + strlen(attrs), cap - strlen(attrs), "%s%lld", d ? "x" : "", (long long)shape->d[d]);
}

/* A compiler pass's reshape (a view where core/alias.c can): a new
 * activation `name` of `shape`, in memory order `layout` when 4-D, from
 * value `in` by a reshape node of the same name. */
stoke_err *stoke_graph_append_reshape(stoke_graph *g, const char *name, int in, const stoke_shape *shape,
                                      stoke_layout layout, int *out) {
  char attrs[160];
  reshape_attrs(shape, attrs, sizeof attrs);
  STOKE_PROPAGATE(new_value(g, name, STOKE_VAL_ACT, shape, g->values[in].dtype, out));
  g->values[*out].layout = shape->ndim == 4 ? layout : STOKE_LAYOUT_ANY;
  return stoke_graph_append_unary(g, STOKE_OP_RESHAPE, name, attrs, in, *out);
}

stoke_err *stoke_graph_append_view_into(stoke_graph *g, const char *name, int in, int out) {
  char attrs[160];
  reshape_attrs(&g->values[out].shape, attrs, sizeof attrs);
  return stoke_graph_append_unary(g, STOKE_OP_RESHAPE, name, attrs, in, out);
}

/* A compiler pass over the forward nodes in order, before backward
 * derivation: the forward list is emptied and each old node i of the n
 * handed to `place`, which appends it, changed or not, with any new nodes
 * before or after it (stoke_graph_append_*). */
stoke_err *stoke_graph_rewrite_fwd(stoke_graph *g, stoke_fwd_place place, void *ctx) {
  if (g->n_nodes != g->n_fwd) return STOKE_ERR(STOKE_E_INTERNAL, "a forward pass after backward derivation");
  int n = g->n_fwd;
  stoke_gnode *old = malloc(sizeof *old * (size_t)(n + 1));
  if (!old) return STOKE_ERR(STOKE_E_OOM, "out of memory for a compiler pass");
  memcpy(old, g->nodes, sizeof *old * (size_t)n);
  g->n_nodes = g->n_fwd = 0;
  stoke_err *e = NULL;
  for (int i = 0; i < n && !e; i++) e = place(ctx, old, n, i);
  free(old);
  return e;
}

stoke_err *stoke_graph_input(stoke_graph *g, const char *name, stoke_value_kind kind,
                             const stoke_shape *shape, stoke_dtype dtype, int *value) {
  STOKE_TRY(new_value(g, name, kind, shape, dtype, value), "adding input '%s'", name);
  if (kind == STOKE_VAL_INPUT) g->input = *value;
  if (kind == STOKE_VAL_LABEL) g->label = *value;
  return NULL;
}

/* A named persistent value: a parameter, or non-trained state. */
static stoke_err *persistent(stoke_graph *g, stoke_value_kind kind, const char *name,
                             const stoke_shape *shape, stoke_init_v1 init, int *value) {
  const char *what = kind == STOKE_VAL_PARAM ? "parameter" : "state";
  if (!name || !name[0]) return STOKE_ERR(STOKE_E_INVALID, "a %s needs a name", what);
  for (int i = 0; i < g->n_values; i++)
    if ((g->values[i].kind == STOKE_VAL_PARAM || g->values[i].kind == STOKE_VAL_STATE) &&
        !strcmp(g->values[i].name, name))
      return STOKE_ERR(STOKE_E_DUPLICATE, "%s '%s' declared twice", what, name);
  if (shape->ndim < 1 || shape->ndim > STOKE_MAX_DIMS || stoke_numel(shape) <= 0)
    return STOKE_ERR(STOKE_E_INVALID, "%s '%s': empty or bad shape", what, name);
  /* state (running statistics) stays f32 whatever the compute dtype */
  stoke_dtype dt = kind == STOKE_VAL_STATE && g->dtype != STOKE_F64 ? STOKE_F32 : g->dtype;
  STOKE_TRY(new_value(g, name, kind, shape, dt, value), "%s '%s'", what, name);
  g->values[*value].init = init;
  return NULL;
}

static stoke_err *b_param(stoke_graph *g, const char *name, const stoke_shape *shape,
                          stoke_init_v1 init, int *value) {
  return persistent(g, STOKE_VAL_PARAM, name, shape, init, value);
}

static stoke_err *b_state(stoke_graph *g, const char *name, const stoke_shape *shape,
                          stoke_init_v1 init, int *value) {
  return persistent(g, STOKE_VAL_STATE, name, shape, init, value);
}

/* Parse one attribute value into `a` by its declared type. */
static stoke_err *parse_attr(const stoke_attr_decl_v1 *d, const char *text, stoke_attr_v1 *a,
                             const char *node, const char *op) {
  char *end;
  memset(a, 0, sizeof *a);
  switch (d->type) {
    case STOKE_ATTR_INT:
      errno = 0;
      a->i = strtoll(text, &end, 10);
      if (errno || end == text || *end)
        return STOKE_ERR(STOKE_E_INVALID, "node '%s' (%s): attribute %s = '%s' is not an integer",
                         node, op, d->name, text);
      a->f = (double)a->i;
      return NULL;
    case STOKE_ATTR_FLOAT:
      errno = 0;
      a->f = strtod(text, &end);
      if (errno || end == text || *end)
        return STOKE_ERR(STOKE_E_INVALID, "node '%s' (%s): attribute %s = '%s' is not a number",
                         node, op, d->name, text);
      return NULL;
    case STOKE_ATTR_INTS: {
      /* "3" or "3x3" */
      const char *p = text;
      while (*p) {
        if (a->n == STOKE_ATTR_MAX_INTS)
          return STOKE_ERR(STOKE_E_INVALID, "node '%s' (%s): attribute %s has too many values",
                           node, op, d->name);
        errno = 0;
        a->ints[a->n++] = strtoll(p, &end, 10);
        if (errno || end == p || (*end && *end != 'x'))
          return STOKE_ERR(STOKE_E_INVALID,
                           "node '%s' (%s): attribute %s = '%s': expected integers like 3 or 3x3",
                           node, op, d->name, text);
        p = *end ? end + 1 : end;
      }
      a->i = a->n ? a->ints[0] : 0;
      return NULL;
    }
    case STOKE_ATTR_FLOATS: {
      /* "0.5" or "0.485:0.456:0.406" */
      const char *p = text;
      while (*p) {
        if (a->n == STOKE_ATTR_MAX_INTS)
          return STOKE_ERR(STOKE_E_INVALID, "node '%s' (%s): attribute %s has too many values",
                           node, op, d->name);
        errno = 0;
        a->floats[a->n++] = strtod(p, &end);
        if (errno || end == p || (*end && *end != ':'))
          return STOKE_ERR(STOKE_E_INVALID,
                           "node '%s' (%s): attribute %s = '%s': expected numbers like 0.5:0.25",
                           node, op, d->name, text);
        p = *end ? end + 1 : end;
      }
      a->f = a->n ? a->floats[0] : 0;
      return NULL;
    }
    case STOKE_ATTR_STR:
      if (strlen(text) >= STOKE_ATTR_MAX_STR)
        return STOKE_ERR(STOKE_E_INVALID, "node '%s' (%s): attribute %s is too long", node, op,
                         d->name);
      snprintf(a->s, sizeof a->s, "%s", text);
      return NULL;
  }
  return STOKE_ERR(STOKE_E_INTERNAL, "bad attribute type");
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  char *e = s + strlen(s);
  while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
  return s;
}

/* Fill node->attrs from "name=value, ..." text, defaults for the rest. */
static stoke_err *parse_attrs(const stoke_op_type_v1 *t, stoke_node_v1 *n, const char *text) {
  int given[STOKE_MAX_ATTRS] = {0};
  n->n_attrs = t->n_attrs;
  if (text && *text) {
    char buf[512];
    if (strlen(text) >= sizeof buf)
      return STOKE_ERR(STOKE_E_INVALID, "node '%s': attribute text too long", n->name);
    snprintf(buf, sizeof buf, "%s", text);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
      char *eq = strchr(tok, '=');
      if (!eq)
        return STOKE_ERR(STOKE_E_INVALID, "node '%s' (%s): attribute '%s' needs name=value",
                         n->name, t->name, trim(tok));
      *eq = 0;
      char *name = trim(tok), *val = trim(eq + 1);
      int k = -1;
      for (int i = 0; i < t->n_attrs; i++)
        if (!strcmp(t->attrs[i].name, name)) k = i;
      if (k < 0) {
        char list[256] = "";
        size_t used = 0;
        for (int i = 0; i < t->n_attrs && used < sizeof list; i++)
          used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                                   t->attrs[i].name);
        return STOKE_ERR(STOKE_E_INVALID, "node '%s' (%s): unknown attribute '%s' (attributes: %s)",
                         n->name, t->name, name, list[0] ? list : "none");
      }
      if (given[k])
        return STOKE_ERR(STOKE_E_INVALID, "node '%s' (%s): attribute '%s' given twice", n->name, t->name, name);
      STOKE_PROPAGATE(parse_attr(&t->attrs[k], val, &n->attrs[k], n->name, t->name));
      given[k] = 1;
    }
  }
  for (int i = 0; i < t->n_attrs; i++) {
    if (given[i]) continue;
    if (!t->attrs[i].def)
      return STOKE_ERR(STOKE_E_INVALID, "node '%s' (%s): attribute '%s' is required", n->name,
                       t->name, t->attrs[i].name);
    STOKE_TRY(parse_attr(&t->attrs[i], t->attrs[i].def, &n->attrs[i], n->name, t->name),
              "default of op '%s'", t->name);
  }
  return NULL;
}

stoke_err *stoke_node_init(const stoke_registry *reg, const char *op, const char *name,
                           const char *attrs, stoke_node_v1 *node) {
  const stoke_op_type_v1 *t = stoke_find_op(reg, op);
  if (!t) return STOKE_ERR(STOKE_E_NOT_FOUND, "unknown op '%s'", op);
  memset(node, 0, sizeof *node);
  node->op = t->name;
  node->name = name;
  return parse_attrs(t, node, attrs);
}

/* "leaky_relu(negative_slope=0.1)", as an INI key names an activation:
 * the op's name into `op`, and the attributes in parentheses after
 * `attrs` (a model's own) into `merged`. 0 when `text` has no '('. */
static stoke_err *split_op_text(const char *text, const char *attrs, char *op, size_t op_cap, char *merged,
                                size_t cap, int *split) {
  const char *paren = strchr(text, '(');
  size_t len = strlen(text);
  *split = paren != NULL;
  if (!paren) return NULL;
  while (len && (text[len - 1] == ' ' || text[len - 1] == '\t')) len--;
  if (text[len - 1] != ')' || (size_t)(paren - text) >= op_cap || len >= cap)
    return STOKE_ERR(STOKE_E_INVALID, "op '%s': write an op with attributes as name(attr=value, ...)", text);
  size_t n = (size_t)(paren - text);
  while (n && text[n - 1] == ' ') n--;
  snprintf(op, op_cap, "%.*s", (int)n, text);
  int inner = (int)(len - 1 - (size_t)(paren - text) - 1);
  int own = attrs && attrs[0];
  snprintf(merged, cap, "%s%s%.*s", own ? attrs : "", own && inner > 0 ? ", " : "", inner, paren + 1);
  return NULL;
}

static stoke_err *add_node(stoke_graph *g, const char *op_text, const char *name, const int *inputs,
                           int n_inputs, const char *attrs, int *outputs, int n_outputs) {
  char op_buf[64], attr_buf[512];
  int split;
  STOKE_PROPAGATE(split_op_text(op_text, attrs, op_buf, sizeof op_buf, attr_buf, sizeof attr_buf, &split));
  const char *op = split ? op_buf : op_text;
  if (split) attrs = attr_buf;
  const char *shown = name && *name ? name : "(unnamed)"; /* the node's name in errors before it has one */
  const stoke_op_type_v1 *t = stoke_find_op(g->reg, op);
  if (!t) {
    char names[1024];
    stoke_registry_names(g->reg, "op", names, sizeof names);
    return STOKE_ERR(STOKE_E_NOT_FOUND,
                     "node '%s': unknown op '%s' (ops registered: %s; an op from a plugin needs "
                     "[plugins] load = <plugin>)",
                     shown, op, names);
  }
  if (g->n_fwd != g->n_nodes)
    return STOKE_ERR(STOKE_E_INTERNAL, "nodes added after the graph was compiled");
  int variadic = t->n_outputs == 0; /* split: as many outputs as its infer makes */
  if (n_inputs != t->n_inputs || (variadic ? n_outputs < 1 || n_outputs > STOKE_MAX_IO : n_outputs != t->n_outputs))
    return STOKE_ERR(STOKE_E_INVALID, "node '%s': op '%s' takes %d inputs and %s%d outputs, given %d and %d",
                     shown, op, t->n_inputs, variadic ? "1 to " : "",
                     variadic ? STOKE_MAX_IO : t->n_outputs, n_inputs, n_outputs);
  for (int i = 0; i < n_inputs; i++)
    if (inputs[i] < 0 || inputs[i] >= g->n_values)
      return STOKE_ERR(STOKE_E_INVALID, "node '%s' (%s): input %d is not a value of this graph", shown, op, i);
  int id;
  STOKE_PROPAGATE(new_node(g, &id));
  stoke_gnode *n = &g->nodes[id];
  n->type = t;
  n->pass = STOKE_FWD;
  n->n.op = t->name;
  char nm[64];
  if (name && *name) snprintf(nm, sizeof nm, "%s", name);
  else snprintf(nm, sizeof nm, "%s_%d", op, id);
  snprintf(n->name_buf, sizeof n->name_buf, "%s", nm);
  for (int i = 0; i < id; i++)
    if (!strcmp(g->nodes[i].n.name, nm)) {
      g->n_nodes--;
      return STOKE_ERR(STOKE_E_DUPLICATE, "two nodes named '%s'", nm);
    }
  n->n_in = n_inputs;
  n->n_out = n_outputs;
  memcpy(n->in, inputs, sizeof(int) * (size_t)n_inputs);
  stoke_value_desc_v1 in[STOKE_MAX_IO], out[STOKE_MAX_IO];
  for (int i = 0; i < n_inputs; i++) in[i] = (stoke_value_desc_v1){g->values[inputs[i]].shape, g->values[inputs[i]].dtype};
  memset(out, 0, sizeof out);
  stoke_err *e = NULL;
  for (int i = 0; i < n_outputs && !e; i++) {
    char vn[80];
    snprintf(vn, sizeof vn, n_outputs == 1 ? "%s" : "%s:%d", nm, i);
    int v;
    e = new_value(g, vn, STOKE_VAL_ACT, &(stoke_shape){1, {1}}, g->dtype, &v);
    if (!e) n->out[i] = v;
  }
  n = &g->nodes[id];
  if (!e) e = parse_attrs(t, &n->n, attrs);
  if (!e) e = t->infer(&n->n, in, out);
  /* what an op's infer wrote (a plugin's too): every output given, 1 to STOKE_MAX_DIMS dimensions of at least 1,
   * a known dtype; unchecked, a negative size or a 9-dimension shape went into the memory plan */
  for (int i = 0; i < n_outputs && !e; i++) {
    const stoke_shape *os = &out[i].shape;
    if (!stoke_desc_valid(&out[i]) && !(variadic && i == n_outputs - 1 && !os->ndim)) { /* (a variadic op's count is checked below) */
      e = STOKE_ERR(STOKE_E_INVALID, "node '%s' (%s): its infer() gave output %d %d dimensions %s, dtype %d: not a "
                    "shape (1 to %d dimensions, each >= 1) or not a dtype; a plugin op's infer must set every output",
                    nm, op, i, os->ndim, stoke_shape_str(os).s, (int)out[i].dtype, STOKE_MAX_DIMS);
    }
  }
  if (!e && variadic && (!out[n_outputs - 1].shape.ndim || (n_outputs < STOKE_MAX_IO && out[n_outputs].shape.ndim)))
    e = STOKE_ERR(STOKE_E_INVALID, "node '%s' (%s): given %d outputs, its attributes make another number", nm, op,
                  n_outputs);
  if (e) {
    g->n_nodes--;
    return stoke_err_wrap(e, __FILE__, __LINE__, "adding node '%s' (%s)", nm, op);
  }
  n->flops = t->flops ? t->flops(&n->n, in, out) : 0;
  for (int i = 0; i < n_outputs; i++) {
    stoke_value *v = &g->values[n->out[i]];
    v->shape = out[i].shape;
    v->dtype = out[i].dtype;
    v->layout = out[i].shape.ndim == 4 ? g->layout : STOKE_LAYOUT_ANY;
    v->producer = id;
    outputs[i] = n->out[i];
  }
  g->n_fwd = g->n_nodes;
  return NULL;
}

static stoke_err *b_node(stoke_graph *g, const char *op, const char *name, const int *inputs,
                         int n_inputs, const char *attrs, int *outputs, int n_outputs) {
  return add_node(g, op, name, inputs, n_inputs, attrs, outputs, n_outputs);
}

static stoke_err *b_shape_of(stoke_graph *g, int value, stoke_shape *out) {
  if (value < 0 || value >= g->n_values)
    return STOKE_ERR(STOKE_E_INVALID, "value %d is not in this graph", value);
  *out = g->values[value].shape;
  return NULL;
}

/* Every name of a checkpoint is unique: a parameter's, a state's or a tied one. */
static int name_taken(const stoke_graph *g, const char *name) {
  for (int i = 0; i < g->n_values; i++)
    if ((g->values[i].kind == STOKE_VAL_PARAM || g->values[i].kind == STOKE_VAL_STATE) &&
        !strcmp(g->values[i].name, name))
      return 1;
  for (int i = 0; i < g->n_tied; i++)
    if (!strcmp(g->tied[i].name, name)) return 1;
  return 0;
}

static stoke_err *b_param_alias(stoke_graph *g, int value, const char *name) {
  if (value < 0 || value >= g->n_values || g->values[value].kind != STOKE_VAL_PARAM)
    return STOKE_ERR(STOKE_E_INVALID, "param_alias '%s': value %d is not a parameter", name ? name : "?", value);
  if (!name || !name[0] || strlen(name) >= sizeof g->tied->name)
    return STOKE_ERR(STOKE_E_INVALID, "param_alias of '%s': the name is empty or longer than %zu characters",
                     g->values[value].name, sizeof g->tied->name - 1);
  if (name_taken(g, name)) return STOKE_ERR(STOKE_E_DUPLICATE, "param_alias: the name '%s' is taken", name);
  stoke_tied_name *t = realloc(g->tied, sizeof *t * (size_t)(g->n_tied + 1));
  if (!t) return STOKE_ERR(STOKE_E_OOM, "out of memory");
  g->tied = t;
  t[g->n_tied].value = value;
  snprintf(t[g->n_tied++].name, sizeof t->name, "%s", name);
  return NULL;
}

stoke_builder_v1 stoke_graph_builder(stoke_graph *g) {
  return (stoke_builder_v1){g, b_param, b_node, b_shape_of, b_state, b_param_alias};
}

stoke_err *stoke_graph_loss(stoke_graph *g, int logits, const char *attrs) {
  if (g->label < 0) return STOKE_ERR(STOKE_E_INTERNAL, "the graph has no label input");
  return stoke_graph_loss_on(g, logits, g->label, attrs);
}

stoke_err *stoke_graph_loss_on(stoke_graph *g, int logits, int labels, const char *attrs) {
  int in[2] = {logits, labels}, out[2];
  STOKE_TRY(add_node(g, STOKE_OP_SOFTMAX_CE, "loss", in, 2, attrs, out, 2), "attaching the loss");
  g->logits = logits;
  g->loss = out[0];
  return NULL;
}

/* ------------------------------------------------ backward derivation */

/* The gradient `grad` of value v flows in from one more consumer: the
 * first sets v's gradient, later ones are summed with it by an `add` node
 * (the sum becomes v's gradient). */
static stoke_err *add_grad_sum(stoke_graph *g, int v, int part) {
  int sid, sum;
  const stoke_op_type_v1 *add = stoke_find_op(g->reg, STOKE_OP_ADD);
  STOKE_PROPAGATE(new_node(g, &sid));
  char gname[80];
  snprintf(gname, sizeof gname, "%s.grad.sum%d", g->values[v].name, sid);
  STOKE_PROPAGATE(new_value(g, gname, STOKE_VAL_GRAD, &g->values[v].shape, g->values[v].dtype, &sum));
  g->values[sum].layout = g->values[v].layout;
  stoke_gnode *a = &g->nodes[sid];
  a->type = add;
  a->pass = STOKE_FWD;
  a->n.op = add->name;
  snprintf(a->name_buf, sizeof a->name_buf, "%.60s", gname);
  a->n_in = 2;
  a->n_out = 1;
  a->in[0] = g->values[v].grad;
  a->in[1] = part;
  a->out[0] = sum;
  a->flops = (double)stoke_numel(&g->values[v].shape);
  g->values[sum].producer = sid;
  g->values[v].grad = sum;
  return NULL;
}

/* The backward of y = a + b is dy for both: no node and no copy, a and b
 * take dy's value as their gradient (ResNet-50 spent 3.8 ms of 68 copying
 * it). Parameters are left to the general path (their gradients live in
 * the flat buffer). */
static int alias_add_grads(stoke_graph *g, const stoke_gnode *f, const char *needs, stoke_err **e) {
  *e = NULL;
  if (strcmp(f->n.op, STOKE_OP_ADD) || f->n_out != 1 || g->values[f->out[0]].grad < 0) return 0;
  int dy = g->values[f->out[0]].grad;
  for (int k = 0; k < f->n_in; k++) {
    const stoke_value *val = &g->values[f->in[k]];
    if (val->kind == STOKE_VAL_PARAM || stoke_numel(&val->shape) != stoke_numel(&g->values[dy].shape) ||
        val->dtype != g->values[dy].dtype)
      return 0;
  }
  for (int k = 0; k < f->n_in && !*e; k++) {
    int v = f->in[k];
    if (!needs[v]) continue;
    if (g->values[v].grad < 0) g->values[v].grad = dy;
    else *e = add_grad_sum(g, v, dy);
  }
  return 1;
}

/* add_layer_norm's (and add_bias_layer_norm's) backward writes the same
 * gradient into a and b: one value serves both when neither is a parameter
 * and neither has a gradient from elsewhere yet. */
static int shares_grad(const stoke_graph *g, const stoke_gnode *f, const char *needs) {
  if ((strcmp(f->n.op, STOKE_OP_ADD_LAYER_NORM) && strcmp(f->n.op, STOKE_OP_ADD_BIAS_LAYER_NORM)) ||
      f->in[0] == f->in[1])
    return 0;
  for (int k = 0; k < 2; k++) {
    const stoke_value *v = &g->values[f->in[k]];
    if (!needs[f->in[k]] || v->kind == STOKE_VAL_PARAM || v->grad >= 0 || v->dtype != g->values[f->in[0]].dtype)
      return 0;
  }
  return 1;
}

/* A backward node that adds onto a tied parameter's gradient gets beta 1
 * for every parameter gradient it writes: one of its own would then add
 * onto a stale buffer on the first micro-batch. */
static stoke_err *check_tied(const stoke_graph *g, int id) {
  const stoke_gnode *b = &g->nodes[id];
  if (!b->param_accumulate) return NULL;
  for (int k = 0; k < b->n_in; k++)
    if (b->din[k] >= 0 && g->values[b->din[k]].kind == STOKE_VAL_PARAM_GRAD &&
        g->values[b->din[k]].producer == id)
      return STOKE_ERR(STOKE_E_UNSUPPORTED,
                       "node '%s' uses a parameter that an earlier node uses too (tied) and also '%s' of its own; "
                       "tie whole nodes' parameters (one tied parameter per node)",
                       b->n.name, g->values[b->in[k]].name);
  return NULL;
}

/* Used by the compiler (core/plan.c). For every forward node, in reverse
 * order, emit its backward node; gradients of a value used by several
 * nodes are summed by `add` nodes; parameter gradients land in the flat
 * gradient buffer. */
/* needs[v] (n_values of them) = 1 where a parameter is upstream of value v
 * through the forward nodes' gradient-taking inputs: the values whose
 * gradient backward may make (also core/plan.c's index_max_pools). */
void stoke_graph_grad_flow(const stoke_graph *g, char *needs) {
  for (int v = 0; v < g->n_values; v++) needs[v] = g->values[v].kind == STOKE_VAL_PARAM;
  for (int i = 0; i < g->n_fwd; i++) {
    const stoke_gnode *n = &g->nodes[i];
    int any = 0;
    for (int k = 0; k < n->n_in; k++)
      if (!(n->type->no_grad_inputs & (1u << k))) any |= needs[n->in[k]];
    for (int j = 0; j < n->n_out; j++) needs[n->out[j]] = (char)any;
  }
}

/* A forward node that reads one parameter twice (torch's w @ w.T) reads it
 * the second time through a reshape to its own shape, a view: each read
 * then has its own gradient, the reshape's added to the parameter's as a
 * tied weight's is. (Both reads' gradients would otherwise be written to
 * the one buffer, each over the other.) */
static stoke_err *place_repeated(void *ctx, const stoke_gnode *old, int n, int i) {
  (void)n;
  stoke_graph *g = ctx;
  stoke_gnode f = old[i];
  for (int k = 1; k < f.n_in; k++) {
    int v = f.in[k], again = 0;
    for (int j = 0; j < k; j++) again |= old[i].in[j] == v;
    if (!again || g->values[v].kind != STOKE_VAL_PARAM) continue;
    char name[80];
    snprintf(name, sizeof name, "%.50s.again.%d", g->values[v].name, k);
    /* the parameter's memory, viewed: its shape and order */
    STOKE_PROPAGATE(stoke_graph_append_reshape(g, name, v, &g->values[v].shape, g->values[v].layout, &f.in[k]));
  }
  return stoke_graph_append_fwd(g, &f);
}

static stoke_err *repeated_params(stoke_graph *g) {
  int any = 0;
  for (int i = 0; i < g->n_fwd && !any; i++)
    for (int k = 1; k < g->nodes[i].n_in; k++)
      for (int j = 0; j < k; j++)
        any |= g->nodes[i].in[j] == g->nodes[i].in[k] && g->values[g->nodes[i].in[k]].kind == STOKE_VAL_PARAM;
  return any ? stoke_graph_rewrite_fwd(g, place_repeated, g) : NULL;
}

stoke_err *stoke_graph_derive_backward(stoke_graph *g) {
  if (g->loss < 0) return STOKE_ERR(STOKE_E_INTERNAL, "training plan without a loss");
  STOKE_PROPAGATE(repeated_params(g));
  int n_fwd = g->n_fwd;
  char *needs = calloc((size_t)g->n_values + 1, 1);
  if (!needs) return STOKE_ERR(STOKE_E_OOM, "out of memory");
  stoke_graph_grad_flow(g, needs);
  stoke_err *e = NULL;
  int seed;
  e = new_value(g, "loss.grad", STOKE_VAL_SEED, &g->values[g->loss].shape, g->values[g->loss].dtype,
                &seed);
  if (e) goto done;
  g->seed = seed;
  g->values[g->loss].grad = seed;
  for (int i = n_fwd - 1; i >= 0; i--) {
    stoke_gnode f = g->nodes[i]; /* copy: the array may move */
    int has_dout = 0;
    for (int j = 0; j < f.n_out; j++) has_dout |= g->values[f.out[j]].grad >= 0;
    if (!has_dout) continue;
    int wants = -1;
    for (int k = 0; k < f.n_in && wants < 0; k++)
      if (needs[f.in[k]] && !(f.type->no_grad_inputs & (1u << k))) wants = k;
    if (wants < 0 || f.type->has_backward == STOKE_NO_GRAD) continue;
    if (f.type->has_backward != STOKE_HAS_BACKWARD) {
      const char *origin = stoke_registry_origin(g->reg, f.type->name);
      e = STOKE_ERR(STOKE_E_UNSUPPORTED,
                    "node '%s': op '%s' (from %s) has no backward (has_backward = 0), but its input %d ('%s') needs "
                    "a gradient: the parameters before it would never train. Give the op backward kernels and set "
                    ".has_backward = STOKE_HAS_BACKWARD in its stoke_op_type_v1, or .has_backward = STOKE_NO_GRAD to "
                    "stop gradients here on purpose (as torch's .detach())",
                    f.n.name, f.type->name, origin ? origin : "?", wants, g->values[f.in[wants]].name);
      goto done;
    }
    if (alias_add_grads(g, &f, needs, &e)) {
      if (e) goto done;
      continue;
    }
    int id;
    if ((e = new_node(g, &id))) goto done;
    stoke_gnode *b = &g->nodes[id];
    b->n = f.n;
    snprintf(b->name_buf, sizeof b->name_buf, "%.59s.bwd", f.name_buf);
    b->n.name = b->name_buf;
    b->type = f.type;
    b->pass = STOKE_BWD;
    b->fwd = i;
    b->n_in = f.n_in;
    b->n_out = f.n_out;
    b->flops = 2 * f.flops;
    memcpy(b->in, f.in, sizeof b->in);
    memcpy(b->out, f.out, sizeof b->out);
    for (int j = 0; j < f.n_out; j++) b->dout[j] = g->values[f.out[j]].grad;
    int sums[STOKE_MAX_IO][2], n_sums = 0, share = shares_grad(g, &f, needs);
    for (int k = 0; k < f.n_in; k++) {
      int v = f.in[k];
      if (!needs[v] || (f.type->no_grad_inputs & (1u << k))) continue;
      stoke_value *val = &g->values[v];
      char gname[80];
      snprintf(gname, sizeof gname, "%s.grad", val->name);
      int gv;
      if (val->kind == STOKE_VAL_PARAM) {
        if (val->grad >= 0) { /* tied: this node adds onto the earlier user's gradient */
          gv = val->grad;
          g->nodes[id].param_accumulate = 1;
        } else {
          if ((e = new_value(g, gname, STOKE_VAL_PARAM_GRAD, &val->shape, val->dtype, &gv))) goto done;
          g->values[v].grad = gv;
        }
      } else if (k == 1 && share) {
        gv = g->nodes[id].din[0]; /* add_(bias_)layer_norm: a and b get the same gradient */
        g->values[v].grad = gv;
      } else if (val->grad < 0) {
        if ((e = new_value(g, gname, STOKE_VAL_GRAD, &val->shape, val->dtype, &gv))) goto done;
        g->values[v].grad = gv;
      } else {
        /* second consumer: a partial gradient, summed right after */
        snprintf(gname, sizeof gname, "%s.grad.%d", g->values[v].name, id);
        if ((e = new_value(g, gname, STOKE_VAL_GRAD, &val->shape, val->dtype, &gv))) goto done;
        sums[n_sums][0] = v;
        sums[n_sums++][1] = gv;
      }
      g->values[gv].layout = g->values[v].layout; /* a gradient is in its value's memory order (core/layout.c) */
      g->nodes[id].din[k] = gv;
      if (!g->nodes[id].param_accumulate || g->values[gv].kind != STOKE_VAL_PARAM_GRAD) g->values[gv].producer = id;
    }
    if ((e = check_tied(g, id))) goto done;
    for (int s = 0; s < n_sums; s++)
      if ((e = add_grad_sum(g, sums[s][0], sums[s][1]))) goto done;
  }
done:
  free(needs);
  return e;
}
