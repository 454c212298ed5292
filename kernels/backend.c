#include <stdio.h>
#include <string.h>

#include "config/common.h"
#include "kernels/ops.h"

/* "auto" takes the GPU when this build has the CUDA backend and the machine
 * has a device; "cuda" insists on one. */
const struct backend *backend_get(const char *name) {
    if (!strcmp(name, "cpu")) return &cpu_backend;
    if (!strcmp(name, "auto")) return cuda_backend_available() ? &cuda_backend : &cpu_backend;
    if (!strcmp(name, "cuda")) {
        if (cuda_backend_available()) return &cuda_backend;
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
const struct backend cuda_backend = {.name = "cuda"};
int cuda_backend_available(void) { return 0; }
void cuda_set_tf32(int on) { (void)on; }
void cuda_use_device(int local_rank) { (void)local_rank; }
#endif
