/* tests/e2e/robust_test.c: nothing lost, nothing silently wrong (issue 19):
 * signals during the final save and in the middle of a long step, errors
 * after training started (the weights are saved first), a full disk and a
 * file-size limit, crafted checkpoint metadata, a FIFO as run.resume, and
 * evaluations with unreadable files or more than 4096 classes; bit flips
 * anywhere in a checkpoint, stale temporary files and another run's
 * checkpoint in out_dir (issue 15). */
#define _GNU_SOURCE /* memmem */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/common/ckpt_craft.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <turbojpeg.h>

#include "stoke/checkpoint.h"
#include "stoke/core.h"
#include "stoke/run.h"

static const char *dirs[] = {"backends/cpu", "sources/synthetic", "sources/jpeg", "models/mlp", "models/resnet"};
static char tmp[512];

static const char *base_ini =
    "[run]\n"
    "backends = cpu\n"
    "steps = 20\n"
    "seed = 5\n"
    "log_every = 5\n"
    "progress = off\n"
    "\n"
    "[data]\n"
    "source = synthetic\n"
    "shape = 32\n"
    "classes = 4\n"
    "length = 4096\n"
    "batch_size = 32\n"
    "\n"
    "[model]\n"
    "name = mlp\n"
    "hidden = 32\n"
    "\n"
    "[optimizer]\n"
    "name = sgd\n"
    "lr = 0.05\n";

/* ------------------------------------------------------------ helpers */

static const char *at_tmp(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", tmp, name);
  return buf;
}

/* The INI the runs read: base_ini, or a test's own while it sets it. */
static const char *ini_text;

/* The teardown of a test that sets ini_text: base_ini again, also after a failure. */
static int reset_ini(void **state) {
  ini_text = NULL;
  return 0;
}

static const char *ini_path(void) {
  static char path[600];
  at_tmp(path, sizeof path, "robust.ini");
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(ini_text ? ini_text : base_ini, f);
  fclose(f);
  return path;
}

/* A run in this process, results in <tmp>/<out>; `over` ends with NULL. */
static stoke_err *run_in(const char *out, stoke_summary *s, const char *const *over) {
  const char *all[32];
  char out_dir[700];
  snprintf(out_dir, sizeof out_dir, "run.out_dir=%s/%s", tmp, out);
  int n = 0;
  all[n++] = out_dir;
  for (int i = 0; over && over[i] && n < 32; i++) all[n++] = over[i];
  stoke_run_opts o = {.ini_path = ini_path(), .overrides = all, .n_overrides = n, .plugin_dirs = dirs,
                      .n_plugin_dirs = (int)(sizeof dirs / sizeof *dirs), .quiet = 1};
  return stoke_train(&o, s);
}
#define OVER(...) ((const char *const[]){__VA_ARGS__, NULL})

static void expect_err(stoke_err *e, const char *const *subs) {
  if (!e) fail_msg("the run succeeded; expected an error");
  print_message("%s\n", e->msg);
  for (int i = 0; subs[i]; i++)
    if (!strstr(e->msg, subs[i])) fail_msg("the error lacks \"%s\"", subs[i]);
  stoke_err_free(e);
}
#define EXPECT_RUN_ERR(e, ...) expect_err((e), (const char *const[]){__VA_ARGS__, NULL})

/* `tool` (tools/train: with the INI file and run.out_dir=<tmp>/<out>) as a
 * child, output to <tmp>/<out>.log, under the limit `resource` = `limit`
 * (0: none). `args` ends with NULL. */
static pid_t spawn_limited(const char *tool, const char *out, int resource, rlim_t limit, const char *const *args) {
  char log[700], out_dir[700];
  snprintf(log, sizeof log, "%s/%s.log", tmp, out);
  snprintf(out_dir, sizeof out_dir, "run.out_dir=%s/%s", tmp, out);
  int train = !strcmp(tool, "tools/train");
  const char *argv[40] = {tool, ini_path(), train ? out_dir : NULL};
  int n = train ? 3 : 2;
  for (int i = 0; args[i] && n < 39; i++) argv[n++] = args[i];
  argv[n] = NULL;
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (limit) {
      struct rlimit r = {limit, limit};
      setrlimit(resource, &r);
    }
    if (!freopen(log, "w", stdout) || dup2(1, 2) < 0) _exit(126);
    execv(tool, (char *const *)argv);
    _exit(127);
  }
  return pid;
}

static pid_t spawn_train(const char *out, rlim_t fsize, const char *const *args) {
  return spawn_limited("tools/train", out, RLIMIT_FSIZE, fsize, args);
}

/* The child's wait status; killed and failed after `secs`. */
static int wait_child(pid_t pid, double secs) {
  for (double t = 0; t < secs; t += 0.01) {
    int status;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  fail_msg("tools/train did not finish within %.0f s", secs);
  return -1;
}

static char *slurp(const char *path) {
  static char text[1 << 16];
  FILE *f = fopen(path, "r");
  text[0] = 0;
  if (!f) return text;
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = 0;
  fclose(f);
  return text;
}

static char *child_log(const char *out) {
  char log[700];
  snprintf(log, sizeof log, "%s/%s.log", tmp, out);
  return slurp(log);
}

static void expect_exit(int status, int code, const char *out) {
  if (!WIFEXITED(status) || WEXITSTATUS(status) != code)
    fail_msg("tools/train %s %d, expected exit %d; its output:\n%s", WIFSIGNALED(status) ? "died by signal" : "exited",
             WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), code, child_log(out));
}

