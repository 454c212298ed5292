/* A machine for `mtrain plan` (model/plan.h): what one accelerator (or one
 * CPU rank) computes and moves, as data. A system file is a YAML subset:
 * one `key: value` per line, `#` comments; curves are `size:efficiency`
 * pairs in one string. Shipped files: recipes/systems/NAME.yaml (datasheet
 * numbers, each line saying where it came from); `mtrain plan --calibrate`
 * writes one from measurements. */
#pragma once
#include <stddef.h>

#define SYSTEM_CURVE_MAX 16
#define SYSTEM_NAME_MAX 64

/* efficiency (of the peak) as a function of an op's size, interpolated in log(size), flat past the ends */
struct system_curve {
    int n;
    double size[SYSTEM_CURVE_MAX], eff[SYSTEM_CURVE_MAX];
};

struct system_spec {
    char name[SYSTEM_NAME_MAX];
    int per_node;                    /* accelerators (ranks) per node */
    double tflops_bf16, tflops_fp8, tflops_fp32; /* dense peak per accelerator */
    double mem_gib;                  /* device memory */
    double mem_gbps;                 /* device memory bandwidth, GB/s */
    double mem_eff;                  /* the share of it memory-bound ops reach */
    double intra_gbps, intra_lat_us; /* one direction per accelerator inside a node, and the latency of a step */
    double inter_gbps, inter_lat_us; /* ... between nodes (its share of the node's network) */
    struct system_curve gemm;        /* GEMM efficiency by FLOPs per call */
    struct system_curve gemm_fp8;    /* FP8 GEMMs' efficiency of tflops_fp8 (none given: gemm's) */
    struct system_curve attention;   /* attention efficiency by FLOPs per call */
};

/* Load path into s; 0, or -1 with err (file:line: what was expected). */
int system_load(struct system_spec *s, const char *path, char *err, size_t errlen);
/* The efficiency of an op of `size` on curve c (1 if the curve is empty). */
double system_curve_at(const struct system_curve *c, double size);
/* Write s as a system file (the same format). */
int system_write(const struct system_spec *s, const char *path, const char *comment);
