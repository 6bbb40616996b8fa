/* sources/lmdb/stderr_shim.c: lets the plugin link Debian's static liblmdb.a
 * and libjpeg.a into a shared object, so it runs where neither is installed.
 *
 * Those archives are built as position-independent *executable* code: they
 * reach the C library's `stderr` with a PC-relative relocation that a
 * shared object cannot hold (the linker stops with "relocation R_X86_64_PC32
 * against symbol `stderr@@GLIBC_2.2.5' can not be used when making a shared
 * object"). Their other symbols are made local with
 * -Wl,--exclude-libs,ALL (see BUILD); for `stderr` this file gives them a
 * hidden definition of their own, which the linker binds to first, and
 * points it at the C library's stream when the plugin registers. LMDB
 * writes to it only right before an internal assertion aborts; the JPEG
 * decoder's message hooks are replaced by the plugin, so neither prints in
 * normal use.
 *
 * No <stdio.h> here: it declares `stderr` with another type. */
#include <dlfcn.h>

__attribute__((visibility("hidden"))) void *stderr;

__attribute__((visibility("hidden"))) void stoke_lmdb_stderr_init(void) {
  void **libc_stderr = dlsym(RTLD_DEFAULT, "stderr");
  stderr = libc_stderr ? *libc_stderr : (void *)0;
}
