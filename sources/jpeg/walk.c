/* sources/jpeg/walk.c: see walk.h. Breadth first over each class folder,
 * every folder's (device, inode) chain of ancestors kept to see loops. */
#define _GNU_SOURCE
#include "walk.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include <linux/magic.h>

typedef struct strv {
  char **v;
  size_t n, cap;
} strv;

static int strv_push(strv *s, char *p) {
  if (!p) return -1;
  if (s->n == s->cap) {
    size_t nc = s->cap ? s->cap * 2 : 16;
    char **nv = realloc(s->v, nc * sizeof *nv);
    if (!nv) {
      free(p);
      return -1;
    }
    s->v = nv;
    s->cap = nc;
  }
  s->v[s->n++] = p;
  return 0;
}

static void strv_free(strv *s) {
  for (size_t i = 0; i < s->n; i++) free(s->v[i]);
  free(s->v);
  memset(s, 0, sizeof *s);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static char *join(const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  char *p = malloc(a + b + 2);
  if (!p) return NULL;
  memcpy(p, dir, a);
  p[a] = '/';
  memcpy(p + a + 1, name, b + 1);
  return p;
}

static int is_jpeg_name(const char *name) {
  const char *dot = strrchr(name, '.');
  return dot && (!strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg"));
}

/* A folder to walk, with the identities of it and its ancestors. */
typedef struct node {
  char *path;
  size_t depth;
  struct { dev_t dev; ino_t ino; } *chain; /* [depth + 1], this folder last */
} node;

typedef struct nodes {
  node *v;
  size_t n, cap;
} nodes;

/* Appends folder `path` (owned from here) below l->v[parent] (none: -1). */
static int nodes_push(nodes *l, char *path, long parent, const struct stat *st) {
  if (!path) return -1;
  size_t depth = parent >= 0 ? l->v[parent].depth + 1 : 0;
  void *chain = malloc((depth + 1) * sizeof *l->v[0].chain);
  if (!chain) {
    free(path);
    return -1;
  }
  if (parent >= 0) memcpy(chain, l->v[parent].chain, depth * sizeof *l->v[0].chain);
  if (l->n == l->cap) {
    size_t nc = l->cap ? l->cap * 2 : 16;
    node *nv = realloc(l->v, nc * sizeof *nv);
    if (!nv) {
      free(path);
      free(chain);
      return -1;
    }
    l->v = nv;
    l->cap = nc;
  }
  node *k = &l->v[l->n];
  k->depth = depth;
  k->chain = chain;
  k->chain[k->depth].dev = st->st_dev;
  k->chain[k->depth].ino = st->st_ino;
  k->path = path;
  l->n++;
  return 0;
}

static void nodes_free(nodes *l) {
  for (size_t i = 0; i < l->n; i++) {
    free(l->v[i].path);
    free(l->v[i].chain);
  }
  free(l->v);
}

/* Kernel file systems that hold no data set, only endless views of the
 * system (/proc/N/cwd, /sys's links): never walked into. */
static int pseudo_fs(const char *path) {
  struct statfs f;
  if (statfs(path, &f) != 0) return 0;
  switch ((unsigned long)f.f_type) {
    case PROC_SUPER_MAGIC:
    case SYSFS_MAGIC:
    case DEBUGFS_MAGIC:
    case TRACEFS_MAGIC:
    case SECURITYFS_MAGIC:
    case CGROUP_SUPER_MAGIC:
    case CGROUP2_SUPER_MAGIC:
    case DEVPTS_SUPER_MAGIC:
    case BPF_FS_MAGIC:
      return 1;
    default:
      return 0;
  }
}

static void skipped(stoke_image_list *out, size_t *counter, const char *path, const char *why) {
  if (!out->loops && !out->pseudo && !out->unreadable)
    snprintf(out->first_skipped, sizeof out->first_skipped, "%s (%s)", path, why);
  (*counter)++;
}

/* Folder k of `all`: its sub-folders appended to `all` (links followed,
 * loops and pseudo file systems left out), its files to `files`. */
static int list_one(stoke_image_list *out, nodes *all, size_t k, strv *files) {
  DIR *d = opendir(all->v[k].path);
  if (!d) {
    if (errno == ENOMEM) return -1;
    skipped(out, &out->unreadable, all->v[k].path, strerror(errno));
    return 0;
  }
  int rc = 0;
  for (struct dirent *de; !rc && (de = readdir(d));) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    char *full = join(all->v[k].path, de->d_name);
    struct stat st;
    if (!full) {
      rc = -1;
      break;
    }
    if (stat(full, &st) != 0) { /* a dangling link: neither (counted: a class of them is a class lost) */
      if (!out->dangling++) snprintf(out->first_dangling, sizeof out->first_dangling, "%s", full);
      free(full);
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      const node *parent = &all->v[k];
      int loop = 0;
      for (size_t a = 0; a <= parent->depth && !loop; a++)
        loop = parent->chain[a].dev == st.st_dev && parent->chain[a].ino == st.st_ino;
      /* the class's parent, the data set's root, is an ancestor too */
      loop |= out->root_dev == st.st_dev && out->root_ino == st.st_ino;
      if (loop) {
        skipped(out, &out->loops, full, "a link back to a folder it is in");
        free(full);
      } else if (pseudo_fs(full)) {
        skipped(out, &out->pseudo, full, "a kernel file system, not data");
        free(full);
      } else if (nodes_push(all, full, (long)k, &st)) {
        rc = -1;
      }
    } else if (S_ISREG(st.st_mode)) {
      if (strv_push(files, full)) rc = -1;
    } else {
      free(full);
    }
  }
  int saved = errno;
  closedir(d);
  errno = saved;
  return rc;
}

/* Every JPEG of one class, appended to out->paths in torchvision's order. */
static int walk_class(stoke_image_list *out, const char *cdir, const struct stat *st, strv *paths) {
  nodes all = {0};
  int rc = nodes_push(&all, strdup(cdir), -1, st);
  strv *per = NULL; /* files of each folder: n_per of them set (all.n may run ahead when a listing fails) */
  size_t n_per = 0;
  for (size_t k = 0; !rc && k < all.n; k++) {
    strv *np = realloc(per, (k + 1) * sizeof *per);
    if (!np) {
      rc = -1;
      break;
    }
    per = np;
    memset(&per[k], 0, sizeof per[k]);
    n_per = k + 1;
    rc = list_one(out, &all, k, &per[k]);
  }
  /* folders by path (sorted(os.walk(...))), files sorted in each */
  size_t *order = rc ? NULL : malloc(all.n * sizeof *order);
  if (!rc && !order) rc = -1;
  for (size_t k = 0; !rc && k < all.n; k++) order[k] = k;
  for (size_t i = 1; !rc && i < all.n; i++) /* insertion sort: folders are few */
    for (size_t j = i; j > 0 && strcmp(all.v[order[j - 1]].path, all.v[order[j]].path) > 0; j--) {
      size_t t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  for (size_t i = 0; !rc && i < all.n; i++) {
    strv *f = &per[order[i]];
    if (f->n) qsort(f->v, f->n, sizeof *f->v, cmp_str);
    for (size_t j = 0; !rc && j < f->n; j++) {
      const char *base = strrchr(f->v[j], '/') + 1;
      if (!is_jpeg_name(base)) {
        if (!out->other++) snprintf(out->first_other, sizeof out->first_other, "%s", f->v[j]);
        continue;
      }
      rc = strv_push(paths, f->v[j]);
      f->v[j] = NULL;
    }
  }
  for (size_t k = 0; k < n_per; k++) strv_free(&per[k]);
  free(per);
  free(order);
  nodes_free(&all);
  return rc;
}

/* The class folders of `root`, sorted (torchvision's find_classes); with
 * `out`, the files beside them are counted there (the first named). 0, or
 * -1 with errno. */
static int class_folders(const char *root, strv *classes, stoke_image_list *out) {
  DIR *d = opendir(root);
  if (!d) return -1;
  int rc = 0;
  for (struct dirent *de; !rc && (de = readdir(d));) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    char *full = join(root, de->d_name);
    struct stat cs;
    if (full && stat(full, &cs) == 0 && S_ISDIR(cs.st_mode)) rc = strv_push(classes, strdup(de->d_name));
    else if (out && full && stat(full, &cs) == 0 && S_ISREG(cs.st_mode) && !out->other++)
      snprintf(out->first_other, sizeof out->first_other, "%s (beside the class folders)", full);
    if (!full) rc = -1;
    free(full);
  }
  closedir(d);
  if (!rc && classes->n) qsort(classes->v, classes->n, sizeof *classes->v, cmp_str);
  return rc;
}

int stoke_list_class_folders(const char *root, char ***names, size_t *n) {
  strv classes = {0};
  int rc = class_folders(root, &classes, NULL);
  if (rc) strv_free(&classes);
  *names = rc ? NULL : classes.v;
  *n = rc ? 0 : classes.n;
  return rc;
}

int stoke_walk_image_folder(const char *root, stoke_image_list *out) {
  memset(out, 0, sizeof *out);
  struct stat st;
  if (stat(root, &st) != 0) return -1;
  if (!S_ISDIR(st.st_mode)) {
    errno = ENOTDIR;
    return -1;
  }
  out->root_dev = st.st_dev;
  out->root_ino = st.st_ino;
  strv classes = {0}, paths = {0};
  int rc = class_folders(root, &classes, out);
  int32_t *labels = NULL;
  size_t labels_cap = 0;
  for (size_t c = 0; !rc && c < classes.n; c++) {
    char *cdir = join(root, classes.v[c]);
    struct stat cs;
    size_t before = paths.n;
    if (!cdir) rc = -1;
    else if (stat(cdir, &cs) == 0 && pseudo_fs(cdir)) skipped(out, &out->pseudo, cdir, "a kernel file system, not data");
    else if (stat(cdir, &cs) == 0) rc = walk_class(out, cdir, &cs, &paths);
    free(cdir);
    if (!rc && paths.n == before) out->empty++;
    if (!rc && paths.n > labels_cap) {
      size_t nc = paths.cap;
      int32_t *nl = realloc(labels, nc * sizeof *nl);
      if (!nl) rc = -1;
      else labels = nl, labels_cap = nc;
    }
    for (size_t k = before; !rc && k < paths.n; k++) labels[k] = (int32_t)c;
  }
  if (rc) {
    int saved = errno ? errno : ENOMEM;
    strv_free(&classes);
    strv_free(&paths);
    free(labels);
    memset(out, 0, sizeof *out);
    errno = saved;
    return -1;
  }
  out->paths = paths.v;
  out->n = paths.n;
  out->labels = labels;
  out->classes = classes.v;
  out->n_classes = classes.n;
  return 0;
}

void stoke_image_list_free(stoke_image_list *l) {
  for (size_t i = 0; i < l->n; i++) free(l->paths[i]);
  for (size_t i = 0; i < l->n_classes; i++) free(l->classes[i]);
  free(l->paths);
  free(l->labels);
  free(l->classes);
  memset(l, 0, sizeof *l);
}

void stoke_image_list_empty_names(const stoke_image_list *l, char *buf, size_t cap) {
  size_t *count = calloc(l->n_classes ? l->n_classes : 1, sizeof *count), used = 0, listed = 0;
  buf[0] = 0;
  for (size_t i = 0; count && i < l->n; i++) count[l->labels[i]]++;
  for (size_t c = 0; count && c < l->n_classes && used < cap; c++) {
    if (count[c]) continue;
    if (listed++ == 4) {
      used += (size_t)snprintf(buf + used, cap - used, ", ...");
      break;
    }
    used += (size_t)snprintf(buf + used, cap - used, "%s'%s' (%zu)", listed > 1 ? ", " : "", l->classes[c], c);
  }
  free(count);
  if (l->dangling && used < cap)
    snprintf(buf + used, cap - used, "; %zu links point at nothing (the first: %s)", l->dangling, l->first_dangling);
}
