/* cuBLAS handle, scratch memory, memory ops and the row-major GEMM wrapper. */
#include <string.h>

#include "kernels/cuda/cuda.h"

static cublasHandle_t blas;
static int use_tf32;
static void *scratch[SCRATCH_SLOTS];
static size_t scratch_bytes[SCRATCH_SLOTS];

extern "C" void cuda_set_tf32(int on) {
    use_tf32 = on;
    if (blas) CUBLAS_CHECK(cublasSetMathMode(blas, on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
}

cublasHandle_t cuda_blas(void) {
    if (!blas) {
        CUBLAS_CHECK(cublasCreate(&blas));
        CUBLAS_CHECK(cublasSetMathMode(blas, use_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    }
    return blas;
}

void *cuda_scratch(enum scratch_slot slot, size_t bytes) {
    if (bytes > scratch_bytes[slot]) {
        if (scratch[slot]) CUDA_CHECK(cudaFree(scratch[slot]));
        CUDA_CHECK(cudaMalloc(&scratch[slot], bytes));
        scratch_bytes[slot] = bytes;
    }
    return scratch[slot];
}

/* Row-major C = A B is column-major C^T = B^T A^T: swap the operands. */
void gemm_rm(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda, long long strideA,
             const float *B, int ldb, long long strideB, float beta, float *C, int ldc, long long strideC,
             int batch) {
    cublasOperation_t ta = transA ? CUBLAS_OP_T : CUBLAS_OP_N, tb = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (batch == 1)
        CUBLAS_CHECK(cublasSgemm(cuda_blas(), tb, ta, N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc));
    else
        CUBLAS_CHECK(cublasSgemmStridedBatched(cuda_blas(), tb, ta, N, M, K, &alpha, B, ldb, strideB, A, lda,
                                               strideA, &beta, C, ldc, strideC, batch));
}

static const char *count_error = "no device";

extern "C" int cuda_device_count(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        count_error = cudaGetErrorString(e);
        cudaGetLastError(); /* clear the sticky "no driver" error */
        return 0;
    }
    return n;
}

extern "C" const char *cuda_device_error(void) { return count_error; }

extern "C" int cuda_device_pci_id(char *buf, int n) {
    int dev = 0;
    if (n > 0) buf[0] = 0;
    if (cuda_device_count() <= 0) return 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetPCIBusId(buf, n, dev));
    return 1;
}

extern "C" int cuda_device_describe(int dev, char *buf, int n) {
    if (n > 0) buf[0] = 0;
    if (dev < 0 || dev >= cuda_device_count()) return 0;
    cudaDeviceProp prop;
    char pci[32] = "";
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    CUDA_CHECK(cudaDeviceGetPCIBusId(pci, sizeof pci, dev));
    snprintf(buf, n, "%s, compute capability %d.%d, %.1f GiB, PCI %s", prop.name, prop.major, prop.minor,
             prop.totalGlobalMem / 1073741824.0, pci);
    return 1;
}

/* x.y from CUDA's 1000 * major + 10 * minor */
static void cuda_version_text(char *buf, int n, int v) { snprintf(buf, n, "%d.%d", v / 1000, v % 1000 / 10); }

extern "C" void cuda_versions(char *buf, int n) {
    int rt = 0, drv = 0;
    char r[16] = "?", d[32] = "none (no driver)";
    if (cudaRuntimeGetVersion(&rt) == cudaSuccess) cuda_version_text(r, sizeof r, rt);
    if (cudaDriverGetVersion(&drv) == cudaSuccess && drv > 0) cuda_version_text(d, sizeof d, drv);
    cudaGetLastError(); /* a missing driver is an answer here, not an error to keep */
    size_t lt = cuda_blaslt_version(); /* major * 10000 + minor * 100 + patch */
    snprintf(buf, n, "runtime %s, driver %s, cuBLASLt %zu.%zu.%zu", r, d, lt / 10000, lt / 100 % 100, lt % 100);
}

/* FP8 tensor cores: compute capability 8.9 (Ada) and 9.0 (Hopper) on */
extern "C" int cuda_device_has_fp8(void) {
    if (cuda_device_count() <= 0) return 0;
    int dev = 0, major = 0, minor = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return major > 8 || (major == 8 && minor >= 9);
}

extern "C" void cuda_use_device(int local_rank) {
    int n = cuda_device_count();
    if (n > 0) CUDA_CHECK(cudaSetDevice(local_rank % n));
}

static void *d_alloc(size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        size_t free_b = 0, total = 0;
        cudaMemGetInfo(&free_b, &total);
        die("out of GPU memory allocating %zu bytes (%zu of %zu free): %s", bytes, free_b, total,
            cudaGetErrorString(e));
    }
    CUDA_CHECK(cudaMemset(p, 0, bytes));
    return p;
}
static void d_free(void *p) {
    if (p) CUDA_CHECK(cudaFree(p));
}
static void d_zero(void *p, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemset(p, 0, bytes));
}
static void d_to_host(void *dst, const void *src, size_t bytes) {
    backend_count_d2h();
    if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
static void d_from_host(void *dst, const void *src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
static void d_copy(void *dst, const void *src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}

static void matmul_forward(float *out, const float *x, const float *w, int N, int K, int M, int accumulate) {
    gemm_rm(0, 1, N, M, K, 1.0f, x, K, 0, w, K, 0, accumulate ? 1.0f : 0.0f, out, M, 0, 1);
}

static void matmul_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, int N, int K,
                            int M, int accumulate_dx) {
    if (dx) gemm_rm(0, 0, N, K, M, 1.0f, dout, M, 0, w, K, 0, accumulate_dx ? 1.0f : 0.0f, dx, K, 0, 1);
    if (dw) gemm_rm(1, 0, M, K, N, 1.0f, dout, M, 0, x, K, 0, 1.0f, dw, K, 0, 1);
}

static double mem_mib(void) {
    size_t free_b = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total));
    return (double)(total - free_b) / (1 << 20);
}

