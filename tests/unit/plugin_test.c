/* tests/unit/plugin_test.c: the plugin loader (core/registry.c): loading by
 * name, path and STOKE_PLUGIN_PATH, and every refusal with its message. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stoke/core.h"
#include "stoke/registry.h"

/* The test plugins, relative to the runfiles root (Bazel's cwd for tests). */
#define PLUGDIR "tests/unit/plugins"
#define PLUGIN(name) PLUGDIR "/libstoke_" name ".so"

/* ----------------------------------------------------------- helpers */

static const char *tmpdir(void) {
  const char *t = getenv("TEST_TMPDIR");
  return t && t[0] ? t : "/tmp";
}

/* A registry with the test plugins' folder on its search path. */
static stoke_registry *new_registry(void) {
  stoke_registry *r = NULL;
  stoke_err *e = stoke_registry_new(&r);
  if (e) print_error("stoke_registry_new: %s\n", e->msg);
  assert_null(e);
  assert_non_null(r);
  stoke_registry_add_path(r, PLUGDIR);
  return r;
}

static void check_code(const stoke_err *e, stoke_code code, const char *file, int line) {
  if (!e) {
    print_error("%s:%d: expected a '%s' error, got success\n", file, line,
                stoke_code_name(code));
    _fail(file, line);
  }
  if (e->code != code) {
    print_error("%s:%d: expected code '%s', got '%s':\n%s\n", file, line,
                stoke_code_name(code), stoke_code_name(e->code), e->msg);
    _fail(file, line);
  }
}

static void check_has(const stoke_err *e, const char *sub, const char *file, int line) {
  if (!strstr(e->msg, sub)) {
    print_error("%s:%d: message lacks \"%s\":\n%s\n", file, line, sub, e->msg);
    _fail(file, line);
  }
}

#define EXPECT_CODE(e, code) check_code((e), (code), __FILE__, __LINE__)
#define EXPECT_HAS(e, sub) check_has((e), (sub), __FILE__, __LINE__)

static void expect_ok(stoke_err *e, const char *file, int line) {
  if (e) {
    print_error("%s:%d: unexpected error: %s\n", file, line, e->msg);
    stoke_err_free(e);
    _fail(file, line);
  }
}
#define EXPECT_OK(expr) expect_ok((expr), __FILE__, __LINE__)

/* How many times `name` appears in the comma-separated op list. */
static int op_count(stoke_registry *r, const char *name) {
  char buf[4096];
  stoke_registry_names(r, "op", buf, sizeof buf);
  int n = 0;
  for (char *tok = strtok(buf, ", "); tok; tok = strtok(NULL, ", ")) n += !strcmp(tok, name);
  return n;
}

/* ------------------------------------------------------------- loading */

static void test_good_loads_by_name(void **state) {
  stoke_registry *r = new_registry();
  assert_null(stoke_find_op(r, "test_good_op"));
  EXPECT_OK(stoke_registry_load(r, "good"));

  const stoke_op_type_v1 *op = stoke_find_op(r, "test_good_op");
  assert_non_null(op);
  assert_int_equal(op->n_inputs, 1);
  assert_int_equal(op->n_outputs, 1);
  /* the plugin's infer and flops are callable through the registry */
  stoke_value_desc_v1 in = {{2, {3, 4}}, STOKE_F32}, out;
  memset(&out, 0, sizeof out);
  stoke_node_v1 node = {.op = "test_good_op", .name = "g1"};
  EXPECT_OK(op->infer(&node, &in, &out));
  assert_int_equal(out.shape.ndim, 2);
  assert_int_equal(out.shape.d[1], 4);
  assert_true(op->flops(&node, &in, &out) == 12.0);
  assert_string_equal(stoke_registry_origin(r, "test_good_op"), PLUGIN("good"));
  /* built-ins are still there */
  assert_non_null(stoke_find_op(r, "relu"));

  /* loading a name again is a no-op, not a duplicate */
  EXPECT_OK(stoke_registry_load(r, "good"));
  EXPECT_OK(stoke_registry_load(r, "good"));
  assert_int_equal(op_count(r, "test_good_op"), 1);
  assert_ptr_equal(stoke_find_op(r, "test_good_op"), op);
  stoke_registry_free(r);
}

