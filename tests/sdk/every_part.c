/* tests/sdk/every_part.c: a plugin, built from the SDK headers alone, that
 * registers one part of every versioned kind (op type and its kernel,
 * backend, source, model, precision policy, comm, optimizer), so the SDK
 * test checks each struct against the loader. Built with -DSTALE=K, part K
 * (0 op, 1 backend, 2 source, 3 model, 4 precision, 5 comm, 6 optimizer)
 * claims a struct 8 bytes larger, as one built against another header
 * would; with -DOLD_ABI=K it claims ABI version 1. The loader must refuse
 * both, naming the file and the part. Nothing here is meant to run. */
#include <string.h>

#include "stoke/plugin.h"

const stoke_host_v1 *stoke_host;

#ifndef STALE
#define STALE -1
#endif
#ifndef OLD_ABI
#define OLD_ABI -1
#endif

/* The version fields of part k: right, stale (size + 8) or old (ABI 1). */
#define V(type, k) (OLD_ABI == (k) ? 1u : STOKE_ABI_VERSION), \
                   (uint32_t)(sizeof(type) + (STALE == (k) ? 8 : 0))

static stoke_err *infer(const stoke_node_v1 *n, const stoke_value_desc_v1 *in, stoke_value_desc_v1 *out) {
  out[0] = in[0];
  return NULL;
}

static const stoke_op_type_v1 op = {V(stoke_op_type_v1, 0), .name = "every_op", .help = "identity",
                                    .n_inputs = 1, .n_outputs = 1, .infer = infer};

static stoke_err *copy_fwd(const stoke_kernel_args_v1 *a, void *state) {
  memcpy(a->out[0].data, a->in[0].data, (size_t)stoke_numel(&a->in[0].shape) * sizeof(float));
  return NULL;
}

static const stoke_kernel_v1 kernel = {.engine = "cpu", .op = "every_op", .pass = STOKE_FWD, .dtype = STOKE_F32,
                                       .run = copy_fwd};

static const stoke_backend_v1 backend = {V(stoke_backend_v1, 1), .name = "every_backend",
                                         .help = "registers only", .device = STOKE_DEV_CPU,
                                         .device_engine = "cpu"};

/* the callbacks the loader requires of each kind (never called here) */
static stoke_err *unused(const char *what) { return STOKE_PERR(STOKE_E_UNSUPPORTED, "every_part: %s", what); }
static stoke_err *s_open(const stoke_cfg *c, const char *section, void **self) { return unused("open"); }
static int64_t length(void *self) { return 0; }
static stoke_err *s_info(void *self, stoke_sample_info_v1 *out) { return unused("info"); }
static stoke_err *s_read(void *self, int64_t index, uint64_t seed, void *dst, int32_t *label) {
  return unused("read");
}
static const stoke_source_v1 source = {V(stoke_source_v1, 2), .name = "every_source", .help = "empty",
                                       .open = s_open, .length = length, .info = s_info, .read = s_read};

static stoke_err *build(const stoke_cfg *cfg, const char *section, const stoke_builder_v1 *b, int input,
                        int64_t classes, int *logits) {
  *logits = input;
  return NULL;
}
static const stoke_model_v1 model = {V(stoke_model_v1, 3), .name = "every_model", .help = "identity",
                                     .build = build};

static const stoke_precision_v1 precision = {V(stoke_precision_v1, 4), .name = "every_precision",
                                             .help = "fp32", .param_dtype = STOKE_F32,
                                             .compute_dtype = STOKE_F32, .master_dtype = STOKE_F32};

static stoke_err *c_open(const stoke_cfg *cfg, const stoke_comm_place_v1 *place, void **self) {
  return unused("comm open");
}
static stoke_err *c_all_reduce(void *self, void *buf, size_t count, stoke_dtype dt, stoke_reduce_op op,
                                void *stream) {
  return unused("all_reduce");
}
static const stoke_comm_v1 comm = {V(stoke_comm_v1, 5), .name = "every_comm", .help = "registers only",
                                   .open = c_open, .all_reduce = c_all_reduce};

static const stoke_optimizer_v1 optimizer = {V(stoke_optimizer_v1, 6), .name = "every_optimizer",
                                             .help = "registers only", .n_state = 1,
                                             .state_names = {"momentum_buffer"}};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  STOKE_PROPAGATE_P(r->add_op(r->self, &op));
  STOKE_PROPAGATE_P(r->add_kernel(r->self, &kernel));
  STOKE_PROPAGATE_P(r->add_backend(r->self, &backend));
  STOKE_PROPAGATE_P(r->add_source(r->self, &source));
  STOKE_PROPAGATE_P(r->add_model(r->self, &model));
  STOKE_PROPAGATE_P(r->add_precision(r->self, &precision));
  STOKE_PROPAGATE_P(r->add_comm(r->self, &comm));
  return r->add_optimizer(r->self, &optimizer);
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {STOKE_ABI_VERSION, sizeof(stoke_plugin_v1),
                                                            "every_part", "one part of every kind", reg};