/* The step a checkpoint was saved at (-1: no readable checkpoint). */
static int64_t ckpt_step(const char *out) {
  char path[800];
  snprintf(path, sizeof path, "%s/%s/checkpoint.safetensors", tmp, out);
  stoke_ckpt_meta m;
  stoke_err *e = stoke_checkpoint_read_meta(path, &m);
  if (e) {
    print_message("%s\n", e->msg);
    stoke_err_free(e);
    return -1;
  }
  return m.step;
}

/* Files in <tmp>/<out> whose name starts with `prefix`. */
static int count_files(const char *out, const char *prefix) {
  char path[700];
  snprintf(path, sizeof path, "%s/%s", tmp, out);
  DIR *d = opendir(path);
  if (!d) return 0;
  int n = 0;
  for (struct dirent *de; (de = readdir(d));) n += !strncmp(de->d_name, prefix, strlen(prefix));
  closedir(d);
  return n;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Waits (at most `secs`) until <tmp>/<out>/<name> exists and is not empty. */
static void wait_for_file(const char *out, const char *name, double secs) {
  char path[800];
  snprintf(path, sizeof path, "%s/%s/%s", tmp, out, name);
  struct stat st;
  for (double t = 0; t < secs; t += 0.01) {
    if (!stat(path, &st) && st.st_size > 0) return;
    usleep(10000);
  }
  fail_msg("%s did not appear within %.0f s", path, secs);
}

/* Waits until the child's output holds `text` (its signal handler wrote it). */
static void wait_for_output(const char *out, const char *text) {
  for (int i = 0; i < 200000 && !strstr(child_log(out), text); i++) usleep(100);
}

/* Sends `sig` `times` times to the child as soon as it creates its
 * checkpoint's temporary file for the `nth` time (inotify), i.e. in the
 * middle of that save; after each, waits until the child said it got it
 * (signals sent at once would merge into one). */
static void signal_during_save(pid_t pid, const char *out, int nth, int sig, int times) {
  char dir[700];
  snprintf(dir, sizeof dir, "%s/%s", tmp, out);
  mkdir(dir, 0755);
  int fd = inotify_init();
  assert_true(fd >= 0);
  assert_true(inotify_add_watch(fd, dir, IN_CREATE) >= 0);
  char buf[4096] __attribute__((aligned(8)));
  for (int found = 0; found < nth;) {
    ssize_t n = read(fd, buf, sizeof buf);
    assert_true(n > 0);
    for (char *p = buf; p < buf + n;) {
      struct inotify_event *ev = (struct inotify_event *)p;
      if (ev->len && !strncmp(ev->name, "checkpoint.safetensors.tmp.", 27)) found++;
      p += sizeof *ev + ev->len;
    }
  }
  static const char *said[] = {"stoke: stopping at the next", "stoke: still stopping"};
  for (int i = 0; i < times; i++) {
    kill(pid, sig);
    if (i < times - 1) wait_for_output(out, said[i]);
  }
  close(fd);
}

/* ------------------------------------------------------ signals (1, 12) */

/* A checkpoint of ~50 MB: its save takes long enough to be hit. */
#define BIG_MODEL "data.shape=1024", "model.hidden=2048,2048", "data.batch_size=8"

/* SIGTERM while the final checkpoint is being written: the save finishes,
 * the run exits 0 saying so, and no temporary file is left. */
static void test_sigterm_during_final_save(void **state) {
  pid_t pid = spawn_train("final_save", 0, OVER(BIG_MODEL, "run.steps=3", "run.checkpoint_every=0"));
  signal_during_save(pid, "final_save", 1, SIGTERM, 1);
  expect_exit(wait_child(pid, 120), 0, "final_save");
  assert_int_equal(ckpt_step("final_save"), 3);
  assert_int_equal(count_files("final_save", "checkpoint.safetensors.tmp"), 0);
  assert_non_null(strstr(child_log("final_save"), "stopped by a signal"));
}

/* A third signal ends the process at once, even mid-save; the previous
 * checkpoint (written atomically) stays whole. */
static void test_third_signal_quits(void **state) {
  pid_t pid = spawn_train("third", 0, OVER(BIG_MODEL, "run.steps=3", "run.checkpoint_every=1"));
  /* the first save (step 1) completes; three Ctrl-C during the second */
  signal_during_save(pid, "third", 2, SIGINT, 3);
  int status = wait_child(pid, 60);
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGINT)
    fail_msg("expected death by SIGINT, got status %d:\n%s", status, child_log("third"));
  assert_int_equal(ckpt_step("third"), 1);
}

/* Ctrl-C in the middle of a step of 20000 micro-batches: answered at the
 * next micro-batch, not at the end of the step; the checkpoint holds the
 * last whole step (the partial one is dropped, a resume redoes it). */
static void test_ctrl_c_mid_step(void **state) {
  pid_t pid = spawn_train("midstep", 0,
                          OVER("run.accumulate=20000", "data.batch_size=1", "run.steps=4", "run.log_every=1"));
  wait_for_file("midstep", "metrics.jsonl", 300); /* step 1 is done */
  double t0 = now_s();
  kill(pid, SIGINT);
  expect_exit(wait_child(pid, 120), 0, "midstep");
  double secs = now_s() - t0;
  print_message("stopped %.2f s after Ctrl-C\n", secs);
  assert_true(secs < 10);
  assert_int_equal(ckpt_step("midstep"), 1);
  assert_non_null(strstr(child_log("midstep"), "stopped by a signal after step 1"));
}