static void test_good_loads_by_path(void **state) {
  stoke_registry *r = NULL;
  EXPECT_OK(stoke_registry_new(&r)); /* no search path needed */
  EXPECT_OK(stoke_registry_load(r, PLUGIN("good")));
  assert_non_null(stoke_find_op(r, "test_good_op"));
  assert_string_equal(stoke_registry_origin(r, "test_good_op"), PLUGIN("good"));
  EXPECT_OK(stoke_registry_load(r, PLUGIN("good"))); /* again: no-op */
  assert_int_equal(op_count(r, "test_good_op"), 1);

  /* a path that does not exist: not found, naming the path */
  stoke_err *e = stoke_registry_load(r, PLUGDIR "/libstoke_absent.so");
  EXPECT_CODE(e, STOKE_E_NOT_FOUND);
  EXPECT_HAS(e, PLUGDIR "/libstoke_absent.so");
  EXPECT_HAS(e, "No such file or directory");
  stoke_err_free(e);
  stoke_registry_free(r);
}

/* One file under two spellings (by name, by path, via "./"): loaded once;
 * "core", the built-in plugin's name, is no file and is not found. */
static void test_same_file_two_spellings(void **state) {
  stoke_registry *r = new_registry();
  EXPECT_OK(stoke_registry_load(r, "good"));
  EXPECT_OK(stoke_registry_load(r, PLUGIN("good")));
  EXPECT_OK(stoke_registry_load(r, "./" PLUGIN("good")));
  assert_int_equal(op_count(r, "test_good_op"), 1);
  stoke_err *e = stoke_registry_load(r, "core");
  EXPECT_CODE(e, STOKE_E_NOT_FOUND);
  EXPECT_HAS(e, "libstoke_core.so");
  stoke_err_free(e);
  stoke_registry_free(r);
}

/* Two registries load the same plugin independently; freeing one (and so
 * dlclosing its handle) leaves the other's op usable. */
static void test_two_registries(void **state) {
  stoke_registry *a = new_registry(), *b = new_registry();
  EXPECT_OK(stoke_registry_load(a, "good"));
  EXPECT_OK(stoke_registry_load(b, "good"));
  stoke_registry_free(a);
  const stoke_op_type_v1 *op = stoke_find_op(b, "test_good_op");
  assert_non_null(op);
  stoke_value_desc_v1 in = {{1, {5}}, STOKE_F32};
  stoke_node_v1 node = {.op = "test_good_op", .name = "g"};
  assert_true(op->flops(&node, &in, &in) == 5.0);
  stoke_registry_free(b);
}

/* ------------------------------------------------------------- refusals */

static void test_missing_plugin(void **state) {
  stoke_registry *r = new_registry();
  stoke_registry_add_path(r, tmpdir());
  unsetenv("STOKE_PLUGIN_PATH");
  stoke_err *e = stoke_registry_load(r, "nope");
  EXPECT_CODE(e, STOKE_E_NOT_FOUND);
  EXPECT_HAS(e, "plugin 'nope' not found");
  EXPECT_HAS(e, "libstoke_nope.so");
  /* every folder looked in, in order */
  char want[PATH_MAX + 64];
  EXPECT_HAS(e, PLUGDIR "/libstoke_nope.so");
  snprintf(want, sizeof want, "%s/libstoke_nope.so", tmpdir());
  EXPECT_HAS(e, want);
  assert_true(strstr(e->msg, PLUGDIR "/libstoke_nope.so") < strstr(e->msg, want));
  /* then the executable's folder and its plugins/ subfolder */
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  assert_true(n > 0);
  exe[n] = 0;
  *strrchr(exe, '/') = 0;
  snprintf(want, sizeof want, "%s/libstoke_nope.so", exe);
  EXPECT_HAS(e, want);
  snprintf(want, sizeof want, "%s/plugins/libstoke_nope.so", exe);
  EXPECT_HAS(e, want);
  /* and what there is to load instead */
  EXPECT_HAS(e, "plugins found on the search path: ");
  EXPECT_HAS(e, "good");
  EXPECT_HAS(e, "failreg");
  EXPECT_HAS(e, "STOKE_PLUGIN_PATH");
  stoke_err_free(e);

  /* the list of available plugins on its own, sorted */
  char avail[1024];
  stoke_registry_available(r, avail, sizeof avail);
  assert_non_null(strstr(avail, "badabi, badsize, dup, dup2, failreg, good, nosym"));
  stoke_registry_free(r);
}

