/* sources/jpeg: the "jpeg" data source. Reads an ImageFolder (ROOT/CLASS/
 * IMAGE.jpg) and decodes each sample with torchvision's ImageNet transforms
 * (RandomResizedCrop + flip for training, Resize + CenterCrop for eval).
 *
 * A read decodes only what the sample shows: the crop is chosen from the
 * JPEG header, the decoder scales in the DCT domain by the smallest M/8
 * (M = 1, 2, 4, 8: the SIMD ones) that keeps the crop at least `size`
 * pixels on both sides, decodes only
 * the crop's columns (jpeg_crop_scanline) and rows (jpeg_skip_scanlines
 * above, nothing below), and crop.c's antialiased bilinear resampler writes
 * the size x size RGB result straight into the batch slot. libjpeg-turbo's
 * libjpeg API is linked statically (see BUILD). Every bad file is
 * STOKE_E_DATA naming its path, which the loader logs, counts and replaces. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>


#include "sample.h"
#include "walk.h"
#include "stoke/plugin.h"
#include "stoke/rng.h"

const stoke_host_v1 *stoke_host;

void stoke_jpeg_stderr_init(void); /* stderr_shim.c */

#define LAYOUT "one folder per class holding its .jpg/.jpeg files (ROOT/CLASS/IMAGE.jpg, as torchvision's ImageFolder)"

static const stoke_cfg_key_v1 keys[] = {
    {"root", STOKE_CFG_STR, "", 0, 0, NULL,
     "image folder: " LAYOUT "; sorted class folder names give the labels 0..C-1"},
    {"size", STOKE_CFG_INT, "224", 1, 16384, NULL, "output side: samples are size x size x 3 u8 (HWC)"},
    {"train", STOKE_CFG_ENUM, "auto", 0, 0, "auto|true|false",
     "true: RandomResizedCrop(size) + random horizontal flip; false: resize the shorter side to `resize`, "
     "then the centre size x size; auto: true in [data], false in [eval_data]"},
    {"resize", STOKE_CFG_INT, "0", 0, 65536, NULL,
     "eval (train = false): shorter side before the centre crop; 0: size / 0.875 (256 for 224, as torchvision's "
     "Resize(256) + CenterCrop(224))"},
    {"scale_min", STOKE_CFG_FLOAT, "0.08", 1e-6, 1, NULL, "RandomResizedCrop: smallest fraction of the area"},
    {"scale_max", STOKE_CFG_FLOAT, "1.0", 1e-6, 1, NULL, "RandomResizedCrop: largest fraction of the area"},
    {"ratio_min", STOKE_CFG_FLOAT, "0.75", 1e-3, 1e3, NULL, "RandomResizedCrop: smallest aspect ratio (w/h)"},
    {"ratio_max", STOKE_CFG_FLOAT, "1.3333333333", 1e-3, 1e3, NULL,
     "RandomResizedCrop: largest aspect ratio (w/h); 4/3 as torchvision"},
    {"flip", STOKE_CFG_BOOL, "true", 0, 0, NULL, "train: mirror left-right with probability 0.5"},
    {"allow_empty", STOKE_CFG_BOOL, "false", 0, 0, NULL,
     "a class folder without a readable JPEG: an error (false, as torchvision's ImageFolder), or a warning and a "
     "label never drawn (true)"},
    {"cache", STOKE_CFG_ENUM, "none", 0, 0, "none|ram",
     "ram: keep every file's encoded bytes in memory after its first read (the whole data set must fit)"},
};

/* A file's bytes, kept by the RAM cache. */
typedef struct blob {
  size_t n;
  uint8_t d[];
} blob;

typedef struct jpeg_src {
  char *root;
  int64_t count, classes;
  char **paths;    /* [count] */
  int32_t *labels; /* [count] */
  stoke_jpeg_tf tf; /* the transform of every sample */
  int cache;
  blob **cached; /* [count], filled once each, atomically; NULL: no cache */
} jpeg_src;

