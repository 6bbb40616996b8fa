/* tools/train: `train run.ini [section.key=value ...]` trains as the INI
 * file says; `--help-config` lists every key; `--verify FILE` checks a
 * checkpoint. main() decides the exit code; the library only returns
 * errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stoke/checkpoint.h"
#include "stoke/config.h"
#include "stoke/core.h"
#include "stoke/graph.h"
#include "stoke/run.h"
#include "stoke/run_config.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: train RUN.INI [section.key=value ...]\n"
          "       train --dry-run RUN.INI [section.key=value ...]\n"
          "                               plan only: the batch (batch_size = auto), memory and FLOPs (recompute),\n"
          "                               no training; with run.memory_gb=80 no GPU is needed\n"
          "       train --help-config [RUN.INI]  every config section and key, with defaults, and the\n"
          "                                ops with their attributes (with RUN.INI: its plugin path too)\n"
          "       train --verify FILE     check a checkpoint (structure, run state, every checksum)\n"
          "Trains the model the INI file describes; results go to runs/<name>/.\n"
          "Plugins are found in [plugins] path, STOKE_PLUGIN_PATH, and next to this binary.\n");
}

int main(int argc, char **argv) {
  /* whole lines on stdout, also into a pipe or a file (a scheduler's log, `| tee`): the config dump and the
   * progress lines no longer come out in 4 KiB blocks with stderr's error landing inside one */
  setvbuf(stdout, NULL, _IOLBF, 0);
  /* `bazel run` starts us in the runfiles tree; paths the user typed are
   * relative to where they ran bazel. */
  const char *cwd = getenv("BUILD_WORKING_DIRECTORY");
  if (cwd && chdir(cwd) != 0) {
    fprintf(stderr, "stoke: error: cannot enter %s\n", cwd);
    return 1;
  }
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!strcmp(argv[1], "--help-config")) {
    /* with an INI file: its [plugins] path too (relative to the file's folder) */
    const char *dirs[STOKE_CFG_MAX_LIST];
    static char rel[STOKE_CFG_MAX_LIST][4096];
    int n = 0;
    stoke_cfg *c = argc > 2 ? stoke_cfg_new() : NULL;
    stoke_err *e = c ? stoke_declare_core_keys(c) : NULL;
    if (!e && c) e = stoke_cfg_load_file(c, argv[2]);
    if (!e && c) e = stoke_cfg_list(c, "plugins", "path", dirs, &n);
    const char *slash = argc > 2 ? strrchr(argv[2], '/') : NULL;
    for (int i = 0; !e && i < n; i++)
      if (dirs[i][0] != '/' && slash) {
        snprintf(rel[i], sizeof rel[i], "%.*s/%s", (int)(slash - argv[2]), argv[2], dirs[i]);
        dirs[i] = rel[i];
      }
    if (!e) e = stoke_help_config(dirs, n, stdout);
    stoke_cfg_free(c);
    if (e) {
      fprintf(stderr, "stoke: error: %s\n", e->msg);
      stoke_err_free(e);
      return 1;
    }
    return 0;
  }
  if (!strcmp(argv[1], "--verify")) {
    if (argc != 3) {
      fprintf(stderr, "stoke: error: --verify takes one checkpoint file (given %d arguments)\n", argc - 2);
      usage(stderr);
      return 2;
    }
    stoke_ckpt_meta m;
    stoke_err *e = stoke_checkpoint_verify(argv[2], &m);
    if (e) {
      fprintf(stderr, "stoke: error: %s\n", e->msg);
      stoke_err_free(e);
      return 1;
    }
    printf("%s: step %lld, epoch %lld, optimizer %s; %s\n", argv[2], (long long)m.step, (long long)m.epoch,
           m.optimizer[0] ? m.optimizer : "none",
           m.meta_checked && m.data_checked ? "run state and every tensor match their checksums"
                                            : "no checksums (written by an older stoke): not verified");
    return 0;
  }
  int dry = !strcmp(argv[1], "--dry-run");
  if (dry && argc < 3) {
    usage(stderr);
    return 2;
  }
  if (argv[1 + dry][0] == '-') {
    fprintf(stderr, "stoke: error: unknown option '%s'\n", argv[1 + dry]);
    usage(stderr);
    return 2;
  }
  stoke_run_opts o = {.ini_path = argv[1 + dry], .overrides = (const char *const *)argv + 2 + dry,
                      .n_overrides = argc - 2 - dry, .dry_run = dry};
  stoke_summary s;
  stoke_crash_guard_install(); /* a crashing kernel names itself */
  stoke_err *e = stoke_train(&o, &s);
  if (e) {
    fprintf(stderr, "stoke: error: %s\n", e->msg);
    stoke_err_free(e);
    return 1;
  }
  if (dry) return 0;
  if (s.interrupted)
    printf("stoke: stopped by a signal after step %lld; checkpoint: %s (continue with run.resume=%s)\n",
           (long long)s.steps, s.checkpoint[0] ? s.checkpoint : "none", s.checkpoint);
  return 0;
}
