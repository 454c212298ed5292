/* cuDNN's fused attention graphs (kernels/cuda/cudnn_attention.cu) without
 * a GPU: each forward and backward graph mtrain builds is handed to cuDNN
 * with the properties of an H100 SXM (tests/unit/cudnn_h100.json: its
 * cudaDeviceProp values in cuDNN's device-property JSON), and an engine must
 * accept it: cuDNN's fused flash-attention engines match the graph against
 * their pattern, check shapes and types, and get as far as loading the
 * compiled kernel, which needs a driver (with cuDNN 9.19, the engines must
 * be its fused attention ones, 2 and 6, not a generic fusion engine).
 * Running it, and its numbers against the CPU, is test_cuda_bf16's part on
 * a GPU. A graph cuDNN has no engine for (heads 6 over 4 kv heads) shows
 * the check can fail.
 *
 * cuDNN needs libcuda.so.1 to get that far: without a driver the CUDA
 * toolkit's stub library stands in (every call of it fails, which is the
 * "needs a driver" end above). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef MTRAIN_CUDA
#include "kernels/cuda/cudnn_attention.h"
#include "tests/unit/check.h"

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = calloc(1, 1 << 16);
    size_t n = buf ? fread(buf, 1, (1 << 16) - 1, f) : 0;
    fclose(f);
    if (!n) {
        free(buf);
        return NULL;
    }
    return buf;
}

static void load_driver_or_stub(void) {
    if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL)) return;
    const char *home = getenv("CUDA_HOME");
    char path[512];
    snprintf(path, sizeof path, "%s/lib64/stubs/libcuda.so", home ? home : "/usr/local/cuda");
    if (!dlopen(path, RTLD_NOW | RTLD_GLOBAL)) printf("note: no libcuda.so.1 and no stub at %s\n", path);
}

static const char *json;
static int v9_19; /* cuDNN 9.19: its fused attention engines are 2 (forward) and 6 (backward) */

static void accepted(const char *name, struct sdpa_shape s, int backward, int expect) {
    char msg[1024], engine[32];
    int r = cudnn_attention_check(json, &s, backward, msg, sizeof msg);
    snprintf(engine, sizeof engine, "engine %d ", backward ? 6 : 2);
    /* (a single query row, T 1, is another engine's: cuDNN's decode path) */
    int right_engine = !expect || !v9_19 || s.T == 1 || !strncmp(msg, engine, strlen(engine));
    TEST_RESULT(name, r == expect && right_engine, "expected %s, got %d: %s", expect ? engine : "no engine", r, msg);
}

int main(void) {
    json = slurp("tests/unit/cudnn_h100.json");
    if (!json) {
        TEST_FAIL("cudnn_device_json", "cannot read tests/unit/cudnn_h100.json (run from the repository root)");
        TEST_EXIT();
    }
    load_driver_or_stub();
    char about[512];
    cudnn_describe(about, sizeof about);
    printf("cuDNN: %s\n", about);
    v9_19 = !strncmp(about, "9.19.", 5);
    /* B, T, H, KVH, D, Dv, deterministic[, heads in memory: a head group of wider tensors] */
    struct {
        const char *name;
        struct sdpa_shape s;
    } cases[] = {
        {"8b_t8192_gqa4_d128", {1, 8192, 32, 8, 128, 128, 1, 0, 0}},
        {"8b_t8192_gqa4_d128_atomic_dq", {1, 8192, 32, 8, 128, 128, 0, 0, 0}},
        {"8b_t8192_gqa4_d128_head_group_8_of_32", {1, 8192, 8, 2, 128, 128, 1, 32, 8}},
        {"t512_gqa4_d64_batch4_head_group_4_of_16", {4, 512, 4, 1, 64, 64, 1, 16, 4}},
        {"t1024_gqa8_d64", {2, 1024, 8, 1, 64, 64, 1, 0, 0}},
        {"t257_mha_d128", {1, 257, 4, 4, 128, 128, 1, 0, 0}},
        {"t1_gqa8_d128", {1, 1, 8, 1, 128, 128, 1, 0, 0}},
        {"t700_mla_d192_dv128", {1, 700, 4, 4, 192, 128, 1, 0, 0}},
        {"t700_mla_d192_dv128_atomic_dq", {1, 700, 4, 4, 192, 128, 0, 0, 0}},
    };
    char name[128];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(name, sizeof name, "cudnn_graph_forward_%s", cases[i].name);
        accepted(name, cases[i].s, 0, 1);
        /* T 1's backward: refused (cuDNN's frontend refuses it too, although the backend builds a plan) */
        snprintf(name, sizeof name, "cudnn_graph_backward_%s%s", cases[i].name, cases[i].s.T == 1 ? "_refused" : "");
        accepted(name, cases[i].s, 1, cases[i].s.T > 1);
    }
    struct sdpa_shape uneven = {1, 128, 6, 4, 64, 64, 1, 0, 0};
    accepted("cudnn_graph_forward_heads_6_over_4_refused", uneven, 0, 0);
    accepted("cudnn_graph_backward_heads_6_over_4_refused", uneven, 1, 0);
    free((void *)json);
    TEST_EXIT();
}

#else
int main(void) {
    printf("SKIP cudnn_graph: built without the CUDA backend (CUDA=0)\n");
    return 0;
}
#endif
