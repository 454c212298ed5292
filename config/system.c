/* System files for `mtrain plan` (config/system.h). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/system.h"

struct field {
    const char *key;
    size_t off;
};
#define F(name) {#name, offsetof(struct system_spec, name)}
static const struct field numbers[] = {
    F(tflops_bf16), F(tflops_fp8), F(tflops_fp32), F(mem_gib),      F(mem_gbps),     F(mem_eff),
    F(intra_gbps),  F(intra_lat_us), F(inter_gbps), F(inter_lat_us),
};
#undef F

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
    return s;
}

/* "1e9:0.2 1e12:0.7" -> c, sizes ascending */
static int parse_curve(struct system_curve *c, char *v) {
    c->n = 0;
    for (char *tok = strtok(v, " \t\""); tok; tok = strtok(NULL, " \t\"")) {
        char *colon = strchr(tok, ':'), *end;
        if (!colon || c->n == SYSTEM_CURVE_MAX) return -1;
        *colon = 0;
        double size = strtod(tok, &end);
        if (*end || size <= 0) return -1;
        double eff = strtod(colon + 1, &end);
        if (*end || eff <= 0 || eff > 1) return -1;
        if (c->n && size <= c->size[c->n - 1]) return -1;
        c->size[c->n] = size, c->eff[c->n++] = eff;
    }
    return 0;
}

int system_load(struct system_spec *s, const char *path, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    s->per_node = 8, s->mem_eff = 0.8;
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    char line[4096];
    int lineno = 0, rc = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char *l = trim(line);
        if (!*l) continue;
        char *colon = strchr(l, ':');
        if (!colon) {
            snprintf(err, errlen, "%s:%d: expected `key: value`", path, lineno);
            rc = -1;
            break;
        }
        *colon = 0;
        char *key = trim(l), *val = trim(colon + 1), *end;
        if (!strcmp(key, "name")) {
            snprintf(s->name, sizeof s->name, "%s", val);
        } else if (!strcmp(key, "per_node")) {
            long n = strtol(val, &end, 10);
            if (*end || n < 1 || n > 1024) {
                snprintf(err, errlen, "%s:%d: per_node: expected an integer from 1 to 1024, got '%s'", path, lineno, val);
                rc = -1;
            }
            s->per_node = (int)n;
        } else if (!strcmp(key, "gemm") || !strcmp(key, "gemm_fp8") || !strcmp(key, "attention")) {
            struct system_curve *c = !strcmp(key, "gemm")       ? &s->gemm
                                     : !strcmp(key, "gemm_fp8") ? &s->gemm_fp8
                                                                : &s->attention;
            if (parse_curve(c, val) != 0) {
                snprintf(err, errlen, "%s:%d: %s: expected \"size:efficiency ...\" with sizes ascending and "
                         "efficiencies in (0, 1], at most %d", path, lineno, key, SYSTEM_CURVE_MAX);
                rc = -1;
            }
        } else {
            size_t i = 0, n = sizeof numbers / sizeof *numbers;
            while (i < n && strcmp(numbers[i].key, key)) i++;
            if (i == n) {
                snprintf(err, errlen, "%s:%d: unknown key '%s'", path, lineno, key);
                rc = -1;
                break;
            }
            double v = strtod(val, &end);
            if (*end || !isfinite(v) || v < 0) {
                snprintf(err, errlen, "%s:%d: %s: expected a number >= 0, got '%s'", path, lineno, key, val);
                rc = -1;
            }
            *(double *)((char *)s + numbers[i].off) = v;
        }
    }
    if (!rc && ferror(f)) snprintf(err, errlen, "%s: read error", path), rc = -1;
    fclose(f);
    if (rc) return rc;
    const char *missing = !s->tflops_bf16 ? "tflops_bf16" : !s->mem_gbps ? "mem_gbps" : !s->mem_gib ? "mem_gib"
                        : !s->intra_gbps ? "intra_gbps" : !s->inter_gbps ? "inter_gbps" : NULL;
    if (missing) {
        snprintf(err, errlen, "%s: %s is required (and > 0)", path, missing);
        return -1;
    }
    if (!s->tflops_fp8) s->tflops_fp8 = s->tflops_bf16;
    if (!s->tflops_fp32) s->tflops_fp32 = s->tflops_bf16;
    if (!s->name[0]) snprintf(s->name, sizeof s->name, "%s", path);
    return 0;
}

double system_curve_at(const struct system_curve *c, double size) {
    if (!c->n) return 1.0;
    if (size <= c->size[0]) return c->eff[0];
    if (size >= c->size[c->n - 1]) return c->eff[c->n - 1];
    int i = 1;
    while (c->size[i] < size) i++;
    double t = log(size / c->size[i - 1]) / log(c->size[i] / c->size[i - 1]);
    return c->eff[i - 1] + t * (c->eff[i] - c->eff[i - 1]);
}

static void write_curve(FILE *f, const char *key, const struct system_curve *c) {
    fprintf(f, "%s: \"", key);
    for (int i = 0; i < c->n; i++) fprintf(f, "%s%.4g:%.4f", i ? " " : "", c->size[i], c->eff[i]);
    fprintf(f, "\"\n");
}

int system_write(const struct system_spec *s, const char *path, const char *comment) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "%s", comment);
    fprintf(f, "name: %s\nper_node: %d\n", s->name, s->per_node);
    for (size_t i = 0; i < sizeof numbers / sizeof *numbers; i++)
        fprintf(f, "%s: %.6g\n", numbers[i].key, *(const double *)((const char *)s + numbers[i].off));
    write_curve(f, "gemm", &s->gemm);
    if (s->gemm_fp8.n) write_curve(f, "gemm_fp8", &s->gemm_fp8);
    write_curve(f, "attention", &s->attention);
    int bad = ferror(f);
    if (fclose(f) != 0) bad = 1;
    return bad ? -1 : 0;
}
