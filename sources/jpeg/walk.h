/* sources/jpeg/walk.h: the images of an ImageFolder (ROOT/CLASS/.../IMAGE.jpg)
 * as torchvision's ImageFolder lists them, for the jpeg source and
 * tools/convert alike. */
#ifndef STOKE_JPEG_WALK_H
#define STOKE_JPEG_WALK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The list. Classes: the root's folders sorted by name (hidden ones too),
 * labels 0..C-1. A class's images: the .jpg/.jpeg files (any case) that
 * os.walk(class, followlinks=True) finds, in torchvision's order: folders
 * by path, files sorted within each; symbolic links to files and to
 * folders are followed. Where ImageFolder would loop forever, stoke does
 * not: a folder reached again below itself (a link to itself or to an
 * ancestor, e.g. c0/up -> ..) is skipped, and so are /proc, /sys and the
 * like (not data; counted in `pseudo`). A sub-folder that cannot be read
 * is skipped (os.walk's default), counted in `unreadable`. */
typedef struct stoke_image_list {
  char **paths;      /* [n] */
  int32_t *labels;   /* [n] */
  size_t n;
  char **classes;    /* [n_classes] folder names */
  size_t n_classes;
  size_t empty;      /* classes without an image */
  size_t other;      /* files that are not .jpg/.jpeg */
  size_t loops, pseudo, unreadable;
  size_t dangling;   /* links whose target is not there (an unmounted disk): neither file nor folder */
  char first_dangling[512];
  char first_skipped[512]; /* the first folder skipped, and why */
  char first_other[512];   /* the first file that is not a JPEG */
  unsigned long long root_dev, root_ino; /* the root's identity (a loop's end too) */
} stoke_image_list;

/* 0, or -1 with errno (ENOENT, ENOTDIR: `root` is not a folder; ENOMEM;
 * or why the root cannot be listed). An empty list is no error here. */
int stoke_walk_image_folder(const char *root, stoke_image_list *out);
void stoke_image_list_free(stoke_image_list *l);
/* The class folder names of `root` alone, sorted as the walk sorts them
 * (the labels' order); free each and the array. 0, or -1 with errno. */
int stoke_list_class_folders(const char *root, char ***names, size_t *n);
/* The classes without an image, as "'b' (1), 'd' (3)" (name and label; the
 * first four, then ", ..."), and the links to nothing after them, into buf:
 * what the jpeg source's and convert's refusals name. */
void stoke_image_list_empty_names(const stoke_image_list *l, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