/* The running statistics in <out_b>'s checkpoint are those in <out_a>'s (a
 * run that stopped after `step`), bit for bit: at least the 40 tensors of
 * the tests' small ResNet. */
static void same_running_stats(const char *out_a, const char *out_b, int step) {
  char a[800], b[800];
  snprintf(a, sizeof a, "%s/%s/checkpoint.safetensors", tmp, out_a);
  snprintf(b, sizeof b, "%s/%s/checkpoint.safetensors", tmp, out_b);
  stoke_st_file fa, fb;
  stoke_err *re = stoke_st_read(a, &fa);
  if (!re) re = stoke_st_read(b, &fb);
  if (re) fail_msg("%s", re->msg);
  int stats = 0;
  for (int i = 0; i < fa.n_tensors; i++) {
    const stoke_st_tensor *ta = &fa.tensors[i];
    if (!strstr(ta->name, ".running_")) continue;
    const stoke_st_tensor *tb = stoke_st_find(&fb, ta->name);
    assert_non_null(tb);
    assert_int_equal(ta->end - ta->begin, tb->end - tb->begin);
    if (memcmp(fa.data + ta->begin, fb.data + tb->begin, ta->end - ta->begin))
      fail_msg("%s after the dropped step is not step %d's: the dropped micro-batches moved it", ta->name, step);
    stats++;
  }
  print_message("%d running statistics tensors equal to those of a run stopped after step %d\n", stats, step);
  assert_true(stats >= 40);
  stoke_st_free(&fa);
  stoke_st_free(&fb);
}

/* The same with batch norms: the dropped step's micro-batches have moved
 * the running statistics already, so the run puts back those of the step's
 * start before it saves (a resume redoes the step). The checkpoint of the
 * interrupted run must hold the statistics of a run that stopped after
 * step 1 on its own, bit for bit. */
static void test_ctrl_c_mid_step_keeps_statistics(void **state) {
  ini_text = "[run]\nbackends = cpu\nseed = 5\nprogress = off\nlog_every = 1\n"
             "[data]\nsource = synthetic\nshape = 3,8,8\nclasses = 4\nlength = 4096\nbatch_size = 2\n"
             "[model]\nname = resnet\ndepth = 18\nstem = cifar\nwidth = 2\n"
             "[optimizer]\nname = sgd\nlr = 0.05\n";
  stoke_summary s;
  stoke_err *e = run_in("bn_one", &s, OVER("run.accumulate=4000", "run.steps=1"));
  if (e) fail_msg("%s", e->msg);
  pid_t pid = spawn_train("bn_mid", 0, OVER("run.accumulate=4000", "run.steps=4"));
  wait_for_file("bn_mid", "metrics.jsonl", 600); /* step 1 is done */
  usleep(200000);                                 /* into step 2's micro-batches */
  kill(pid, SIGINT);
  expect_exit(wait_child(pid, 300), 0, "bn_mid");
  ini_text = NULL;
  assert_int_equal(ckpt_step("bn_mid"), 1);
  same_running_stats("bn_one", "bn_mid", 1);
}

/* ---------------------------------------------- errors save first (2, 10) */

static void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  if (n) assert_int_equal(fwrite(data, 1, n, f), n);
  fclose(f);
}

/* An 8 x 8 JPEG at `path`, its pixels drawn from `salt`. */
static void write_jpeg(const char *path, int salt) {
  uint8_t px[8 * 8 * 3];
  for (int k = 0; k < (int)sizeof px; k++) px[k] = (uint8_t)(k * 7 + salt);
  tjhandle t = tjInitCompress();
  unsigned char *jpg = NULL;
  unsigned long jn = 0;
  assert_int_equal(tjCompress2(t, px, 8, 0, 8, TJPF_RGB, &jpg, &jn, TJSAMP_444, 90, 0), 0);
  write_file(path, jpg, jn);
  tjFree(jpg);
  tjDestroy(t);
}

/* An image folder of 2 classes, each holding `bad` files that are not JPEGs
 * and `good` 8 x 8 JPEGs. */
static void image_folder(const char *name, int good, int bad) {
  char p[800];
  at_tmp(p, sizeof p, name);
  mkdir(p, 0755);
  for (int c = 0; c < 2; c++) {
    snprintf(p, sizeof p, "%s/%s/c%d", tmp, name, c);
    mkdir(p, 0755);
    for (int i = 0; i < bad; i++) {
      snprintf(p, sizeof p, "%s/%s/c%d/bad%d.jpg", tmp, name, c, i);
      write_file(p, "not a JPEG at all", 17);
    }
    for (int i = 0; i < good; i++) {
      snprintf(p, sizeof p, "%s/%s/c%d/good%d.jpg", tmp, name, c, i);
      write_jpeg(p, i * 31 + c * 101);
    }
  }
}

/* Training data and held-out JPEGs of the same shape (3 x 8 x 8). */
#define EVAL_JPEG(root) "data.shape=3,8,8", "data.classes=2", "eval_data.source=jpeg", "eval_data.size=8", \
                        "eval_data.train=false", "eval_data.resize=8", "eval_data.batch_size=4", root

/* An evaluation during training whose files are all unreadable: the run
 * fails, but saves the weights first and says where. */
