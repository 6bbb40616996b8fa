/* core/run_ckpt.c: the run's checkpoints: out_dir claimed (another run's
 * checkpoint kept, killed saves' leftovers removed), room for one checked
 * before any compute, a save (atomic, core/checkpoint.c), and the save on
 * every way out, errors included, saying where the weights went. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "stoke/core.h"
#include "run_state.h"

static stoke_err *save_to(run_state *s, const char *path, int64_t step, int64_t epoch) {
  if (s->rank > 0) return NULL; /* data parallel: the weights are the same everywhere */
  float amp[4] = {1, 0, 0, 0};
  int scaled = stoke_exec_read_scaler(s->train.x, amp);
  /* loss_scale 0: no scaler (the file leaves the key out); skipped steps: before the resume, and since (the
   * scaler counts from it) */
  stoke_ckpt_meta m = {.step = step, .epoch = epoch, .seed = s->rc.run.seed, .accumulate = s->rc.run.accumulate,
                       .loss_scale = scaled ? amp[0] : 0, .world = s->world, .batch = s->train.batch,
                       .skipped_steps = s->resume.skipped_steps + (int64_t)amp[3],
                       .loss_scale_good_steps = scaled ? (int64_t)amp[1] : 0};
  snprintf(m.optimizer, sizeof m.optimizer, "%s", s->rc.optimizer.name);
  STOKE_TRY(stoke_checkpoint_save(s->train.x, path, &m, s->config_text), "saving the checkpoint at step %lld",
            (long long)step);
  return NULL;
}

stoke_err *run_save(run_state *s, int64_t step, int64_t epoch) { return save_to(s, s->ckpt, step, epoch); }

static void put_best(const void *ctx, FILE *f) {
  const run_state *s = ctx;
  fprintf(f, "{\"eval_loss\": %.9g, \"step\": %lld}\n", s->best_loss, (long long)s->best_step);
}

void run_best_resumed(run_state *s) {
  if (!s->rc.run.keep_best || s->rank > 0) return;
  char json[PATH_MAX];
  snprintf(json, sizeof json, "%s/best.json", s->dir);
  char *text = NULL;
  size_t n = 0;
  stoke_err *re = stoke_read_file(json, "best.json", &text, &n);
  double l;
  long long st;
  if (!re && sscanf(text, "{\"eval_loss\": %lf, \"step\": %lld}", &l, &st) == 2 && st <= s->start_step)
    s->best_loss = l, s->best_step = st;
  stoke_err_free(re);
  free(text);
}

stoke_err *run_keep_best(run_state *s, int64_t step) {
  if (!s->rc.run.keep_best || s->rank > 0) return NULL;
  char path[PATH_MAX], json[PATH_MAX];
  snprintf(path, sizeof path, "%s/best.safetensors", s->dir);
  snprintf(json, sizeof json, "%s/best.json", s->dir);
  double loss = s->sum->eval_loss;
  if (!isfinite(loss) || (s->best_step && !(loss < s->best_loss))) return NULL;
  STOKE_PROPAGATE(save_to(s, path, step, s->epoch));
  s->best_loss = loss, s->best_step = step;
  STOKE_TRY(run_write_checked(json, put_best, s), "[run] keep_best");
  stoke_log(STOKE_LOG_INFO, "run", "[run] keep_best: evaluation loss %.4f at step %lld, the lowest so far: %s", loss,
            (long long)step, path);
  return NULL;
}

/* An error after the weights of step s->good were saved says where they are. */
stoke_err *run_note_saved(const run_state *s, stoke_err *e) {
  const stoke_summary *sum = s->sum;
  if (e && sum->checkpoint[0] && s->rank == 0)
    e = stoke_err_note(e, "the weights after step %lld were saved first: %s (continue with run.resume=%s)",
                       (long long)s->good, sum->checkpoint, sum->checkpoint);
  return e;
}

/* On the way out, after an error too: save the weights of the last whole
 * step s->good (nothing when checkpoints are off, nothing was trained
 * since the start, or s->good is -1: an error may have left the weights
 * half updated, or they diverged), then return the error, which says
 * where the weights went. */
stoke_err *run_save_on_exit(run_state *s, stoke_err *e) {
  if (!s->ckpt[0] || s->good <= s->start_step) return e;
  stoke_err *se = run_save(s, s->good, s->good_epoch);
  if (!se) snprintf(s->sum->checkpoint, sizeof s->sum->checkpoint, "%s", s->ckpt);
  if (!e) return se;
  if (se) {
    e = stoke_err_note(e, "the weights after step %lld could not be saved either: %s", (long long)s->good, se->msg);
    stoke_err_free(se);
  }
  return run_note_saved(s, e);
}

/* Before anything is written to out_dir: checkpoint files of processes
 * killed mid-save (checkpoint.safetensors.tmp.HOST.PID of this machine,
 * that PID gone) are removed (another machine's, in a shared folder, are
 * left to it), and another run's checkpoint there is kept: the
 * run is refused unless it continues that checkpoint (run.resume names
 * it) or run.overwrite = true says to start over. */
