/* Loading a recipe from YAML and applying --set overrides. The recipe is a
 * two-level mapping (section -> key -> scalar), so libyaml's event API is
 * walked directly: every event carries a mark, and the walk knows which key
 * it is on when something goes wrong, so each error names FILE:LINE:COL and
 * the key. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

#include "config/recipe_schema.h"

#define NAME_MAX_LEN 128

struct loader {
    yaml_parser_t parser;
    const char *path;
    struct recipe *r;
    char where[2 * NAME_MAX_LEN];         /* section or section.key being read */
    int after;                          /* where names a finished key */
    int section_line[16];               /* 1-based line a section was opened, 0 if not yet */
};

/* Print "mtrain: error: FILE:LINE:COL: key 'K': message" (libyaml marks are 0-based). */
static int load_error(const struct loader *L, yaml_mark_t m, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int load_error(const struct loader *L, yaml_mark_t m, const char *key, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    fprintf(stderr, "mtrain: error: %s:%zu:%zu: ", L->path, m.line + 1, m.column + 1);
    if (key) fprintf(stderr, "key '%s': ", key);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return -1;
}

/* Syntax errors come from libyaml while scanning ahead, so the key is the
 * one being read or the last one finished ("after key ..."). */
static int syntax_error(const struct loader *L) {
    const yaml_parser_t *p = &L->parser;
    char ctx[160] = "";
    if (p->context)
        snprintf(ctx, sizeof ctx, " (%s at line %zu)", p->context, p->context_mark.line + 1);
    fflush(stdout);
    fprintf(stderr, "mtrain: error: %s:%zu:%zu: ", L->path, p->problem_mark.line + 1, p->problem_mark.column + 1);
    if (L->where[0]) fprintf(stderr, "%skey '%s': ", L->after ? "after " : "", L->where);
    fprintf(stderr, "YAML syntax error: %s%s\n", p->problem ? p->problem : "malformed YAML", ctx);
    return -1;
}

static int next_event(struct loader *L, yaml_event_t *e) {
    if (!yaml_parser_parse(&L->parser, e)) return syntax_error(L);
    return 0;
}

static const char *event_kind(yaml_event_type_t t) {
    switch (t) {
    case YAML_MAPPING_START_EVENT: return "a mapping";
    case YAML_SEQUENCE_START_EVENT: return "a list";
    case YAML_ALIAS_EVENT: return "an alias (aliases are not supported)";
    case YAML_SCALAR_EVENT: return "a scalar";
    default: return "something else";
    }
}

static int is_null_scalar(const yaml_event_t *e) {
    const char *v = (const char *)e->data.scalar.value;
    return e->data.scalar.style == YAML_PLAIN_SCALAR_STYLE && (!*v || !strcmp(v, "~") || !strcmp(v, "null"));
}

static int find_section(const char *name) {
    for (int i = 0; recipe_sections[i]; i++)
        if (!strcmp(recipe_sections[i], name)) return i;
    return -1;
}

/* One {path: DIR, weight: W} entry of data.blend; e is its MAPPING_START. */
static int load_blend_entry(struct loader *L, struct data_blend *b, const yaml_event_t *start, const char *name) {
    char path[RECIPE_PATH_MAX] = "", err[256];
    double weight = NAN;
    for (;;) {
        yaml_event_t k, v;
        if (next_event(L, &k)) return -1;
        if (k.type == YAML_MAPPING_END_EVENT) break;
        if (k.type != YAML_SCALAR_EVENT) {
            yaml_event_delete(&k);
            return load_error(L, start->start_mark, name, "entry %d: expected 'path' and 'weight' fields", b->n);
        }
        if (next_event(L, &v)) return yaml_event_delete(&k), -1;
        const char *key = (const char *)k.data.scalar.value;
        const char *val = v.type == YAML_SCALAR_EVENT ? (const char *)v.data.scalar.value : NULL;
        char *end = NULL;
        int rc = 0;
        if (!val) rc = load_error(L, v.start_mark, name, "entry %d: '%s' needs a single value", b->n, key);
        else if (!strcmp(key, "path")) snprintf(path, sizeof path, "%s", val);
        else if (!strcmp(key, "weight") && ((weight = strtod(val, &end)), end == val || *end))
            rc = load_error(L, v.start_mark, name, "entry %d: weight '%s' is not a number", b->n, val);
        else if (strcmp(key, "weight"))
            rc = load_error(L, k.start_mark, name, "entry %d: unknown field '%s' (path, weight)", b->n, key);
        yaml_event_delete(&k);
        yaml_event_delete(&v);
        if (rc) return -1;
    }
    if (!path[0] || isnan(weight))
        return load_error(L, start->start_mark, name, "entry %d: needs both path and weight", b->n);
    if (recipe_blend_append(b, path, weight, err, sizeof err)) return load_error(L, start->start_mark, name, "%s", err);
    return 0;
}

/* data.blend: a list of {path, weight} mappings. */
static int load_blend(struct loader *L, int idx, const char *name) {
    struct data_blend *b = (struct data_blend *)((char *)L->r + recipe_keys[idx].offset);
    memset(b, 0, sizeof *b);
    for (;;) {
        yaml_event_t e;
        if (next_event(L, &e)) return -1;
        int rc = 0;
        if (e.type == YAML_SEQUENCE_END_EVENT) return yaml_event_delete(&e), 0;
        if (e.type == YAML_MAPPING_START_EVENT) rc = load_blend_entry(L, b, &e, name);
        else rc = load_error(L, e.start_mark, name, "expected a list of {path: DIR, weight: W}, got %s",
                             event_kind(e.type));
        yaml_event_delete(&e);
        if (rc) return -1;
    }
}

/* The value of one key: a scalar parsed by the schema. */
static int load_value(struct loader *L, int idx, const char *name) {
    yaml_event_t e;
    if (next_event(L, &e)) return -1;
    int rc = 0;
    char err[256];
    if (recipe_keys[idx].type == KEY_BLEND && e.type == YAML_SEQUENCE_START_EVENT) {
        rc = load_blend(L, idx, name);
    } else if (e.type != YAML_SCALAR_EVENT) {
        rc = load_error(L, e.start_mark, name, "expected a single value, got %s", event_kind(e.type));
    } else if (strlen((const char *)e.data.scalar.value) != e.data.scalar.length) {
        rc = load_error(L, e.start_mark, name, "value contains a NUL character");
    } else if (recipe_key_assign(&recipe_keys[idx], L->r, (const char *)e.data.scalar.value,
                                 e.data.scalar.style != YAML_PLAIN_SCALAR_STYLE, err, sizeof err)) {
        /* a plain value that runs onto the next line is almost always a
         * mis-indented key below it */
        int runs_on = e.data.scalar.style == YAML_PLAIN_SCALAR_STYLE && e.end_mark.line > e.start_mark.line;
        char hint[96] = "";
        if (runs_on)
            snprintf(hint, sizeof hint, " (the value runs onto line %zu: check that line's indentation)",
                     e.end_mark.line + 1);
        rc = load_error(L, e.start_mark, name, "%s%s", err, hint);
    }
    yaml_event_delete(&e);
    return rc;
}

/* One "key: value" line of a section. e is the key's event. */
static int load_key(struct loader *L, const char *section, const yaml_event_t *e) {
    char name[2 * NAME_MAX_LEN], hint[160];
    if (e->type != YAML_SCALAR_EVENT)
        return load_error(L, e->start_mark, section, "expected a key name, got %s", event_kind(e->type));
    const char *key = (const char *)e->data.scalar.value;
    snprintf(name, sizeof name, "%s.%s", section, key);
    snprintf(L->where, sizeof L->where, "%s", name);
    L->after = 0;
    int idx = recipe_key_index(name);
    if (idx < 0) {
        recipe_suggest(section, key, hint, sizeof hint);
        return load_error(L, e->start_mark, name, "unknown key%s", hint);
    }
    struct recipe_mark *m = &L->r->marks[idx];
    if (m->line > 0)
        return load_error(L, e->start_mark, name, "duplicate key (first set at line %d)", m->line);
    if (load_value(L, idx, name)) return -1;
    m->line = (int)e->start_mark.line + 1;
    m->col = (int)e->start_mark.column + 1;
    L->after = 1;
    return 0;
}

static int load_keys(struct loader *L, const char *section) {
    for (;;) {
        yaml_event_t e;
        if (next_event(L, &e)) return -1;
        if (e.type == YAML_MAPPING_END_EVENT) return yaml_event_delete(&e), 0;
        int rc = load_key(L, section, &e);
        yaml_event_delete(&e);
        if (rc) return -1;
    }
}

/* The value of a section: a mapping of keys, or empty ("log:" alone). */
static int load_section_body(struct loader *L, const char *section) {
    yaml_event_t e;
    if (next_event(L, &e)) return -1;
    int rc = 0;
    if (e.type == YAML_MAPPING_START_EVENT) rc = load_keys(L, section);
    else if (e.type != YAML_SCALAR_EVENT || !is_null_scalar(&e))
        rc = load_error(L, e.start_mark, section, "section must be a mapping of 'key: value' lines, got %s",
                        e.type == YAML_SCALAR_EVENT ? "a scalar" : event_kind(e.type));
    yaml_event_delete(&e);
    return rc;
}

/* One "section:" entry of the top-level mapping. e is the name's event. */
static int load_section(struct loader *L, const yaml_event_t *e) {
    char section[NAME_MAX_LEN], hint[160];
    if (e->type != YAML_SCALAR_EVENT)
        return load_error(L, e->start_mark, NULL, "expected a section name, got %s", event_kind(e->type));
    snprintf(section, sizeof section, "%s", (const char *)e->data.scalar.value);
    snprintf(L->where, sizeof L->where, "%s", section);
    L->after = 0;
    int s = find_section(section);
    if (s < 0) {
        recipe_suggest(section, NULL, hint, sizeof hint);
        char names[256] = "";
        for (int i = 0; recipe_sections[i]; i++) /* the schema's list, so it never goes stale */
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", recipe_sections[i]);
        return load_error(L, e->start_mark, section, "unknown section%s; sections are %s", hint, names);
    }
    if (L->section_line[s])
        return load_error(L, e->start_mark, section, "duplicate section (first at line %d)", L->section_line[s]);
    L->section_line[s] = (int)e->start_mark.line + 1;
    return load_section_body(L, section);
}

static int load_sections(struct loader *L) {
    for (;;) {
        yaml_event_t e;
        if (next_event(L, &e)) return -1;
        if (e.type == YAML_MAPPING_END_EVENT) return yaml_event_delete(&e), 0;
        int rc = load_section(L, &e);
        yaml_event_delete(&e);
        if (rc) return -1;
    }
}

/* The type and mark of the next event, for the fixed frame around the sections. */
static int next_type(struct loader *L, yaml_event_type_t *type, yaml_mark_t *mark) {
    yaml_event_t e;
    if (next_event(L, &e)) return -1;
    *type = e.type;
    *mark = e.start_mark;
    yaml_event_delete(&e);
    return 0;
}

/* stream: at most one document whose root is the mapping of sections. */
static int load_stream(struct loader *L) {
    yaml_event_type_t t;
    yaml_mark_t m;
    if (next_type(L, &t, &m)) return -1;  /* stream start */
    if (next_type(L, &t, &m)) return -1;  /* document start */
    if (t == YAML_STREAM_END_EVENT) return 0;  /* empty file: all defaults */
    if (next_type(L, &t, &m)) return -1;
    if (t != YAML_MAPPING_START_EVENT)
        return load_error(L, m, NULL, "the recipe must be a mapping of sections (model:, train:, ...), got %s",
                          event_kind(t));
    if (load_sections(L)) return -1;
    if (next_type(L, &t, &m)) return -1;  /* document end */
    if (next_type(L, &t, &m)) return -1;
    if (t != YAML_STREAM_END_EVENT)
        return load_error(L, m, NULL, "only one YAML document is allowed (found '---')");
    return 0;
}

int recipe_load(struct recipe *r, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fflush(stdout);
        fprintf(stderr, "mtrain: error: cannot open recipe %s: %s\n", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        fflush(stdout);
        fprintf(stderr, "mtrain: error: recipe %s is a directory; give a YAML file (e.g. recipes/tiny-llama3.yaml)\n", path);
        return -1;
    }
    /* load into a copy so a failed load leaves r as it was */
    struct recipe *tmp = malloc(sizeof *tmp);
    struct loader L = {.path = path, .r = tmp};
    if (!tmp || !yaml_parser_initialize(&L.parser)) {
        fprintf(stderr, "mtrain: error: out of memory loading recipe %s\n", path);
        free(tmp);
        fclose(f);
        return -1;
    }
    *tmp = *r;
    snprintf(tmp->source, sizeof tmp->source, "%s", path);
    for (int i = 0; i < recipe_nkeys; i++)
        if (tmp->marks[i].line > 0) tmp->marks[i] = (struct recipe_mark){0, 0};
    yaml_parser_set_input_file(&L.parser, f);
    int rc = load_stream(&L);
    yaml_parser_delete(&L.parser);
    if (ferror(f) && rc == 0) {
        fprintf(stderr, "mtrain: error: cannot read recipe %s\n", path);
        rc = -1;
    }
    fclose(f);  /* read-only: nothing to lose on close */
    if (rc == 0) *r = *tmp;
    free(tmp);
    return rc;
}

/* ---- --set section.key=value ---- */

static int set_error(const char *assignment, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int set_error(const char *assignment, const char *key, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    fprintf(stderr, "mtrain: error: --set %s: ", assignment);
    if (key) fprintf(stderr, "key '%s': ", key);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return -1;
}

static int set_unknown(const char *assignment, const char *name) {
    char section[NAME_MAX_LEN], hint[160];
    const char *dot = strchr(name, '.');
    if (!dot || dot == name || !dot[1]) {
        recipe_suggest("", name, hint, sizeof hint);  /* "lr" alone: name its section */
        return set_error(assignment, NULL, "expected section.key=value, e.g. optimizer.lr=3e-4%s", hint);
    }
    snprintf(section, sizeof section, "%.*s", (int)(dot - name), name);
    if (find_section(section) < 0) {
        recipe_suggest(section, NULL, hint, sizeof hint);
        return set_error(assignment, name, "unknown section '%s'%s", section, hint);
    }
    recipe_suggest(section, dot + 1, hint, sizeof hint);
    return set_error(assignment, name, "unknown key%s", hint);
}

int recipe_set(struct recipe *r, const char *assignment) {
    char name[NAME_MAX_LEN], value[RECIPE_PATH_MAX + 2], err[256];
    const char *eq = strchr(assignment, '=');
    if (!eq) return set_error(assignment, NULL, "expected section.key=value, e.g. optimizer.lr=3e-4");
    size_t nlen = (size_t)(eq - assignment);
    if (nlen >= sizeof name) return set_error(assignment, NULL, "key name too long");
    memcpy(name, assignment, nlen);
    name[nlen] = 0;
    int idx = recipe_key_index(name);
    if (idx < 0) return set_unknown(assignment, name);
    const struct recipe_key *k = &recipe_keys[idx];
    /* a value quoted for YAML ('"x"' or "'x'") is a quoted string, as in a file */
    size_t vlen = strlen(eq + 1);
    if (vlen >= sizeof value) return set_error(assignment, name, "value too long");
    memcpy(value, eq + 1, vlen + 1);
    int quoted = vlen >= 2 && (value[0] == '"' || value[0] == '\'') && value[vlen - 1] == value[0];
    if (quoted) {
        memmove(value, value + 1, vlen - 2);
        value[vlen - 2] = 0;
    }
    if (recipe_key_assign(k, r, value, quoted, err, sizeof err)) return set_error(assignment, name, "%s", err);
    r->marks[idx] = (struct recipe_mark){RECIPE_MARK_SET, 0};
    return 0;
}