static void test_eval_error_saves_first(void **state) {
  image_folder("allbad", 0, 3);
  char root[800];
  snprintf(root, sizeof root, "eval_data.root=%s/allbad", tmp);
  stoke_summary s;
  /* 320 samples of 32: an epoch is 10 steps, evaluated at step 10 */
  EXPECT_RUN_ERR(run_in("evalbad", &s, OVER(EVAL_JPEG(root), "data.length=320", "run.eval_every=1")),
                 "no sample of [eval_data] could be read", "the weights after step 10 were saved first",
                 "evalbad/checkpoint.safetensors");
  assert_int_equal(ckpt_step("evalbad"), 10);
}

/* Unreadable evaluation files are skipped, never replaced by others: 11
 * readable of 16 scores 11 samples. */
static void test_eval_skips_bad(void **state) {
  char p[800];
  image_folder("mixed", 6, 2); /* 12 good, 4 bad */
  snprintf(p, sizeof p, "%s/mixed/c1/good5.jpg", tmp);
  write_file(p, "truncated", 9); /* 11 good, 5 bad */
  char root[800];
  snprintf(root, sizeof root, "eval_data.root=%s/mixed", tmp);
  stoke_summary s;
  stoke_err *e = run_in("evalmixed", &s, OVER(EVAL_JPEG(root), "run.steps=5"));
  if (e) fail_msg("%s", e->msg);
  print_message("eval over %lld samples: accuracy %.4f\n", (long long)s.eval_samples, s.eval_accuracy);
  assert_int_equal(s.eval_samples, 11);
}

/* A data error in the middle of an accumulated step: samples 0-9 are
 * JPEGs, 10-39 are not (in order: shuffle off), so the loader gives up in
 * micro-batch 2 of step 3 (batches of 2, 2 a step). The step is dropped,
 * and the checkpoint saved on the way out must hold the running statistics
 * of a run that stopped after step 2, bit for bit: micro-batch 1 of step 3
 * had moved them (only a signal put them back). */
static void test_data_error_mid_step_keeps_statistics(void **state) {
  char p[800];
  for (int c = 0; c < 2; c++) {
    snprintf(p, sizeof p, "%s/goodbad/c%d", tmp, c);
    mkdir(at_tmp(p, sizeof p, "goodbad"), 0755);
    snprintf(p, sizeof p, "%s/goodbad/c%d", tmp, c);
    mkdir(p, 0755);
  }
  for (int i = 0; i < 10; i++) {
    snprintf(p, sizeof p, "%s/goodbad/c0/a%02d.jpg", tmp, i);
    write_jpeg(p, i * 37);
  }
  for (int i = 0; i < 30; i++) {
    snprintf(p, sizeof p, "%s/goodbad/c0/b%02d.jpg", tmp, i);
    write_file(p, "not a JPEG at all", 17);
  }
  snprintf(p, sizeof p, "%s/goodbad/c1/a00.jpg", tmp);
  write_jpeg(p, 5);
  char root[800];
  snprintf(root, sizeof root, "data.root=%s/goodbad", tmp);
  ini_text = "[run]\nbackends = cpu\nseed = 5\nprogress = off\nlog_every = 1\naccumulate = 2\n"
             "[data]\nsource = jpeg\nsize = 8\ntrain = false\nresize = 8\n"
             "batch_size = 2\nshuffle = false\nworkers = 1\n"
             "[model]\nname = resnet\ndepth = 18\nstem = cifar\nwidth = 2\n"
             "[optimizer]\nname = sgd\nlr = 0.05\n";
  stoke_summary s;
  stoke_err *e = run_in("de_two", &s, OVER(root, "run.steps=2"));
  if (e) fail_msg("%s", e->msg);
  EXPECT_RUN_ERR(run_in("de_mid", &s, OVER(root, "run.steps=4")), "while step 3", "after step 2 were saved");
  ini_text = NULL;
  assert_int_equal(ckpt_step("de_mid"), 2);
  same_running_stats("de_two", "de_mid", 2);
}

/* More than 4096 classes: the evaluation scores every class. */
static void test_eval_many_classes(void **state) {
  stoke_summary s;
  stoke_err *e = run_in("classes", &s,
                        OVER("data.classes=5000", "run.steps=3", "eval_data.source=synthetic", "eval_data.shape=32",
                             "eval_data.classes=5000", "eval_data.length=64", "eval_data.offset=100000"));
  if (e) fail_msg("%s", e->msg);
  print_message("5000 classes: eval loss %.4f (ln 5000 = %.4f), accuracy %.4f\n", s.eval_loss, log(5000.0),
                s.eval_accuracy);
  assert_int_equal(s.eval_samples, 64);
  assert_true(isfinite(s.eval_loss) && fabs(s.eval_loss - log(5000.0)) < 1.5);
}

/* Evaluation data the trained model cannot take: said by section, not as
 * two plans that differ. */
static void test_eval_must_match(void **state) {
  stoke_summary s;
  EXPECT_RUN_ERR(run_in("mismatch", &s, OVER("eval_data.source=synthetic", "eval_data.shape=32")),
                 "[eval_data] has 10 classes and [data] 4");
  EXPECT_RUN_ERR(run_in("mismatch", &s, OVER("eval_data.source=synthetic", "eval_data.shape=33",
                                             "eval_data.classes=4")),
                 "[eval_data] samples are [33] and [data] samples [32]");
}

/* ------------------------------------------------------------ disk (3) */

/* A checkpoint that cannot fit under the file-size limit is refused
 * before any training. */