stoke_err *run_claim_out_dir(const run_state *s) {
  const stoke_cfg *c = s->cfg;
  const char *dir = s->dir, *resume = s->rc.run.resume;
  int want_ckpt = s->rc.run.checkpoint, overwrite = s->rc.run.overwrite;
  DIR *d = opendir(dir);
  for (struct dirent *de; d && (de = readdir(d));) {
    static const char tmp[] = RUN_CKPT_NAME ".tmp.";
    if (strncmp(de->d_name, tmp, sizeof tmp - 1)) continue;
    long pid = stoke_checkpoint_tmp_pid(de->d_name + sizeof tmp - 1); /* 0: another machine's */
    if (!pid) continue;
    if (pid != (long)getpid() && (kill((pid_t)pid, 0) == 0 || errno != ESRCH)) continue; /* still saving */
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    if (!unlink(path))
      stoke_log(STOKE_LOG_INFO, "run", "removed %s, left by process %ld, which was killed while saving", path, pid);
  }
  if (d) closedir(d);
  char ckpt[PATH_MAX];
  snprintf(ckpt, sizeof ckpt, "%s/" RUN_CKPT_NAME, dir);
  struct stat have, named;
  if (stat(ckpt, &have)) return NULL;
  /* this run continues it (resume names it), or starts from its weights (init_from): nothing to refuse or move */
  const char *named_by[] = {resume, s->rc.run.init_from};
  for (int i = 0; i < 2; i++)
    if (named_by[i][0] && !stat(named_by[i], &named) && named.st_dev == have.st_dev && named.st_ino == have.st_ino)
      return NULL;
  /* overwrite: that run's checkpoint is moved aside now, not replaced at the first save: a run stopped before
   * its first save then leaves no other run's weights for run.resume = auto to continue under its own records */
  if (overwrite) {
    char aside[PATH_MAX + 16];
    snprintf(aside, sizeof aside, "%s.replaced", ckpt);
    if (rename(ckpt, aside))
      return STOKE_ERR(STOKE_E_IO, "%s: [run] overwrite: cannot move the earlier run's %s aside: %s",
                       stoke_cfg_where(c, "run", "overwrite"), ckpt, strerror(errno));
    stoke_log(STOKE_LOG_INFO, "run", "[run] overwrite = true: the earlier run's checkpoint is now %s", aside);
    return NULL;
  }
  /* checkpoint = false too: the run would replace that run's metrics.jsonl, config.ini and report.html */
  stoke_ckpt_meta m;
  char what[64] = "unreadable";
  stoke_err *e = stoke_checkpoint_read_meta(ckpt, &m);
  if (e) stoke_err_free(e);
  else snprintf(what, sizeof what, "step %lld", (long long)m.step);
  return STOKE_ERR(STOKE_E_INVALID,
                   "%s: [run] out_dir '%s' holds another run's checkpoint (%s, %s)%s: continue it with run.resume=%s "
                   "(or run.resume=auto), start over with run.overwrite=true (%s), or choose another out_dir",
                   stoke_cfg_where(c, "run", "out_dir"), dir, ckpt, what,
                   want_ckpt ? "" : " and its records, which this run (checkpoint = false) would replace", ckpt,
                   want_ckpt ? "it is moved aside to checkpoint.safetensors.replaced" : "its metrics.jsonl, config.ini and report.html are");
}

/* Before any compute: room for a checkpoint in out_dir, on its disk and
 * under the file-size limit, so that a run never trains for hours to fail
 * at its first save. */
stoke_err *run_check_room(const run_state *s) {
  if (!s->ckpt[0] || s->rank > 0) return NULL;
  const char *opt_name = s->rc.optimizer.name;
  size_t need = stoke_checkpoint_bytes(s->train.plan, opt_name, s->config_text ? strlen(s->config_text) : 0);
  size_t logs = (size_t)1 << 20; /* metrics.jsonl, log.txt, plan.txt */
  /* A save writes the new file beside the last and then renames it over it: from the second save on, two
   * copies exist for a moment. One is already on the disk when the file exists (a run resumed in place). */
  struct stat st;
  int64_t every = s->rc.run.checkpoint_every;
  int exists = stat(s->ckpt, &st) == 0, copies = !exists && every > 0 && every < s->total ? 2 : 1;
  copies += s->rc.run.keep_best && s->rc.eval_data.source[0]; /* best.safetensors beside it */
  struct statvfs v;
  if (statvfs(s->dir, &v) == 0 && (double)v.f_bavail * (double)v.f_frsize < (double)(copies * need + logs))
    return STOKE_ERR(STOKE_E_IO,
                     "%s: [run] out_dir '%s' has %.1f MiB free, and this run needs %.1f MiB: %s%.1f MiB checkpoint "
                     "and 1 MiB for the logs: free some space, set run.out_dir to another disk, or set "
                     "run.checkpoint = false",
                     stoke_cfg_where(s->cfg, "run", "out_dir"), s->dir,
                     (double)v.f_bavail * (double)v.f_frsize / 1048576.0, (copies * need + logs) / 1048576.0,
                     copies == 2 ? "two copies (a save writes the new file beside the last, then replaces it) of its "
                                 : "its ",
                     need / 1048576.0);
  struct rlimit r;
  if (getrlimit(RLIMIT_FSIZE, &r) == 0 && r.rlim_cur != RLIM_INFINITY && r.rlim_cur < need)
    return STOKE_ERR(STOKE_E_IO,
                     "the file-size limit (ulimit -f) is %.1f MiB, and this run's checkpoint is %.1f MiB: raise the "
                     "limit or set run.checkpoint = false",
                     (double)r.rlim_cur / 1048576.0, need / 1048576.0);
  return NULL;
}
