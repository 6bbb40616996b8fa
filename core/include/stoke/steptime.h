/* stoke/steptime.h: each step's device time, from timers (CUDA events)
 * recorded on the compute stream at step boundaries and read back lazily. */
#ifndef STOKE_STEPTIME_H
#define STOKE_STEPTIME_H

#include <stdint.h>

#include "stoke/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The one definition of a step's time, shared by train's console line,
 * metrics.jsonl, the summary and tools/bench: the device time between the
 * boundary recorded after the step before it (or after a pause) and the
 * boundary recorded after the step's last operation, both on the compute
 * stream. With CUDA graphs the boundaries sit around the graph's launch.
 * Consecutive steps share a boundary, so the steps' times add up to the
 * device time of the whole stretch: what samples/s is made of.
 *
 * Recording never waits. The times are read when the caller reads them,
 * at a log step, after the loss read-back synchronized anyway; the pool of
 * timers is reused round-robin, and only when more steps than it holds are
 * unread is the oldest one's timer waited for (a step that ended long ago).
 * A device without timers is timed with the host clock. */
typedef struct stoke_steptime stoke_steptime;

stoke_err *stoke_steptime_new(const stoke_backend_v1 *dev, void *dev_self, stoke_steptime **out);
void stoke_steptime_free(stoke_steptime *t);
/* Before a step: records the step's start boundary unless the step before
 * it ended one (then that boundary is the start: no record). */
__attribute__((warn_unused_result)) stoke_err *stoke_steptime_begin(stoke_steptime *t);
/* After the step's last operation was issued: records its end boundary. */
__attribute__((warn_unused_result)) stoke_err *stoke_steptime_end(stoke_steptime *t);
/* The next step does not follow on from the last one (an evaluation or a
 * checkpoint write came between): it gets a start boundary of its own. */
void stoke_steptime_pause(stoke_steptime *t);
/* The device times in ms of the steps ended since the last read, oldest
 * first; *ms stays valid until the next call on `t`. */
__attribute__((warn_unused_result)) stoke_err *stoke_steptime_read(stoke_steptime *t, const double **ms, int64_t *n);

#ifdef __cplusplus
}
#endif
#endif