static void test_file_limit_refused_at_start(void **state) {
  pid_t pid = spawn_train("fsize", 100000, OVER("model.hidden=256,256"));
  expect_exit(wait_child(pid, 120), 1, "fsize");
  char *log = child_log("fsize");
  if (!strstr(log, "file-size limit") || !strstr(log, "checkpoint")) fail_msg("%s", log);
  char path[800];
  struct stat st;
  snprintf(path, sizeof path, "%s/fsize/metrics.jsonl", tmp);
  /* not one step trained: no step line; the file, when there, holds the error line alone */
  if (!stat(path, &st) && st.st_size) {
    FILE *f = fopen(path, "r");
    char line[4096] = "";
    assert_non_null(f);
    while (fgets(line, sizeof line, f))
      if (strncmp(line, "{\"summary\": \"error\",", strlen("{\"summary\": \"error\",")))
        fail_msg("metrics.jsonl has a line other than the error's: %s", line);
    fclose(f);
  }
}

/* metrics.jsonl that cannot grow: the run fails naming it (never "done"
 * with a cut file), after saving the weights. */
static void test_metrics_write_fails(void **state) {
  pid_t pid = spawn_train("metrics", 40000,
                          OVER("data.shape=8", "model.hidden=4", "run.steps=400", "run.log_every=1"));
  expect_exit(wait_child(pid, 120), 1, "metrics");
  char *log = child_log("metrics");
  if (!strstr(log, "metrics.jsonl' failed") || !strstr(log, "were saved first")) fail_msg("%s", log);
  assert_true(ckpt_step("metrics") > 0);
}

/* A real full disk (a small tmpfs; needs root, else skipped): with no
 * byte free config.ini already fails; with a little free, the checkpoint's
 * size is checked before training. */
/* test_full_disk's teardown: the tmpfs goes even when the test failed
 * before its own umount (left mounted in the test's folder, it stops
 * bazel's next build: "Source forest creation failed"). */
static int unmount_tiny(void **state) {
  char mnt[700];
  umount2(at_tmp(mnt, sizeof mnt, "tiny"), MNT_DETACH);
  return 0;
}

static void test_full_disk(void **state) {
  char mnt[700];
  at_tmp(mnt, sizeof mnt, "tiny");
  mkdir(mnt, 0755);
  if (mount("tmpfs", mnt, "tmpfs", 0, "size=512k")) {
    print_message("cannot mount a tmpfs (%s): the full-disk case needs root; skipped\n", strerror(errno));
    skip();
  }
  char fill[800];
  snprintf(fill, sizeof fill, "%s/filler", mnt);
  FILE *f = fopen(fill, "w");
  static char block[4096];
  while (f && fwrite(block, 1, sizeof block, f) == sizeof block && !fflush(f)) {
  }
  if (f) fclose(f);
  stoke_summary s;
  EXPECT_RUN_ERR(run_in("tiny/full", &s, NULL), "config.ini", "No space left on device");
  /* about 200 KB free: the 600 KB checkpoint does not fit */
  truncate(fill, 512 * 1024 - 200 * 1024);
  EXPECT_RUN_ERR(run_in("tiny/room", &s, OVER("model.hidden=256,256")), "[run] out_dir", "MiB free",
                 "MiB checkpoint");
  assert_int_equal(umount(mnt), 0);
  /* room for the logs and one copy of the checkpoint, not two: a run that saves every 5 steps of 20 is refused
   * (from its second save on, the new file sits beside the last until it replaces it); one that saves at its
   * end only runs */
  if (mount("tmpfs", mnt, "tmpfs", 0, "size=4m")) fail_msg("remounting a tmpfs: %s", strerror(errno));
  f = fopen(fill, "w");
  if (!f || ftruncate(fileno(f), 4 * 1024 * 1024 - (1024 + 1000) * 1024)) fail_msg("filling the tmpfs");
  for (long i = 0; i < 4 * 1024 - 1024 - 1000; i++) fwrite(block, 1, 1024, f);
  fclose(f);
  EXPECT_RUN_ERR(run_in("tiny/two", &s, OVER("model.hidden=256,256", "run.checkpoint_every=5")), "MiB free",
                 "two copies");
  stoke_err *e = run_in("tiny/one", &s, OVER("model.hidden=256,256"));
  if (e) fail_msg("a run saving once did not fit: %s", e->msg);
  assert_int_equal(umount(mnt), 0);
}

/* ---------------------------------------------------- memory limit (13) */

/* Under an address-space limit OpenBLAS retried its GEMM buffer forever at
 * 100% CPU (train) or hung at exit (bench_loader). Now: too little is a
 * clean error before training, enough runs (one buffer, serial OpenBLAS).
 * Not under ASan, whose shadow memory needs no address-space limit. */
static void test_memory_limit(void **state) {
#if defined(__SANITIZE_ADDRESS__)
  skip();
#endif
  pid_t pid = spawn_limited("tools/train", "vmem_low", RLIMIT_AS, (rlim_t)120000 << 10, OVER("run.steps=5"));
  expect_exit(wait_child(pid, 60), 1, "vmem_low");
  if (!strstr(child_log("vmem_low"), "OpenBLAS needs")) fail_msg("%s", child_log("vmem_low"));
  pid = spawn_limited("tools/train", "vmem_ok", RLIMIT_AS, (rlim_t)250000 << 10, OVER("run.steps=5"));
  expect_exit(wait_child(pid, 60), 0, "vmem_ok");
  pid = spawn_limited("tools/bench_loader", "vmem_bl", RLIMIT_AS, (rlim_t)200000 << 10, OVER("--workers", "1"));
  expect_exit(wait_child(pid, 60), 0, "vmem_bl");
}

