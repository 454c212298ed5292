/* A stand-in for the few CUDA runtime calls that parallel/comm_nccl.c and
 * the CUDA backend's memory ops make, for tests/integration/nccl_mock.sh:
 * preloaded (LD_PRELOAD) in front of the real libcudart on a machine
 * without a GPU, it makes "device" memory host memory and runs everything
 * at once in issue order (streams and events are tokens; the order they
 * impose holds trivially). MOCK_CUDA_DEVICES devices (default 8), each
 * with its own PCI bus id, of compute capability MOCK_CUDA_CC (default 90:
 * 9.0, Hopper). Kernels cannot run: only memory, streams and
 * events. It remembers what cudaMalloc handed out, so a host pointer where
 * device memory belongs fails as it would on a GPU: in cudaFree, cudaMemset,
 * cudaMemcpy (by its direction) and, through mock_cuda_is_device, in the
 * NCCL mock's calls. The symbols carry libcudart's version (the map the
 * Makefile writes) so they interpose on the binaries' versioned references. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int device;
static long mallocs; /* cudaMalloc calls: MOCK_CUDA_REPORT=FILE writes the count at exit */

__attribute__((destructor)) static void report(void) {
    const char *path = getenv("MOCK_CUDA_REPORT");
    FILE *f = path && *path ? fopen(path, "a") : NULL;
    if (f) fprintf(f, "mallocs %ld\n", mallocs), fclose(f);
}

/* the live allocations, unordered */
static struct { char *p; size_t bytes; } *allocs;
static size_t nallocs, cap;

static long find(const void *p) {
    for (size_t i = 0; i < nallocs; i++)
        if ((const char *)p >= allocs[i].p && (const char *)p < allocs[i].p + allocs[i].bytes) return (long)i;
    return -1;
}

/* [p, p + bytes) lies inside one allocation */
int mock_cuda_is_device(const void *p, size_t bytes) {
    long i = find(p);
    return i >= 0 && (const char *)p + bytes <= allocs[i].p + allocs[i].bytes;
}

static int devices(void) {
    const char *e = getenv("MOCK_CUDA_DEVICES");
    return e && *e ? atoi(e) : 8;
}

cudaError_t cudaGetDeviceCount(int *n) {
    *n = devices();
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
    *d = device;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= devices()) return cudaErrorInvalidDevice;
    device = d;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char *buf, int len, int d) {
    snprintf(buf, len, "0000:%02x:00.0", 0x10 + d);
    return cudaSuccess;
}
/* the compute capability (attributes 75 and 76, driver_types.h); nothing else is asked */
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr attr, int d) {
    const char *e = getenv("MOCK_CUDA_CC");
    int cc = e && *e ? atoi(e) : 90;
    if (d < 0 || d >= devices()) return cudaErrorInvalidDevice;
    if (attr != 75 && attr != 76) return cudaErrorInvalidValue;
    *v = attr == 75 ? cc / 10 : cc % 10;
    return cudaSuccess;
}
/* an H100-like device of compute capability MOCK_CUDA_CC (mtrain env) */
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int d) {
    if (d < 0 || d >= devices()) return cudaErrorInvalidDevice;
    const char *e = getenv("MOCK_CUDA_CC");
    int cc = e && *e ? atoi(e) : 90;
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "Mock GPU %d", d);
    prop->major = cc / 10, prop->minor = cc % 10;
    prop->totalGlobalMem = (size_t)80 << 30;
    prop->pciBusID = 0x10 + d;
    return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "mock CUDA error"; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }

cudaError_t cudaMalloc(void **p, size_t bytes) {
    if (!bytes) bytes = 1;
    if (nallocs == cap) {
        cap = cap ? 2 * cap : 64;
        allocs = realloc(allocs, sizeof *allocs * cap);
        if (!allocs) return cudaErrorMemoryAllocation;
    }
    *p = malloc(bytes);
    if (!*p) return cudaErrorMemoryAllocation;
    allocs[nallocs].p = *p, allocs[nallocs].bytes = bytes, nallocs++, mallocs++;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    long i = find(p);
    if (i < 0 || allocs[i].p != p) return cudaErrorInvalidValue;
    allocs[i] = allocs[--nallocs];
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int v, size_t bytes) {
    if (bytes && !mock_cuda_is_device(p, bytes)) return cudaErrorInvalidValue;
    memset(p, v, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s) {
    (void)s;
    return cudaMemset(p, v, bytes);
}
/* kind: 1 host to device, 2 device to host, 3 device to device: the device side(s) must be device memory */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
    int dst_dev = kind == 1 || kind == 3, src_dev = kind == 2 || kind == 3;
    if (bytes && ((dst_dev && !mock_cuda_is_device(dst, bytes)) || (src_dev && !mock_cuda_is_device(src, bytes))))
        return cudaErrorInvalidValue;
    memmove(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total) {
    *free_b = *total = (size_t)1 << 34;
    return cudaSuccess;
}

/* streams and events: one non-null token for all (nothing compares them) */
static char tokens[1];
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    (void)flags;
    *s = (cudaStream_t)tokens;
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) { return s ? cudaSuccess : cudaErrorInvalidValue; }
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    (void)s;
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    (void)s, (void)flags;
    return e ? cudaSuccess : cudaErrorInvalidValue;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    (void)flags;
    *e = (cudaEvent_t)tokens;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    (void)s;
    return e ? cudaSuccess : cudaErrorInvalidValue;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) { return e ? cudaSuccess : cudaErrorInvalidValue; }
