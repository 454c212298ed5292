#include <string.h>

#include "config/common.h"
#include "kernels/ops.h"

const struct backend *backend_get(const char *name) {
    if (!strcmp(name, "cpu") || !strcmp(name, "auto")) return &cpu_backend;
    if (!strcmp(name, "cuda")) {
        warn("this build of mtrain has no CUDA backend");
        return NULL;
    }
    warn("unknown device '%s' (expected auto, cpu or cuda)", name);
    return NULL;
}