/* --------------------------------------------------- checkpoints (4, 5, 14) */

/* Crafted or damaged run state is refused, naming the field; nothing is
 * trusted into an overflow. */
static void test_crafted_metadata(void **state) {
  stoke_summary s;
  stoke_err *e = run_in("meta", &s, OVER("run.steps=4", "run.accumulate=2", "data.batch_size=16"));
  if (e) fail_msg("%s", e->msg);
  char good[800], bad[800], resume[900];
  snprintf(good, sizeof good, "%s/meta/checkpoint.safetensors", tmp);
  at_tmp(bad, sizeof bad, "crafted.safetensors");
  snprintf(resume, sizeof resume, "run.resume=%s", bad);
  static const struct {
    const char *from, *to, *field;
  } cases[] = {
      {"\"step\":\"4\"", "\"step\":\"-5\"", "\"step\""},
      {"\"accumulate\":\"2\"", "\"accumulate\":\"-1\"", "\"accumulate\""},
      {"\"step\":\"4\"", "\"step\":\"9223372036854775807\"", "\"step\""},
      {"\"world\":\"1\"", "\"world\":\"-3\"", "\"world\""},
      {"\"epoch\":\"0\"", "\"epoch\":\"99999999999\"", "\"epoch\""},
      {"\"batch\":\"16\"", "\"batch\":\"16x\"", "\"batch\""},
      {"\"seed\":\"5\"", "\"seed\":\"\"", "\"seed\""},
      /* (an fp32 run's file has no loss_scale: one is put in) */
      {"\"skipped_steps\":\"0\"", "\"skipped_steps\":\"0\",\"loss_scale\":\"nan\"", "\"loss_scale\""},
      /* any optimizer's name may be there (a plugin's too): not a name */
      {"\"optimizer\":\"sgd\"", "\"optimizer\":\"sgd; momentum\"", "\"optimizer\""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    /* edited with the checksum kept: the checksum catches it */
    craft(good, bad, cases[i].from, cases[i].to, 0);
    EXPECT_RUN_ERR(run_in("meta_r", &s, OVER("run.steps=8", "run.accumulate=2", "data.batch_size=16", resume)),
                   "crafted.safetensors", "does not match its checksum", "[run] resume");
    /* and without it (a crafted file): the field is named */
    craft(good, bad, cases[i].from, cases[i].to, 1);
    EXPECT_RUN_ERR(run_in("meta_r", &s, OVER("run.steps=8", "run.accumulate=2", "data.batch_size=16", resume)),
                   "crafted.safetensors", cases[i].field, "[run] resume");
  }
  /* another version: named (formatted from the file before it is freed) */
  craft(good, bad, "\"stoke_checkpoint_version\":\"1\"", "\"stoke_checkpoint_version\":\"2\"", 1);
  EXPECT_RUN_ERR(run_in("meta_r", &s, OVER(resume)), "is a stoke checkpoint of version 2; this stoke reads version 1");
  /* no version at all (PyTorch's save_file): said what the file is and what a resume needs */
  craft(good, bad, "\"stoke_checkpoint_version\":\"1\"", "\"stoke_checkpoint_versioX\":\"1\"", 1);
  EXPECT_RUN_ERR(run_in("meta_r", &s, OVER(resume)), "is a safetensors file but not a stoke checkpoint",
                 "a run resumes only from a checkpoint a stoke run saved");
  /* an in-range damaged step: the checksum catches it */
  craft(good, bad, "\"step\":\"4\"", "\"step\":\"3\"", 0);
  EXPECT_RUN_ERR(run_in("meta_r", &s, OVER(resume)), "step 3", "does not match its checksum");
  /* a file without the checksum but otherwise fine still resumes */
  craft(good, bad, NULL, NULL, 1);
  e = run_in("meta_r", &s, OVER("run.steps=8", "run.accumulate=2", "data.batch_size=16", resume));
  if (e) fail_msg("%s", e->msg);
  assert_int_equal(s.steps, 8);
}

/* run.resume naming a FIFO, a folder or a device: refused at once. */
static void test_resume_not_a_file(void **state) {
  char fifo[800], resume[900];
  at_tmp(fifo, sizeof fifo, "fifo.safetensors");
  unlink(fifo);
  assert_int_equal(mkfifo(fifo, 0644), 0);
  alarm(60); /* opening it for reading would block forever */
  stoke_summary s;
  snprintf(resume, sizeof resume, "run.resume=%s", fifo);
  EXPECT_RUN_ERR(run_in("fifo", &s, OVER(resume)), "fifo.safetensors", "a FIFO");
  snprintf(resume, sizeof resume, "run.resume=%s", tmp);
  EXPECT_RUN_ERR(run_in("fifo", &s, OVER(resume)), "a folder");
  EXPECT_RUN_ERR(run_in("fifo", &s, OVER("run.resume=/dev/zero")), "a device");
  alarm(0);
}

/* ------------------------------------------ corrupt checkpoints (issue 15) */

/* A flipped bit anywhere in a checkpoint: 100 random ones in the data
 * section, 100 anywhere in the file, each refused by what a resume checks
 * first (the structure, the run state's checksum, every tensor's). */
static void test_bit_flips_detected(void **state) {
  stoke_summary s;
  stoke_err *e = run_in("flips", &s, OVER("run.steps=3", "optimizer.momentum=0.9"));
  if (e) fail_msg("%s", e->msg);
  char good[800], bad[800];
  snprintf(good, sizeof good, "%s/flips/checkpoint.safetensors", tmp);
  at_tmp(bad, sizeof bad, "flipped.safetensors");
  size_t n;
  uint64_t hlen;
  unsigned char *b = read_ckpt(good, &n, &hlen);
  uint64_t r = 12345;
  int damaged_tensor = 0;
  for (int trial = 0; trial < 200; trial++) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    size_t lo = trial < 100 ? 8 + hlen : 0;
    size_t at = lo + (size_t)((r >> 20) % (n - lo));
    int bit = (int)((r >> 8) & 7);
    b[at] ^= (unsigned char)(1 << bit);
    write_file(bad, b, n);
    b[at] ^= (unsigned char)(1 << bit);
    stoke_ckpt_meta m;
    e = stoke_checkpoint_verify(bad, &m);
    if (!e) fail_msg("trial %d: bit %d of byte %zu (of %zu, header %llu) flipped, and the checkpoint verified", trial,
                     bit, at, n, (unsigned long long)hlen);
    damaged_tensor += strstr(e->msg, "is damaged: its bytes give CRC-32C") != NULL;
    stoke_err_free(e);
  }
  /* a flipped bit in each checksum's key name (found flaky above: the metadata checksum's key, damaged,
   * read as a file from before checksums) */
  for (int which = 0; which < 2; which++) {
    const char *key = which ? "\"stoke_crc32c\"" : "\"stoke_meta_crc32c\"";
    char *hdr = (char *)b + 8, *k = memmem(hdr, hlen, key, strlen(key));
    if (!k) fail_msg("no %s in the header", key);
    k[1] ^= 0x80;
    write_file(bad, b, n);
    k[1] ^= 0x80;
    stoke_ckpt_meta m;
    e = stoke_checkpoint_verify(bad, &m);
    if (!e) fail_msg("the key %s damaged, and the checkpoint verified", key);
    stoke_err_free(e);
  }
  print_message("200 of 200 flips refused; %d named the damaged tensor\n", damaged_tensor);
  assert_true(damaged_tensor >= 100); /* every flip in the data names its tensor */
  /* and a resume says which tensor */
  b[8 + hlen + (n - 8 - hlen) / 2] ^= 4;
  write_file(bad, b, n);
  char resume[900];
  snprintf(resume, sizeof resume, "run.resume=%s", bad);
  EXPECT_RUN_ERR(run_in("flips_r", &s, OVER(resume)), "flipped.safetensors", "is damaged", "tensor '",
                 "[run] resume");
  free(b);
}