static void test_missing_symbol(void **state) {
  stoke_registry *r = new_registry();
  stoke_err *e = stoke_registry_load(r, "nosym");
  EXPECT_CODE(e, STOKE_E_ABI);
  EXPECT_HAS(e, PLUGIN("nosym"));
  EXPECT_HAS(e, "not a stoke plugin");
  EXPECT_HAS(e, "'stoke_plugin_v1_entry'");
  stoke_err_free(e);
  /* a refused plugin is not remembered as loaded: the error comes again */
  e = stoke_registry_load(r, "nosym");
  EXPECT_CODE(e, STOKE_E_ABI);
  stoke_err_free(e);
  stoke_registry_free(r);
}

static void test_abi_version_mismatch(void **state) {
  stoke_registry *r = new_registry();
  stoke_err *e = stoke_registry_load(r, "badabi");
  EXPECT_CODE(e, STOKE_E_ABI);
  EXPECT_HAS(e, PLUGIN("badabi"));
  EXPECT_HAS(e, "ABI version mismatch");
  char want[128];
  snprintf(want, sizeof want, "stoke expects version %u", STOKE_ABI_VERSION);
  EXPECT_HAS(e, want);
  snprintf(want, sizeof want, "built for version %u", STOKE_ABI_VERSION + 1);
  EXPECT_HAS(e, want);
  stoke_err_free(e);
  e = stoke_registry_load(r, "badabi");
  EXPECT_CODE(e, STOKE_E_ABI);
  stoke_err_free(e);
  stoke_registry_free(r);
}

static void test_struct_size_mismatch(void **state) {
  stoke_registry *r = new_registry();
  stoke_err *e = stoke_registry_load(r, "badsize");
  EXPECT_CODE(e, STOKE_E_ABI);
  EXPECT_HAS(e, PLUGIN("badsize"));
  EXPECT_HAS(e, "struct size mismatch");
  char want[128];
  snprintf(want, sizeof want, "sizeof(stoke_plugin_v1) = %zu", sizeof(stoke_plugin_v1));
  EXPECT_HAS(e, want);
  snprintf(want, sizeof want, "the plugin says %zu", sizeof(stoke_plugin_v1) + 8);
  EXPECT_HAS(e, want);
  stoke_err_free(e);
  stoke_registry_free(r);
}

static void test_not_a_shared_object(void **state) {
  char dir[PATH_MAX], path[PATH_MAX + 32];
  snprintf(dir, sizeof dir, "%s/garbage_dir", tmpdir());
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/libstoke_garbage.so", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("This is a text file that only looks like a plugin by its name.\n"
        "It has no ELF header at all, so dlopen must refuse it.\n",
        f);
  fclose(f);

  stoke_registry *r = new_registry();
  stoke_registry_add_path(r, dir);
  stoke_err *e = stoke_registry_load(r, "garbage");
  EXPECT_CODE(e, STOKE_E_IO);
  EXPECT_HAS(e, path);
  EXPECT_HAS(e, "cannot load plugin");
  EXPECT_HAS(e, "invalid ELF header"); /* dlerror()'s reason */
  stoke_err_free(e);
  stoke_registry_free(r);
  unlink(path);
  rmdir(dir);
}

static void test_duplicate_of_builtin(void **state) {
  stoke_registry *r = new_registry();
  const stoke_op_type_v1 *relu = stoke_find_op(r, "relu");
  assert_non_null(relu);
  stoke_err *e = stoke_registry_load(r, "dup");
  EXPECT_CODE(e, STOKE_E_DUPLICATE);
  EXPECT_HAS(e, PLUGIN("dup"));
  EXPECT_HAS(e, "op 'relu'");
  EXPECT_HAS(e, "already registered by built-in");
  stoke_err_free(e);
  /* the built-in relu is untouched */
  assert_ptr_equal(stoke_find_op(r, "relu"), relu);
  assert_string_equal(stoke_registry_origin(r, "relu"), "built-in");
  assert_int_equal(op_count(r, "relu"), 1);
  stoke_registry_free(r);
}