/* ------------------------------------------------------------- scanning */

/* [eval_data]'s class folders against [data]'s (when that is a jpeg source
 * too): the labels are the sorted names' positions, so a different name at
 * a position scores every image of it against another class, silently. Only
 * the root's folder names are listed: a training set's files are not walked
 * again. */
static stoke_err *same_classes(const stoke_cfg *c, const stoke_image_list *l) {
  const char *src = NULL, *root = NULL;
  stoke_err *e = stoke_host->cfg_str(c, "data", "source", &src);
  if (!e && src && !strcmp(src, "jpeg")) e = stoke_host->cfg_str(c, "data", "root", &root);
  if (e || !root || !root[0]) {
    if (e) stoke_host->err_free(e);
    return NULL; /* no jpeg [data] to compare with */
  }
  char **names = NULL;
  size_t n = 0;
  if (stoke_list_class_folders(root, &names, &n)) return NULL; /* [data]'s own open says why */
  stoke_err *bad = NULL;
  for (size_t i = 0; !bad && i < (n > l->n_classes ? n : l->n_classes); i++)
    if (i >= n || i >= l->n_classes || strcmp(names[i], l->classes[i]))
      bad = STOKE_PERR(STOKE_E_INVALID,
                       "%s: [eval_data] class %zu is %s%s%s, [data]'s (%s) is %s%s%s: labels are the sorted class "
                       "folders' positions, so the evaluation would score images against other classes; give both "
                       "the same class folders (%zu in [data], %zu here)",
                       stoke_host->cfg_where(c, "eval_data", "root"), i, i < l->n_classes ? "'" : "",
                       i < l->n_classes ? l->classes[i] : "missing", i < l->n_classes ? "'" : "", root,
                       i < n ? "'" : "", i < n ? names[i] : "missing", i < n ? "'" : "", n, l->n_classes);
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  return bad;
}

