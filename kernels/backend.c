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
        warn("device cuda: no CUDA device found (%s)", cuda_device_error());
#else
        warn("device cuda: this build of mtrain has no CUDA backend (build where nvcc is found, CUDA=1)");
#endif
        return NULL;
    }
    warn("unknown device '%s' (expected auto, cpu or cuda)", name);
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
