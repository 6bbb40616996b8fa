/* sources/jpeg/stderr_shim.c: lets the plugin link Debian's static
 * libjpeg.a into a shared object, so it runs where libjpeg is not installed.
 *
 * The archive is built as position-independent *executable* code: it
 * reaches the C library's `stderr` with a PC-relative relocation that a
 * shared object cannot hold (the linker stops with "relocation R_X86_64_PC32
 * against symbol `stderr@@GLIBC_2.2.5' can not be used when making a shared
 * object"). Its other symbols are made local with -Wl,--exclude-libs,ALL
 * (see BUILD); for `stderr` this file gives it a hidden definition of its
 * own, which the linker binds to first, and points it at the C library's
 * stream when the plugin registers. The decoder's message hooks are
 * replaced by the plugin, so it never prints in normal use. Same approach
 * as sources/lmdb/stderr_shim.c.
 *
 * No <stdio.h> here: it declares `stderr` with another type. */
#include <dlfcn.h>

__attribute__((visibility("hidden"))) void *stderr;

__attribute__((visibility("hidden"))) void stoke_jpeg_stderr_init(void) {
  void **libc_stderr = dlsym(RTLD_DEFAULT, "stderr");
  stderr = libc_stderr ? *libc_stderr : (void *)0;
}