/* The image list (walk.h: torchvision's ImageFolder, without its loops). */
static stoke_err *scan(jpeg_src *s, const stoke_cfg *c, const char *sec, int allow_empty) {
  const char *where = stoke_host->cfg_where(c, sec, "root");
  stoke_image_list l;
  if (stoke_walk_image_folder(s->root, &l)) {
    if (errno == ENOENT || errno == ENOTDIR)
      return STOKE_PERR(errno == ENOENT ? STOKE_E_NOT_FOUND : STOKE_E_INVALID,
                        "jpeg %s (root, %s): %s; it should hold " LAYOUT, s->root, where,
                        errno == ENOENT ? "no such folder" : "not a folder");
    return STOKE_PERR(errno == ENOMEM ? STOKE_E_OOM : STOKE_E_IO, "jpeg %s: cannot list the folder: %s", s->root,
                      strerror(errno));
  }
  stoke_err *e = NULL;
  if (l.n_classes == 0)
    e = STOKE_PERR(STOKE_E_INVALID, "jpeg %s (root, %s): %s, no class folders; it should hold " LAYOUT, s->root,
                   where, l.other ? "only files" : "an empty folder");
  else if (l.n == 0)
    e = STOKE_PERR(STOKE_E_INVALID, "jpeg %s (root, %s): %zu class folders but no .jpg/.jpeg file in them%s", s->root,
                   where, l.n_classes, l.other ? " (only other files)" : "");
  if (!e) {
    if (l.n_classes == 1)
      stoke_host->log(STOKE_LOG_WARN, "jpeg",
                      "%s: one class folder: every label is 0, so the loss is 0 from the start and nothing is "
                      "learned; a classification set has a folder per class (" LAYOUT ")", s->root);
    if (l.empty) {
      /* torchvision's ImageFolder refuses this too: a class never drawn is a class the model cannot learn, and
       * the usual cause is data that is not there (an unmounted disk behind links) */
      char names[1200];
      stoke_image_list_empty_names(&l, names, sizeof names);
      if (!allow_empty)
        e = STOKE_PERR(STOKE_E_DATA,
                       "jpeg %s: %zu class folder%s hold no readable JPEG: %s; their labels would never be drawn "
                       "(torchvision's ImageFolder refuses this too): fix or remove them, or set [%s] allow_empty = "
                       "true", s->root, l.empty, l.empty == 1 ? "" : "s", names, sec);
      else
        stoke_host->log(STOKE_LOG_WARN, "jpeg", "%s: %zu class folders hold no JPEG (%s); their labels are kept but "
                        "never drawn (allow_empty = true)", s->root, l.empty, names);
    } else if (l.dangling) {
      stoke_host->log(STOKE_LOG_WARN, "jpeg", "%s: %zu links point at nothing and were skipped (the first: %s)", s->root,
                      l.dangling, l.first_dangling);
    }
    /* a hidden folder (Jupyter's .ipynb_checkpoints) is a class to torchvision's ImageFolder too, so the labels
     * stay PyTorch's; said, because it is seldom meant */
    for (size_t c = 0; c < l.n_classes; c++)
      if (l.classes[c][0] == '.')
        stoke_host->log(STOKE_LOG_WARN, "jpeg",
                        "%s: class %zu is the hidden folder '%s' (as torchvision's ImageFolder counts it too); if it "
                        "is not a class (Jupyter's .ipynb_checkpoints), remove it: every class's label after it "
                        "shifts by one", s->root, c, l.classes[c]);
    if (l.other)
      stoke_host->log(STOKE_LOG_INFO, "jpeg", "%s: ignored %zu files that are not .jpg/.jpeg (first: %s)", s->root,
                      l.other, l.first_other);
    if (l.loops || l.pseudo || l.unreadable)
      stoke_host->log(STOKE_LOG_WARN, "jpeg",
                      "%s: skipped %zu folders that link back to a folder they are in, %zu of kernel file systems and "
                      "%zu that cannot be read; first: %s",
                      s->root, l.loops, l.pseudo, l.unreadable, l.first_skipped);
    if (!e && !strcmp(sec, "eval_data")) e = same_classes(c, &l);
    if (!e) { /* the labels' names (torchvision's dataset.classes), as the log's record of them */
      char names[1024];
      size_t used = 0;
      for (size_t k = 0; k < l.n_classes && used < sizeof names; k++)
        used += (size_t)snprintf(names + used, sizeof names - used, "%s%zu %s", k ? ", " : "", k, l.classes[k]);
      if (used >= sizeof names) snprintf(names + sizeof names - 5, 5, " ...");
      stoke_host->log(STOKE_LOG_INFO, "jpeg", "%s: labels: %s", s->root, names);
    }
    s->count = (int64_t)l.n;
    s->classes = (int64_t)l.n_classes;
    s->paths = l.paths;
    s->labels = l.labels;
    l.paths = NULL;
    l.labels = NULL;
    l.n = 0;
  }
  stoke_image_list_free(&l);
  return e;
}

/* ----------------------------------------------------------------- read */

static blob *read_file(const char *path, char *why, size_t cap) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO put there since the scan: never waited on */
  if (fd < 0) {
    snprintf(why, cap, "cannot open: %s", strerror(errno));
    return NULL;
  }
  struct stat st;
  blob *b = NULL;
  if (fstat(fd, &st) != 0) {
    snprintf(why, cap, "cannot stat: %s", strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    snprintf(why, cap, "not a regular file any more");
  } else if (st.st_size == 0) {
    snprintf(why, cap, "empty file, not a JPEG");
  } else if (!(b = malloc(sizeof *b + (size_t)st.st_size))) {
    snprintf(why, cap, "out of memory for %lld bytes", (long long)st.st_size);
  } else {
    size_t got = 0, want = (size_t)st.st_size;
    errno = 0;
    while (got < want) {
      ssize_t k = read(fd, b->d + got, want - got);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) break;
      got += (size_t)k;
    }
    if (got == 0) {
      snprintf(why, cap, "cannot read: %s", errno ? strerror(errno) : "the file is empty now");
      free(b);
      b = NULL;
    } else {
      b->n = got; /* a file that shrank since: decode what is there */
    }
  }
  close(fd);
  return b;
}

