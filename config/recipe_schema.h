/* Internal to config/: the schema table of recipe keys and the helpers the
 * YAML loader, --set and validation share. Other folders use recipe.h. */
#pragma once
#include <stddef.h>

#include "config/recipe.h"

enum recipe_type { KEY_INT, KEY_UINT64, KEY_DOUBLE, KEY_BOOL, KEY_STRING, KEY_ENUM, KEY_BLEND };

/* Range bounds are inclusive unless the flag makes them exclusive. */
#define KEY_MIN_EXCL 1u
#define KEY_MAX_EXCL 2u

struct recipe_key {
    const char *name;     /* "section.key" */
    enum recipe_type type;
    size_t offset;        /* into struct recipe */
    size_t size;          /* bytes of the field (string capacity) */
    const char *def;      /* default, as YAML text: parsed like a user value */
    double min, max;      /* numeric range; max HUGE_VAL when unbounded */
    unsigned flags;
    const char *choices;  /* KEY_ENUM: "a|b|c" */
    const char *doc;
};

extern const struct recipe_key recipe_keys[];
extern const int recipe_nkeys;
extern const char *const recipe_sections[];

/* Index of "section.key" in recipe_keys, or -1. */
int recipe_key_index(const char *name);
/* Parse text as the key's type, check its range and store it in r.
 * quoted: the YAML scalar was quoted (a quoted string is never null).
 * On error returns -1 and writes a message (no key, no location) to err. */
int recipe_key_assign(const struct recipe_key *k, struct recipe *r, const char *text, int quoted,
                      char *err, size_t errsz);
/* Append one {path, weight} to a data.blend list; -1 with a message in err. */
int recipe_blend_append(struct data_blend *b, const char *path, double weight, char *err, size_t errsz);
/* Write "did you mean 'x'?" hints for an unknown section (key NULL) or key;
 * writes "" when nothing is close. */
void recipe_suggest(const char *section, const char *key, char *out, size_t n);
/* Where key got its value: "FILE:LINE:COL", "--set" or "FILE (default)". */
void recipe_where(const struct recipe *r, int key, char *out, size_t n);
