/* tests/unit/schedule_test.c: learning-rate schedules against values worked
 * out by hand: linear warm-up, cosine to min_lr, step decay, linear scaling. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "stoke/config.h"
#include "stoke/core.h"
#include "stoke/run.h"
#include "stoke/schedule.h"

static void near(double a, double b) {
  if (fabs(a - b) > 1e-12 * fmax(1, fabs(b))) fail_msg("%.17g != %.17g", a, b);
}

static void test_warmup_cosine_step(void **state) {
  stoke_lr_schedule s = {STOKE_LR_COSINE, 0.1, 10, 110, 0.001, 0, 0};
  near(stoke_lr_at(&s, 1), 0.01);  /* 0.1 * 1/10 */
  near(stoke_lr_at(&s, 5), 0.05);
  near(stoke_lr_at(&s, 10), 0.1);  /* end of warm-up: the cosine's top, cos(0) */
  near(stoke_lr_at(&s, 11), 0.001 + 0.5 * 0.099 * (1 + cos(M_PI * 0.01))); /* 1 of its 100 steps */
  near(stoke_lr_at(&s, 60), 0.001 + 0.5 * 0.099 * (1 + cos(M_PI * 0.5))); /* half-way */
  near(stoke_lr_at(&s, 110), 0.001); /* the run's last step runs at min_lr (nanoGPT's get_lr) */
  near(stoke_lr_at(&s, 111), 0.001);
  /* without a warm-up: base_lr at step 1, min_lr at the last */
  s = (stoke_lr_schedule){STOKE_LR_COSINE, 0.1, 0, 101, 0.001, 0, 0};
  near(stoke_lr_at(&s, 1), 0.1);
  near(stoke_lr_at(&s, 51), 0.001 + 0.5 * 0.099 * (1 + cos(M_PI * 0.5)));
  near(stoke_lr_at(&s, 101), 0.001);
  s = (stoke_lr_schedule){STOKE_LR_STEP, 0.1, 0, 100, 0, 30, 0.1};
  near(stoke_lr_at(&s, 1), 0.1);
  near(stoke_lr_at(&s, 30), 0.1);
  near(stoke_lr_at(&s, 31), 0.01);
  near(stoke_lr_at(&s, 61), 0.001);
  s = (stoke_lr_schedule){STOKE_LR_CONSTANT, 0.3, 0, 100, 0, 0, 0};
  near(stoke_lr_at(&s, 77), 0.3);
}

/* The core's keys with `text` loaded as the file `name`, and the schedule
 * of a 1000-step run of 100 steps an epoch at a global batch of 1024. */
static stoke_cfg *schedule_of(const char *name, const char *text, stoke_lr_schedule *s) {
  stoke_cfg *c = stoke_cfg_new();
  stoke_err *e = stoke_declare_core_keys(c);
  if (!e) e = stoke_cfg_load_string(c, name, text);
  if (!e) e = stoke_lr_from_config(c, 1000, 100, 1024, s);
  if (e) fail_msg("%s", e->msg);
  return c;
}

static void test_from_config(void **state) {
  stoke_lr_schedule s;
  stoke_cfg *c = schedule_of("s.ini", "[optimizer]\nlr = 0.1\nschedule = cosine\nwarmup_epochs = 2\n"
                                      "lr_scale_with_batch = true\nbase_batch = 256\n", &s);
  near(s.base_lr, 0.4); /* 0.1 x 1024 / 256 */
  assert_int_equal(s.warmup_steps, 200);
  assert_int_equal(s.kind, STOKE_LR_COSINE);
  /* a warm-up longer than the run is an error naming the key */
  stoke_err *e = stoke_lr_from_config(c, 150, 100, 1024, &s);
  assert_non_null(e);
  assert_non_null(strstr(e->msg, "s.ini:4: [optimizer] warmup_epochs"));
  /* and says what to change: 150 steps of 100 an epoch is 1.5 epochs */
  if (!strstr(e->msg, "lower warmup_epochs (below 1.5; 0: no warmup) or train longer")) fail_msg("%s", e->msg);
  stoke_err_free(e);
  /* the default is a constant lr */
  stoke_cfg *d = schedule_of("d.ini", "[optimizer]\nlr = 0.1\n", &s);
  assert_int_equal(s.kind, STOKE_LR_CONSTANT);
  near(stoke_lr_at(&s, 999), 0.1);
  stoke_cfg_free(d);
  stoke_cfg_free(c);
}

/* min_lr scales with lr under the linear scaling rule, and a min_lr above
 * lr (the cosine would climb to it) is refused naming the key. */
static void test_min_lr(void **state) {
  stoke_lr_schedule s;
  stoke_cfg *c = schedule_of("m.ini", "[optimizer]\nlr = 0.1\nschedule = cosine\nmin_lr = 0.01\n"
                                      "lr_scale_with_batch = true\nbase_batch = 256\n", &s);
  near(s.base_lr, 0.4);
  near(s.min_lr, 0.04); /* 0.01 x 1024 / 256: the cosine still ends at a tenth of its top */
  near(stoke_lr_at(&s, 1000), 0.04);
  stoke_err *e = stoke_cfg_override(c, "optimizer.min_lr=0.2"); /* 0.8 after scaling, above 0.4 */
  if (!e) e = stoke_lr_from_config(c, 1000, 100, 1024, &s);
  assert_non_null(e);
  print_message("%s\n", e->msg);
  if (!strstr(e->msg, "command line: [optimizer] min_lr = 0.8 is above lr = 0.4: the cosine \"decay\" would raise"))
    fail_msg("%s", e->msg);
  stoke_err_free(e);
  stoke_cfg_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_warmup_cosine_step),
      cmocka_unit_test(test_from_config),
      cmocka_unit_test(test_min_lr),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