/* Temporary files of this machine's processes killed mid-save are removed
 * at the next start in that folder (a live process's is kept, and so is
 * another machine's, whose PIDs mean nothing here); another run's
 * checkpoint is never replaced silently. */
static void test_out_dir_claimed(void **state) {
  stoke_summary s;
  char dir[800], ckpt[900], path[1000], other[1000], live[1000];
  at_tmp(dir, sizeof dir, "claimed");
  mkdir(dir, 0755);
  snprintf(ckpt, sizeof ckpt, "%s/checkpoint.safetensors", dir);
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, NULL, 0);
  stoke_checkpoint_tmp_path(ckpt, path, sizeof path); /* this process's name, the dead child's PID */
  snprintf(strrchr(path, '.') + 1, 16, "%d", (int)dead);
  write_file(path, "half a checkpoint", 17);
  snprintf(path, sizeof path, "%s.tmp.%d", ckpt, (int)dead); /* as stoke named them before the host */
  write_file(path, "half a checkpoint", 17);
  snprintf(other, sizeof other, "%s.tmp.another-machine.%d", ckpt, (int)dead);
  write_file(other, "another machine's", 17);
  stoke_checkpoint_tmp_path(ckpt, live, sizeof live);
  snprintf(strrchr(live, '.') + 1, 16, "%d", (int)getppid());
  write_file(live, "being written", 13);
  stoke_err *e = run_in("claimed", &s, OVER("run.steps=2"));
  if (e) fail_msg("%s", e->msg);
  assert_int_equal(count_files("claimed", "checkpoint.safetensors.tmp."), 2); /* the live one, the other machine's */
  struct stat st;
  assert_int_equal(stat(other, &st), 0);
  assert_int_equal(stat(live, &st), 0);
  unlink(live);
  unlink(other);
  /* a second run there: refused, saying what to do */
  EXPECT_RUN_ERR(run_in("claimed", &s, OVER("run.steps=2")), "holds another run's checkpoint", "step 2",
                 "run.resume=", "run.overwrite=true");
  assert_int_equal(ckpt_step("claimed"), 2);
  /* continuing it, or starting over on purpose, is allowed */
  char resume[900];
  snprintf(resume, sizeof resume, "run.resume=%s/checkpoint.safetensors", dir);
  e = run_in("claimed", &s, OVER("run.steps=4", resume));
  if (e) fail_msg("%s", e->msg);
  assert_int_equal(ckpt_step("claimed"), 4);
  e = run_in("claimed", &s, OVER("run.steps=1", "run.overwrite=true"));
  if (e) fail_msg("%s", e->msg);
  assert_int_equal(ckpt_step("claimed"), 1);
  /* the earlier run's checkpoint was moved aside at the start (a run stopped before its first save left it for
   * run.resume = auto to continue under the new run's records) */
  char aside[900];
  snprintf(aside, sizeof aside, "%s/checkpoint.safetensors.replaced", dir);
  stoke_ckpt_meta am;
  stoke_err *ae = stoke_checkpoint_read_meta(aside, &am);
  if (ae) fail_msg("%s", ae->msg);
  assert_int_equal(am.step, 4);
  /* log.txt: a line per run that says when and from what */
  char lp[900];
  snprintf(lp, sizeof lp, "%s/log.txt", dir);
  const char *lt = slurp(lp);
  if (!strstr(lt, "== 20") || !strstr(lt, ", resuming from ")) fail_msg("log.txt: %s", lt);
  /* without checkpoints too: the run would replace that run's metrics.jsonl, config.ini and report.html */
  EXPECT_RUN_ERR(run_in("claimed", &s, OVER("run.steps=1", "run.checkpoint=false")), "holds another run's checkpoint",
                 "and its records, which this run (checkpoint = false) would replace", "run.overwrite=true");
  assert_int_equal(ckpt_step("claimed"), 1);
  /* run.resume = auto (a preempted job's one restart command): out_dir's checkpoint (step 1) is continued to
   * step 3; in an empty out_dir the run starts at step 0 */
  e = run_in("claimed", &s, OVER("run.steps=3", "run.resume=auto"));
  if (e) fail_msg("%s", e->msg);
  assert_int_equal(ckpt_step("claimed"), 3);
  assert_int_equal(s.steps, 3);
  e = run_in("claimed_auto", &s, OVER("run.steps=2", "run.resume=auto"));
  if (e) fail_msg("%s", e->msg);
  assert_int_equal(ckpt_step("claimed_auto"), 2);
}

