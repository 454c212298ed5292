#include <stdio.h>
#include <string.h>

#include "config/common.h"
#include "kernels/ops.h"

static long d2h_copies;
long backend_d2h_copies(void) { return __atomic_load_n(&d2h_copies, __ATOMIC_RELAXED); }
void backend_count_d2h(void) { __atomic_fetch_add(&d2h_copies, 1, __ATOMIC_RELAXED); }
static long fp8_reference_gemms;
long backend_fp8_reference_gemms(void) { return __atomic_load_n(&fp8_reference_gemms, __ATOMIC_RELAXED); }
void backend_count_fp8_reference(void) { __atomic_fetch_add(&fp8_reference_gemms, 1, __ATOMIC_RELAXED); }

const char *precision_name(enum precision p) { return p == PRECISION_FP8 ? "fp8" : p == PRECISION_BF16 ? "bf16" : "fp32"; }

const struct backend *backend_table(int cuda, const char *precision) {
    if (!strcmp(precision, "fp32")) return cuda ? &cuda_backend : &cpu_backend;
    if (!strcmp(precision, "bf16")) return cuda ? &cuda_bf16_backend : &cpu_bf16_backend;
    if (!strcmp(precision, "fp8")) return cuda ? &cuda_fp8_backend : &cpu_fp8_backend;
    return NULL;
}

const char *backend_precision_error(const char *device, const char *precision) {
    int gpu = cuda_backend_available() && (!strcmp(device, "cuda") || !strcmp(device, "auto"));
    if (gpu && !strcmp(precision, "fp8") && !cuda_device_has_fp8())
        return "train.precision fp8: this GPU has no FP8 tensor cores (compute capability 8.9 or newer, e.g. H100, "
               "L40S); use train.precision bf16";
    return NULL;
}

/* The device's table at the precision: fp32, or bf16 / fp8 (kernels/bf16_table.h). */
static const struct backend *with_precision(int cuda, const char *device, const char *precision) {
    const struct backend *be = backend_table(cuda, precision);
    const char *why = be ? backend_precision_error(device, precision) : NULL;
    if (!be) fprintf(stderr, "mtrain: error: unknown precision '%s' (expected fp32, bf16 or fp8)\n", precision);
    else if (why) fprintf(stderr, "mtrain: error: %s\n", why);
    return be && !why ? be : NULL;
}

const struct backend *backend_in_device_memory(const struct backend *cpu) {
    static struct backend table;
    CHECK(!strcmp(cpu->name, "cpu") && cuda_backend.alloc && (!table.name || table.precision == cpu->precision));
    table = *cpu;
    table.alloc = cuda_backend.alloc, table.free = cuda_backend.free, table.zero = cuda_backend.zero;
    table.to_host = cuda_backend.to_host, table.from_host = cuda_backend.from_host, table.copy = cuda_backend.copy;
    table.host_view = NULL; /* device memory, as far as the model knows */
    return &table;
}

/* "auto" takes the GPU when this build has the CUDA backend and the machine
 * has a device; "cuda" insists on one. */
const struct backend *backend_get(const char *name, const char *precision) {
    if (!strcmp(name, "cpu")) return with_precision(0, name, precision);
    if (!strcmp(name, "auto")) return with_precision(cuda_backend_available(), name, precision);
    if (!strcmp(name, "cuda")) {
        if (cuda_backend_available()) return with_precision(1, name, precision);
#ifdef MTRAIN_CUDA
        fprintf(stderr, "mtrain: error: train.device cuda: no CUDA device found (%s); use train.device cpu or auto\n",
                cuda_device_error());
#else
        fprintf(stderr, "mtrain: error: train.device cuda: this build of mtrain has no CUDA backend (build where nvcc "
                "is found, CUDA=1); use train.device cpu or auto\n");
#endif
        return NULL;
    }
    fprintf(stderr, "mtrain: error: unknown device '%s' (expected auto, cpu or cuda)\n", name);
    return NULL;
}

#ifdef MTRAIN_CUDA
int cuda_backend_available(void) { return cuda_device_count() > 0; }
#else
const struct backend cuda_backend = {.name = "cuda"}, cuda_bf16_backend = {.name = "cuda"},
                     cuda_fp8_backend = {.name = "cuda"};
int cuda_backend_available(void) { return 0; }
int cuda_device_has_fp8(void) { return 0; }
long cuda_fp8_tensor_core_gemms(int block) {
    (void)block;
    return 0;
}
int cuda_fp8_block_layout_probe(char *msg, size_t n) {
    snprintf(msg, n, "this build has no CUDA backend");
    return -1;
}
long cuda_fp8_cast_check(int format, int k, char *msg, size_t n) {
    (void)format, (void)k;
    snprintf(msg, n, "this build has no CUDA backend");
    return -1;
}
int cuda_device_count(void) { return 0; }
const char *cuda_device_error(void) { return "this build has no CUDA backend"; }
int cuda_device_pci_id(char *buf, int n) {
    if (n > 0) buf[0] = 0;
    return 0;
}
int cuda_device_describe(int dev, char *buf, int n) {
    (void)dev;
    if (n > 0) buf[0] = 0;
    return 0;
}
void cuda_versions(char *buf, int n) { snprintf(buf, n, "none (this build has no CUDA backend)"); }
void cuda_set_tf32(int on) { (void)on; }
void cuda_set_deterministic(int on) { (void)on; }
const char *cuda_attention_last(void) { return "none"; }
void cuda_use_device(int local_rank) { (void)local_rank; }
int cuda_grouped_expert_forward(float *out, const float *x, const float *const *w, const int *off, int E, int K, int M) {
    (void)out, (void)x, (void)w, (void)off, (void)E, (void)K, (void)M;
    return -1;
}
int cuda_grouped_expert_dgrad(float *dx, const float *dout, const float *const *w, const int *off, int E, int K, int M,
                              int accumulate) {
    (void)dx, (void)dout, (void)w, (void)off, (void)E, (void)K, (void)M, (void)accumulate;
    return -1;
}
int cuda_grouped_expert_wgrad(float *const *dw, const float *dout, const float *x, const int *off, int E, int K, int M) {
    (void)dw, (void)dout, (void)x, (void)off, (void)E, (void)K, (void)M;
    return -1;
}
#endif
