/* tests/sdk/load_plugin.c: loads a plugin through the core's loader, as a
 * run does, and checks what it registered or why it was refused:
 *   load_plugin NAME [KIND:PART...]   it loads, and each PART of KIND (op, backend,
 *                                     source, model, precision, comm,
 *                                     optimizer) is registered
 *   load_plugin --refused NAME TEXT...  loading fails, the message holding
 *                                     every TEXT */
#include <stdio.h>
#include <string.h>

#include "stoke/core.h"
#include "stoke/registry.h"

/* Whether `kind` lists `name` among the registry's parts. */
static int registered(const stoke_registry *r, const char *kind, const char *name) {
  char names[4096], *save = NULL;
  stoke_registry_names(r, kind, names, sizeof names);
  for (char *t = strtok_r(names, ", ", &save); t; t = strtok_r(NULL, ", ", &save))
    if (!strcmp(t, name)) return 1;
  return 0;
}

static int refused(stoke_registry *r, const char *name, char **texts, int n) {
  stoke_err *e = stoke_registry_load(r, name);
  if (!e) {
    fprintf(stderr, "FAIL: plugin %s loaded, it should have been refused\n", name);
    return 1;
  }
  int bad = 0;
  for (int i = 0; i < n; i++)
    if (!strstr(e->msg, texts[i])) {
      fprintf(stderr, "FAIL: the refusal of %s does not say \"%s\":\n%s\n", name, texts[i], e->msg);
      bad = 1;
    }
  if (!bad) printf("refused as expected: %s\n", e->msg);
  stoke_err_free(e);
  return bad;
}

static int loaded(stoke_registry *r, const char *name, char **parts, int n) {
  stoke_err *e = stoke_registry_load(r, name);
  if (e) {
    fprintf(stderr, "FAIL: %s\n", e->msg);
    stoke_err_free(e);
    return 1;
  }
  int bad = 0;
  for (int i = 0; i < n; i++) {
    char kind[32];
    const char *colon = strchr(parts[i], ':');
    if (!colon || colon - parts[i] >= (long)sizeof kind) return 2;
    snprintf(kind, sizeof kind, "%.*s", (int)(colon - parts[i]), parts[i]);
    if (!registered(r, kind, colon + 1)) {
      fprintf(stderr, "FAIL: plugin %s registered no %s '%s'\n", name, kind, colon + 1);
      bad = 1;
    }
  }
  return bad;
}

int main(int argc, char **argv) {
  int refuse = argc > 1 && !strcmp(argv[1], "--refused");
  if (argc < 2 + 2 * refuse) return 2;
  stoke_registry *r;
  stoke_err *e = stoke_registry_new(&r);
  if (e) {
    fprintf(stderr, "FAIL: %s\n", e->msg);
    stoke_err_free(e);
    return 1;
  }
  int rc = refuse ? refused(r, argv[2], argv + 3, argc - 3) : loaded(r, argv[1], argv + 2, argc - 2);
  stoke_registry_free(r);
  return rc;
}