static void test_duplicate_between_plugins(void **state) {
  stoke_registry *r = new_registry();
  EXPECT_OK(stoke_registry_load(r, "good"));
  const stoke_op_type_v1 *good = stoke_find_op(r, "test_good_op");
  stoke_err *e = stoke_registry_load(r, "dup2");
  EXPECT_CODE(e, STOKE_E_DUPLICATE);
  EXPECT_HAS(e, PLUGIN("dup2"));
  EXPECT_HAS(e, "op 'test_good_op'");
  EXPECT_HAS(e, "already registered by " PLUGIN("good"));
  stoke_err_free(e);
  /* the first registration stands; what dup2 added before the clash is gone */
  assert_ptr_equal(stoke_find_op(r, "test_good_op"), good);
  assert_string_equal(stoke_registry_origin(r, "test_good_op"), PLUGIN("good"));
  assert_null(stoke_find_op(r, "test_dup2_op"));
  assert_null(stoke_registry_origin(r, "test_dup2_op"));
  /* dup2 alone (no good loaded) would be fine: the failure was the clash */
  stoke_registry *r2 = new_registry();
  EXPECT_OK(stoke_registry_load(r2, "dup2"));
  assert_non_null(stoke_find_op(r2, "test_dup2_op"));
  stoke_registry_free(r2);
  stoke_registry_free(r);
}

static void test_failed_register_rolls_back(void **state) {
  stoke_registry *r = new_registry();
  char before[4096], after[4096];
  stoke_registry_names(r, "op", before, sizeof before);
  stoke_err *e = stoke_registry_load(r, "failreg");
  EXPECT_CODE(e, STOKE_E_INVALID); /* the plugin's own code, passed through */
  EXPECT_HAS(e, "refusing to finish registering");
  EXPECT_HAS(e, "registering plugin " PLUGIN("failreg"));
  stoke_err_free(e);
  assert_null(stoke_find_op(r, "test_failreg_op"));
  assert_null(stoke_registry_origin(r, "test_failreg_op"));
  stoke_registry_names(r, "op", after, sizeof after);
  assert_string_equal(before, after);
  /* not remembered as loaded: loading it again fails again */
  e = stoke_registry_load(r, "failreg");
  EXPECT_CODE(e, STOKE_E_INVALID);
  stoke_err_free(e);
  assert_null(stoke_find_op(r, "test_failreg_op"));
  /* and the registry still works */
  EXPECT_OK(stoke_registry_load(r, "good"));
  assert_non_null(stoke_find_op(r, "test_good_op"));
  assert_null(stoke_find_op(r, "test_failreg_op"));
  stoke_registry_free(r);
}

/* ----------------------------------------------------- STOKE_PLUGIN_PATH */

