/* stoke/config.h: the strict INI config (host side). Every key is declared
 * with a type, default, range and help; the file is read with inih. */
#ifndef STOKE_CONFIG_H
#define STOKE_CONFIG_H

#include <stdio.h>

#include "stoke/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Longest accepted INI line; longer lines are an error, never truncated. */
#define STOKE_CFG_MAX_LINE 4096

stoke_cfg *stoke_cfg_new(void);
void stoke_cfg_free(stoke_cfg *c);

/* Declare keys of `section`. A section may be declared in several calls
 * (core keys first, a plugin's keys later). Declaring a key twice is
 * STOKE_E_DUPLICATE. `section_help` may be NULL after the first call. */
stoke_err *stoke_cfg_declare(stoke_cfg *c, const char *section,
                             const char *section_help,
                             const stoke_cfg_key_v1 *keys, int n);

/* Read an INI file (entries are kept raw with their file:line; values are
 * checked when read and by stoke_cfg_validate). Errors: missing file,
 * syntax, over-long line, a key given twice in one section. */
stoke_err *stoke_cfg_load_file(stoke_cfg *c, const char *path);
/* Same, from a string; `name` stands for the file name in messages. */
stoke_err *stoke_cfg_load_string(stoke_cfg *c, const char *name,
                                 const char *text);
/* One command-line override "section.key=value"; it wins over the file.
 * Messages say "command line: optimizer.lr=...". */
stoke_err *stoke_cfg_override(stoke_cfg *c, const char *assignment);

/* Every entry given must be a declared section/key with a valid value;
 * the first problem is returned, as
 *   run.ini:42: [optimizer] unknown key 'momentun' (did you mean 'momentum'?)
 * Call after every plugin has declared its keys. */
stoke_err *stoke_cfg_validate(const stoke_cfg *c);
/* The same for every section but the `n_later` named, whose keys parts
 * declare once they are loaded ([model], [data], ...): a typo in the core's
 * own sections ([run], [plugins]) or in a section's name is found before
 * any plugin is looked for. */
stoke_err *stoke_cfg_validate_but(const stoke_cfg *c, const char *const *later, int n_later);

/* Typed reads (also in the host table): the value given, else the default.
 * Reading an undeclared key or with the wrong type is STOKE_E_INTERNAL;
 * a bad value is STOKE_E_INVALID with file:line. */
stoke_err *stoke_cfg_int(const stoke_cfg *c, const char *section,
                         const char *key, int64_t *out);
stoke_err *stoke_cfg_float(const stoke_cfg *c, const char *section,
                           const char *key, double *out);
stoke_err *stoke_cfg_bool(const stoke_cfg *c, const char *section,
                          const char *key, int *out);
stoke_err *stoke_cfg_str(const stoke_cfg *c, const char *section,
                         const char *key, const char **out);
stoke_err *stoke_cfg_ints(const stoke_cfg *c, const char *section,
                          const char *key, int64_t *out, int *n);
/* LIST: up to STOKE_CFG_MAX_LIST names, each trimmed; strings live as long
 * as the config. */
stoke_err *stoke_cfg_list(const stoke_cfg *c, const char *section,
                          const char *key, const char **out, int *n);
const char *stoke_cfg_where(const stoke_cfg *c, const char *section,
                            const char *key);
/* 1 if the key was given in the file or on the command line. */
int stoke_cfg_is_set(const stoke_cfg *c, const char *section,
                     const char *key);
/* Drop the file's entries of `section` whose key is not declared (the keys
 * of a part the command line switched away from); how many, and their
 * "key (file:line)" list in `dropped`. */
int stoke_cfg_drop_undeclared(stoke_cfg *c, const char *section, char *dropped, size_t cap);
/* How many keys the file (not the command line) gave: 0 for an empty one. */
int stoke_cfg_file_keys(const stoke_cfg *c);

/* The resolved config as INI text (every declared key, defaults included,
 * each with a "; help" comment), for printing at start and saving with
 * the run. */
void stoke_cfg_dump(const stoke_cfg *c, FILE *f);
/* `train --help-config`: every section and key with type, default, range,
 * choices and help. */
void stoke_cfg_help(const stoke_cfg *c, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