/* Dense fp32 and TF32 peaks from NVIDIA's datasheets, by device name. */
static double peak(int tf32) {
    static const struct { const char *name; double fp32, tf32; } table[] = {
        {"H100 PCIe", 51, 378}, {"H100 NVL", 60, 418}, {"H100", 67, 495}, /* SXM (HBM3) */
        {"H200", 67, 495},      {"A100", 19.5, 156},  {"L40S", 91.6, 183},
    };
    cudaDeviceProp prop;
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strstr(prop.name, table[i].name)) return tf32 ? table[i].tf32 : table[i].fp32;
    return 0;
}

/* fp32 storage: a copy */
static void fp32_storage(float *dst, const float *src, size_t n) {
    if (dst != src) d_copy(dst, src, sizeof(float) * n);
}

extern "C" const struct backend cuda_backend = {
    .name = "cuda",
    .act_bytes = sizeof(float),
    .alloc = d_alloc,
    .free = d_free,
    .zero = d_zero,
    .to_host = d_to_host,
    .from_host = d_from_host,
    .copy = d_copy,
    .embedding_forward = cuda_embedding_forward,
    .embedding_backward = cuda_embedding_backward,
    .rmsnorm_forward = cuda_rmsnorm_forward,
    .rmsnorm_backward = cuda_rmsnorm_backward,
    .matmul_forward = matmul_forward,
    .matmul_backward = matmul_backward,
    .rope = cuda_rope,
    .attention_forward = cuda_attention_forward,
    .attention_state_floats = cuda_attention_state_floats,
    .attention_backward = cuda_attention_backward,
    .attention_block_forward = cuda_attention_block_forward,
    .attention_block_backward = cuda_attention_block_backward,
    .attention_decode = cuda_attention_decode,
    .copy_cols = cuda_copy_cols,
    .swiglu_forward = cuda_swiglu_forward,
    .swiglu_backward = cuda_swiglu_backward,
    .moe_route_forward = cuda_moe_route_forward,
    .moe_route_backward = cuda_moe_route_backward,
    .moe_route_sigmoid_forward = cuda_moe_route_sigmoid_forward,
    .moe_route_sigmoid_backward = cuda_moe_route_sigmoid_backward,
    .gather_rows = cuda_gather_rows,
    .moe_combine = cuda_moe_combine,
    .moe_combine_backward = cuda_moe_combine_backward,
    .moe_route_counts = cuda_moe_route_counts,
    .moe_route_balance = cuda_moe_route_balance,
    .moe_dispatch = cuda_moe_dispatch,
    .moe_expert_order = cuda_moe_expert_order,
    .cross_entropy = cuda_cross_entropy,
    .ce_row_max = cuda_ce_row_max,
    .ce_row_sumexp = cuda_ce_row_sumexp,
    .ce_finish = cuda_ce_finish,
    .to_storage = fp32_storage,
    .from_storage = fp32_storage,
    .add = cuda_add,
    .scale = cuda_scale,
    .sum = cuda_sum,
    .sum_squares = cuda_sum_squares,
    .adamw = cuda_adamw,
    .device_mem_mib = mem_mib,
    .peak_tflops = peak,
};