static void test_plugin_path_env(void **state) {
  /* a folder holding the good plugin under a name found nowhere else */
  char dir[PATH_MAX], link[PATH_MAX + 32], target[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/env_plugins", tmpdir());
  mkdir(dir, 0755);
  snprintf(link, sizeof link, "%s/libstoke_envonly.so", dir);
  assert_non_null(realpath(PLUGIN("good"), target));
  unlink(link);
  assert_int_equal(symlink(target, link), 0);

  unsetenv("STOKE_PLUGIN_PATH");
  stoke_registry *r = new_registry();
  stoke_err *e = stoke_registry_load(r, "envonly");
  EXPECT_CODE(e, STOKE_E_NOT_FOUND);
  stoke_err_free(e);

  /* colon-separated, empty entries skipped, a missing folder harmless */
  char env[2 * PATH_MAX];
  snprintf(env, sizeof env, "/nonexistent/stoke_plugins::%s:", dir);
  assert_int_equal(setenv("STOKE_PLUGIN_PATH", env, 1), 0);
  EXPECT_OK(stoke_registry_load(r, "envonly"));
  assert_non_null(stoke_find_op(r, "test_good_op"));
  assert_string_equal(stoke_registry_origin(r, "test_good_op"), link);

  /* the env folders show up in "not found" messages and in the list */
  e = stoke_registry_load(r, "nope");
  EXPECT_CODE(e, STOKE_E_NOT_FOUND);
  EXPECT_HAS(e, "/nonexistent/stoke_plugins/libstoke_nope.so");
  char want[PATH_MAX + 64];
  snprintf(want, sizeof want, "%s/libstoke_nope.so", dir);
  EXPECT_HAS(e, want);
  EXPECT_HAS(e, "envonly");
  /* added folders come before STOKE_PLUGIN_PATH */
  assert_true(strstr(e->msg, PLUGDIR "/libstoke_nope.so") <
              strstr(e->msg, "/nonexistent/stoke_plugins/libstoke_nope.so"));
  stoke_err_free(e);
  stoke_registry_free(r);

  unsetenv("STOKE_PLUGIN_PATH");
  unlink(link);
  rmdir(dir);
}

/* ------------------------------------------- what an op says of its backward */

static stoke_err *same_infer(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out) {
  out[0] = in[0];
  return NULL;
}

static const stoke_op_type_v1 *bad_op; /* the op the plugin below registers */
static stoke_err *reg_bad_op(const stoke_host_v1 *h, const stoke_registry_v1 *r) { return r->add_op(r->self, bad_op); }

static stoke_err *add_op_plugin(stoke_registry *r, const stoke_op_type_v1 *op) {
  static const stoke_plugin_v1 p = {STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "op_rules", "", reg_bad_op};
  bad_op = op;
  return stoke_registry_add_plugin(r, &p, "op_rules.so");
}

/* A backward that does not say what it reads is refused where the op is
 * registered (issue 18: it was handed NULL inputs and crashed); so are
 * has_backward values other than 0, 1 and STOKE_NO_GRAD, and bwd_needs
 * naming values the op does not have. */
static void test_op_backward_declarations(void **state) {
  stoke_registry *r = new_registry();
  stoke_op_type_v1 op = {STOKE_ABI(stoke_op_type_v1), .name = "leaky", .n_inputs = 1, .n_outputs = 1,
                         .infer = same_infer, .has_backward = STOKE_HAS_BACKWARD};
  stoke_err *e = add_op_plugin(r, &op);
  EXPECT_CODE(e, STOKE_E_INVALID);
  EXPECT_HAS(e, "op_rules.so");
  EXPECT_HAS(e, "op 'leaky' has a backward");
  EXPECT_HAS(e, "bwd_needs is 0");
  EXPECT_HAS(e, "STOKE_BWD_NEEDS_INPUT(0)");
  EXPECT_HAS(e, "STOKE_BWD_NEEDS_NOTHING");
  stoke_err_free(e);
  op.bwd_needs = STOKE_BWD_NEEDS_INPUT(1); /* it has one input */
  e = add_op_plugin(r, &op);
  EXPECT_CODE(e, STOKE_E_INVALID);
  EXPECT_HAS(e, "does not have");
  stoke_err_free(e);
  op.bwd_needs = STOKE_BWD_NEEDS_NOTHING | STOKE_BWD_NEEDS_INPUT(0);
  e = add_op_plugin(r, &op);
  EXPECT_CODE(e, STOKE_E_INVALID);
  stoke_err_free(e);
  op.bwd_needs = STOKE_BWD_NEEDS_INPUT(0);
  op.has_backward = 2;
  e = add_op_plugin(r, &op);
  EXPECT_CODE(e, STOKE_E_INVALID);
  EXPECT_HAS(e, "has_backward = 2");
  stoke_err_free(e);
  op.has_backward = STOKE_HAS_BACKWARD;
  EXPECT_OK(add_op_plugin(r, &op));
  op.name = "leaky_nothing";
  op.bwd_needs = STOKE_BWD_NEEDS_NOTHING;
  EXPECT_OK(add_op_plugin(r, &op));
  op.name = "leaky_detached";
  op.bwd_needs = 0;
  op.has_backward = STOKE_NO_GRAD;
  EXPECT_OK(add_op_plugin(r, &op));
  stoke_registry_free(r);
}

/* A part without a callback it cannot work without (an op's infer, a
 * source's read, a model's build), or with a name an INI list cannot hold,
 * is refused where it is registered, naming what is missing: it used to
 * register and crash at its first use (a run, or the test kit). */
static const stoke_source_v1 *source_to_add;
static const stoke_model_v1 *model_to_add;
static stoke_err *reg_parts(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  if (source_to_add) return r->add_source(r->self, source_to_add);
  return r->add_model(r->self, model_to_add);
}

static stoke_err *add_parts_plugin(stoke_registry *r, const stoke_source_v1 *s, const stoke_model_v1 *m) {
  static const stoke_plugin_v1 p = {STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "parts", "", reg_parts};
  source_to_add = s, model_to_add = m;
  return stoke_registry_add_plugin(r, &p, "parts.so");
}

static stoke_err *no_build(const stoke_cfg *c, const char *s, const stoke_builder_v1 *b, int x, int64_t k, int *l) {
  return NULL;
}

static void test_required_callbacks_and_names(void **state) {
  stoke_registry *r = new_registry();
  stoke_op_type_v1 op = {STOKE_ABI(stoke_op_type_v1), .name = "noinfer", .n_inputs = 1, .n_outputs = 1,
                         .has_backward = STOKE_NO_GRAD};
  stoke_err *e = add_op_plugin(r, &op);
  EXPECT_CODE(e, STOKE_E_INVALID);
  EXPECT_HAS(e, "op 'noinfer' has no infer function");
  stoke_err_free(e);
  op.infer = same_infer, op.n_attrs = 1;
  e = add_op_plugin(r, &op);
  EXPECT_HAS(e, "op 'noinfer' has no attrs (n_attrs > 0) function");
  stoke_err_free(e);
  stoke_source_v1 src = {STOKE_ABI(stoke_source_v1), .name = "empty"};
  e = add_parts_plugin(r, &src, NULL);
  EXPECT_CODE(e, STOKE_E_INVALID);
  EXPECT_HAS(e, "parts.so: source 'empty' has no open function");
  stoke_err_free(e);
  stoke_model_v1 m = {STOKE_ABI(stoke_model_v1), .name = "nobuild"};
  e = add_parts_plugin(r, NULL, &m);
  EXPECT_HAS(e, "model 'nobuild' has no build function");
  stoke_err_free(e);
  m.name = "tiny net", m.build = no_build;
  e = add_parts_plugin(r, NULL, &m);
  EXPECT_CODE(e, STOKE_E_INVALID);
  EXPECT_HAS(e, "model 'tiny net': a name is letters, digits, '_', '.' and '-' only");
  stoke_err_free(e);
  m.name = "tiny_net-2.0";
  EXPECT_OK(add_parts_plugin(r, NULL, &m));
  stoke_registry_free(r);
}

/* Fusion patterns (ABI 3): the core's own are registered in the table a
 * plugin adds to; a pattern needs its three ops' names, and a name taken
 * is a duplicate. */
static const stoke_fusion_v1 *fusion_to_add;
static stoke_err *reg_fusion(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  return r->add_fusion(r->self, fusion_to_add);
}

static stoke_err *add_fusion_plugin(stoke_registry *r, const stoke_fusion_v1 *f) {
  static const stoke_plugin_v1 p = {STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "fusions", "", reg_fusion};
  fusion_to_add = f;
  return stoke_registry_add_plugin(r, &p, "fusions.so");
}

static void test_fusion_patterns(void **state) {
  stoke_registry *r = new_registry();
  char names[512];
  stoke_registry_names(r, "fusion", names, sizeof names);
  assert_string_equal(names, "linear_relu, bn_relu, bn_add_relu");
  stoke_fusion_v1 f = {STOKE_ABI(stoke_fusion_v1), "linear_leaky", "", "linear", NULL, "linear_leaky", 0, 0};
  stoke_err *e = add_fusion_plugin(r, &f);
  EXPECT_CODE(e, STOKE_E_INVALID);
  EXPECT_HAS(e, "fusion pattern 'linear_leaky' needs the head, tail and fused ops' names");
  stoke_err_free(e);
  f.tail = "leaky_relu";
  EXPECT_OK(add_fusion_plugin(r, &f));
  f.name = "bn_relu";
  e = add_fusion_plugin(r, &f);
  EXPECT_CODE(e, STOKE_E_DUPLICATE);
  stoke_err_free(e);
  stoke_registry_names(r, "fusion", names, sizeof names);
  assert_string_equal(names, "linear_relu, bn_relu, bn_add_relu, linear_leaky");
  stoke_registry_free(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_good_loads_by_name),
      cmocka_unit_test(test_good_loads_by_path),
      cmocka_unit_test(test_two_registries),
      cmocka_unit_test(test_same_file_two_spellings),
      cmocka_unit_test(test_missing_plugin),
      cmocka_unit_test(test_missing_symbol),
      cmocka_unit_test(test_abi_version_mismatch),
      cmocka_unit_test(test_struct_size_mismatch),
      cmocka_unit_test(test_not_a_shared_object),
      cmocka_unit_test(test_duplicate_of_builtin),
      cmocka_unit_test(test_duplicate_between_plugins),
      cmocka_unit_test(test_failed_register_rolls_back),
      cmocka_unit_test(test_plugin_path_env),
      cmocka_unit_test(test_op_backward_declarations),
      cmocka_unit_test(test_fusion_patterns),
      cmocka_unit_test(test_required_callbacks_and_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