/* [data] mean and std against the images: a mean on the 0-255 scale (the
 * pixels are divided by 255 first) is warned about, and a list that fits
 * no channel count names the images' channels. */
static void test_mean_scale_and_channels(void **state) {
  image_folder("meanimg", 4, 0);
  char root[800], path[900];
  snprintf(root, sizeof root, "data.root=%s/meanimg", tmp);
  stoke_summary s;
#define JPEG_DATA "data.source=jpeg", root, "data.size=8", "data.resize=8", "data.batch_size=4", "run.steps=2"
  stoke_err *e = run_in("mean255", &s, OVER(JPEG_DATA, "data.mean=123.7,116.3,103.5", "data.std=58.4,57.1,57.4"));
  if (e) fail_msg("%s", e->msg);
  snprintf(path, sizeof path, "%s/mean255/log.txt", tmp);
  const char *log = slurp(path);
  if (!strstr(log, "[data] mean = 123.7, 116.3, 103.5 is above 1: mean and std are on the 0-1 scale"))
    fail_msg("not said: %s", log);
  EXPECT_RUN_ERR(run_in("mean2", &s, OVER(JPEG_DATA, "data.mean=0.5,0.5")),
                 "the images have 3 channels, and mean has 2 values, std 1: give one value for every channel, or one "
                 "per channel (3)");
#undef JPEG_DATA
}

/* A plugin op whose register() forgot `stoke_host = h;` (tests/sdk/no_host.c)
 * dies of its first stoke_host->log in its kernel: the crash note names the
 * node, op and engine, and says the NULL host table is the likely cause. */
static void test_plugin_without_host_table(void **state) {
  pid_t pid = spawn_train("no_host", 0, (const char *[]){"plugins.path=tests/sdk", "plugins.load=no_host",
                                                         "model.activation=no_host_act", NULL});
  int status = wait_child(pid, 60);
  const char *log = child_log("no_host");
  print_message("%s", strstr(log, "stoke: SIGSEGV") ? strstr(log, "stoke: SIGSEGV") : log);
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGSEGV) fail_msg("not a SIGSEGV: status %d", status);
  if (!strstr(log, "stoke: SIGSEGV in the kernel of node 'layers.1' (op 'no_host_act', engine 'cpu')") ||
      !strstr(log, "through a NULL pointer: if the plugin's register() does not keep the host table (`stoke_host = h;`"))
    fail_msg("the crash note lacks the node or the hint");
}

int main(void) {
  const char *t = getenv("TEST_TMPDIR");
  snprintf(tmp, sizeof tmp, "%s", t ? t : "/tmp");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sigterm_during_final_save),
      cmocka_unit_test(test_third_signal_quits),
      cmocka_unit_test(test_ctrl_c_mid_step),
      cmocka_unit_test_teardown(test_ctrl_c_mid_step_keeps_statistics, reset_ini),
      cmocka_unit_test(test_eval_error_saves_first),
      cmocka_unit_test(test_eval_skips_bad),
      cmocka_unit_test_teardown(test_data_error_mid_step_keeps_statistics, reset_ini),
      cmocka_unit_test(test_eval_many_classes),
      cmocka_unit_test(test_eval_must_match),
      cmocka_unit_test(test_file_limit_refused_at_start),
      cmocka_unit_test(test_metrics_write_fails),
      cmocka_unit_test_teardown(test_full_disk, unmount_tiny),
      cmocka_unit_test(test_memory_limit),
      cmocka_unit_test(test_crafted_metadata),
      cmocka_unit_test(test_resume_not_a_file),
      cmocka_unit_test(test_bit_flips_detected),
      cmocka_unit_test(test_plugin_without_host_table),
      cmocka_unit_test(test_mean_scale_and_channels),
      cmocka_unit_test(test_out_dir_claimed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