static stoke_err *jp_read(void *self, int64_t index, uint64_t seed, void *dst, int32_t *label) {
  jpeg_src *s = self;
  if (index < 0 || index >= s->count)
    return STOKE_PERR(STOKE_E_INVALID, "jpeg %s: index %lld outside [0, %lld)", s->root, (long long)index,
                      (long long)s->count);
  const char *path = s->paths[index];
  char why[JMSG_LENGTH_MAX + 256];
  blob *b = s->cached ? __atomic_load_n(&s->cached[index], __ATOMIC_ACQUIRE) : NULL;
  int owned = 0;
  if (!b) {
    b = read_file(path, why, sizeof why);
    if (!b) return STOKE_PERR(STOKE_E_DATA, "jpeg %s: %s", path, why);
    owned = 1;
    if (s->cached) {
      blob *expect = NULL;
      if (__atomic_compare_exchange_n(&s->cached[index], &expect, b, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        owned = 0; /* the cache keeps it */
      } else {     /* another thread cached it first: use that one */
        free(b);
        b = expect;
        owned = 0;
      }
    }
  }
  int rc = stoke_jpeg_sample(&s->tf, b->d, b->n, seed, dst, why, sizeof why);
  if (owned) free(b);
  if (rc) return STOKE_PERR(STOKE_E_DATA, "jpeg %s: %s", path, why);
  *label = s->labels[index];
  return NULL;
}

/* ----------------------------------------------------------------- open */

static void jp_close(void *self) {
  jpeg_src *s = self;
  if (!s) return;
  for (int64_t i = 0; i < s->count; i++) {
    if (s->paths) free(s->paths[i]);
    if (s->cached) free(s->cached[i]);
  }
  free(s->paths);
  free(s->labels);
  free(s->cached);
  free(s->root);
  free(s);
}

static stoke_err *jp_open(const stoke_cfg *c, const char *sec, void **self) {
  const char *root = NULL, *cache = NULL, *train_s = NULL;
  int64_t size = 0, resize = 0;
  int train = 0, flip = 0;
  double smin = 0, smax = 0, rmin = 0, rmax = 0;
  STOKE_PROPAGATE_P(stoke_host->cfg_str(c, sec, "root", &root));
  STOKE_PROPAGATE_P(stoke_host->cfg_int(c, sec, "size", &size));
  STOKE_PROPAGATE_P(stoke_host->cfg_int(c, sec, "resize", &resize));
  STOKE_PROPAGATE_P(stoke_host->cfg_str(c, sec, "train", &train_s));
  /* auto: augment what trains, not what is evaluated (a random crop and flip in evaluation gave noisy, biased
   * accuracy) */
  train = !strcmp(train_s, "true") || (!strcmp(train_s, "auto") && strcmp(sec, "eval_data"));
  STOKE_PROPAGATE_P(stoke_host->cfg_bool(c, sec, "flip", &flip));
  STOKE_PROPAGATE_P(stoke_host->cfg_float(c, sec, "scale_min", &smin));
  STOKE_PROPAGATE_P(stoke_host->cfg_float(c, sec, "scale_max", &smax));
  STOKE_PROPAGATE_P(stoke_host->cfg_float(c, sec, "ratio_min", &rmin));
  STOKE_PROPAGATE_P(stoke_host->cfg_float(c, sec, "ratio_max", &rmax));
  STOKE_PROPAGATE_P(stoke_host->cfg_str(c, sec, "cache", &cache));
  int allow_empty = 0;
  STOKE_PROPAGATE_P(stoke_host->cfg_bool(c, sec, "allow_empty", &allow_empty));
  if (!root || !root[0])
    return STOKE_PERR(STOKE_E_INVALID, "%s: [%s] root is empty: set it to a folder with " LAYOUT,
                      stoke_host->cfg_where(c, sec, "root"), sec);
  if (smin > smax)
    return STOKE_PERR(STOKE_E_INVALID, "%s: [%s] scale_min = %g is above scale_max = %g",
                      stoke_host->cfg_where(c, sec, "scale_min"), sec, smin, smax);
  if (rmin > rmax)
    return STOKE_PERR(STOKE_E_INVALID, "%s: [%s] ratio_min = %g is above ratio_max = %g",
                      stoke_host->cfg_where(c, sec, "ratio_min"), sec, rmin, rmax);
  if (!resize) resize = (int64_t)llround((double)size / 0.875); /* the centre crop keeps 87.5% of the side */
  if (!train && resize < size)
    return STOKE_PERR(STOKE_E_INVALID, "%s: [%s] resize = %lld is below size = %lld: the centre crop would not fit",
                      stoke_host->cfg_where(c, sec, "resize"), sec, (long long)resize, (long long)size);
  jpeg_src *s = calloc(1, sizeof *s);
  if (!s || !(s->root = strdup(root))) {
    free(s);
    return STOKE_PERR(STOKE_E_OOM, "jpeg: out of memory");
  }
  s->tf = (stoke_jpeg_tf){.size = (int)size, .resize = (int)resize, .train = train, .flip = flip,
                          .scale_min = smin, .scale_max = smax, .ratio_min = rmin, .ratio_max = rmax};
  s->cache = cache && !strcmp(cache, "ram");
  stoke_err *e = scan(s, c, sec, allow_empty);
  if (!e && s->cache && !(s->cached = calloc((size_t)s->count, sizeof *s->cached)))
    e = STOKE_PERR(STOKE_E_OOM, "jpeg: out of memory");
  if (e) {
    jp_close(s);
    return e;
  }
  char how[96];
  if (s->tf.train) snprintf(how, sizeof how, "%s", s->tf.flip ? "RandomResizedCrop + flip" : "RandomResizedCrop");
  else snprintf(how, sizeof how, "shorter side resized to %d, centre %dx%d crop", s->tf.resize, s->tf.size, s->tf.size);
  stoke_host->log(STOKE_LOG_INFO, "jpeg", "%s: %lld images in %lld classes -> %dx%dx3, %s%s", s->root,
                  (long long)s->count, (long long)s->classes, s->tf.size, s->tf.size, how,
                  s->cache ? ", RAM cache" : "");
  *self = s;
  return NULL;
}

static int64_t jp_length(void *self) { return ((jpeg_src *)self)->count; }

static stoke_err *jp_info(void *self, stoke_sample_info_v1 *out) {
  jpeg_src *s = self;
  memset(out, 0, sizeof *out);
  out->shape.ndim = 3;
  out->shape.d[0] = 3;
  out->shape.d[1] = s->tf.size;
  out->shape.d[2] = s->tf.size;
  out->dtype = STOKE_U8;
  out->layout = STOKE_NHWC;
  out->classes = s->classes;
  return NULL;
}

static const stoke_source_v1 source = {
    STOKE_ABI(stoke_source_v1),
    "jpeg",
    "JPEG image folder (ROOT/CLASS/IMAGE.jpg): RandomResizedCrop + flip or resize + centre crop, u8 RGB, HWC",
    keys,
    sizeof keys / sizeof *keys,
    jp_open,
    jp_close,
    jp_length,
    jp_info,
    jp_read};

static stoke_err *reg(const stoke_host_v1 *h, const stoke_registry_v1 *r) {
  stoke_host = h;
  stoke_jpeg_stderr_init();
  return r->add_source(r->self, &source);
}

STOKE_EXPORT const stoke_plugin_v1 stoke_plugin_v1_entry = {
    STOKE_ABI_VERSION, sizeof(stoke_plugin_v1), "jpeg", "JPEG image-folder data source", reg};
