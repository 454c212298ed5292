/* CUDA kernels on the CPU, for tests: the kernel headers (.cuh) of kernels/cuda run
 * here as ordinary C++ under an emulation of blocks and warps, so CI checks
 * their indexing, tiling and synchronisation without a GPU.
 *
 * Every thread of a block is an OS thread (blocks run one after another);
 * __syncthreads is a barrier over the block; a warp-collective instruction
 * (a shuffle) is an exchange through per-warp slots between two barriers
 * over the warp; __shared__ arrays are function statics (one block runs at a
 * time); atomics take a lock. Slow (a barrier costs a context switch per
 * thread): keep shapes small. What it cannot check is the hardware's own
 * behaviour (timing, memory limits, instruction layouts beyond what a test
 * writes down). Include before the kernel header; needs -pthread. */
#pragma once
#include <pthread.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

struct dim3_ {
    unsigned x, y, z;
};
static thread_local dim3_ threadIdx, blockIdx;
static dim3_ gridDim, blockDim;

/* CUDA's 16-byte vector of four floats, and its 16- and 8-byte unsigned vectors */
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
static inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

enum { EMU_MAX_WARPS = 32 };
static pthread_barrier_t emu_block_bar, emu_warp_bar[EMU_MAX_WARPS];
static uint32_t emu_slot[EMU_MAX_WARPS][32];
static std::mutex emu_atomic_lock;

static inline int emu_tid() { return (int)(threadIdx.y * blockDim.x + threadIdx.x); }
static inline int emu_lane() { return emu_tid() & 31; }
static inline int emu_warp() { return emu_tid() >> 5; }
static inline void emu_warp_wait() { pthread_barrier_wait(&emu_warp_bar[emu_warp()]); }

static inline void __syncthreads() { pthread_barrier_wait(&emu_block_bar); }

static inline float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
using std::max;
using std::min;

/* the value of lane src of this warp (32-bit values), through per-warp slots */
template <typename T>
static inline T emu_shfl(T v, int src) {
    static_assert(sizeof(T) == 4, "32-bit shuffles only");
    int w = emu_warp(), l = emu_lane();
    memcpy(&emu_slot[w][l], &v, 4);
    emu_warp_wait();
    T r;
    memcpy(&r, &emu_slot[w][src & 31], 4);
    emu_warp_wait();
    return r;
}
/* the value of lane (lane ^ o) */
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int o) {
    (void)mask;
    return emu_shfl(v, emu_lane() ^ o);
}
/* the value of lane src */
template <typename T>
static inline T __shfl_sync(unsigned mask, T v, int src) {
    (void)mask;
    return emu_shfl(v, src);
}

/* a barrier over the warp (whole warps only, as the emulated kernels use it) */
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    (void)mask;
    emu_warp_wait();
}

static inline unsigned atomicMax(unsigned *p, unsigned v) {
    std::lock_guard<std::mutex> hold(emu_atomic_lock);
    unsigned old = *p;
    if (v > old) *p = v;
    return old;
}

static inline int atomicAdd(int *p, int v) {
    std::lock_guard<std::mutex> hold(emu_atomic_lock);
    int old = *p;
    *p = old + v;
    return old;
}
static inline float atomicAdd(float *p, float v) {
    std::lock_guard<std::mutex> hold(emu_atomic_lock);
    float old = *p;
    *p = old + v;
    return old;
}
static inline double atomicAdd(double *p, double v) {
    std::lock_guard<std::mutex> hold(emu_atomic_lock);
    double old = *p;
    *p = old + v;
    return old;
}

/* deterministic test data: uniform in [lo, hi) from a 64-bit LCG state */
static inline float emu_uniform(unsigned long long *state, float lo, float hi) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((*state >> 40) / (double)(1ull << 24));
}

/* runs body() as every thread of every block of grid (blocks of block.x x
 * block.y threads, a multiple of 32), blocks in order (z, y, x); per-thread state a
 * body keeps (e.g. cp.async queues) can be checked by block_end() */
template <typename F, typename E>
static void emu_launch(dim3_ grid, dim3_ block, F body, E block_end) {
    int threads = (int)(block.x * block.y);
    if (threads % 32 || threads / 32 > EMU_MAX_WARPS) {
        fprintf(stderr, "emu_launch: %d threads a block\n", threads);
        abort();
    }
    gridDim = grid, blockDim = dim3_{block.x, block.y, 1};
    pthread_barrier_init(&emu_block_bar, NULL, threads);
    for (int w = 0; w < threads / 32; w++) pthread_barrier_init(&emu_warp_bar[w], NULL, 32);
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; i++)
        pool.emplace_back([=]() {
            threadIdx = dim3_{(unsigned)i % block.x, (unsigned)i / block.x, 0};
            for (unsigned bz = 0; bz < (grid.z ? grid.z : 1); bz++)
                for (unsigned by = 0; by < grid.y; by++)
                    for (unsigned bx = 0; bx < grid.x; bx++) {
                        blockIdx = dim3_{bx, by, bz};
                        body();
                        block_end();
                        __syncthreads(); /* the next block reuses the shared memory */
                    }
        });
    for (auto &t : pool) t.join();
    pthread_barrier_destroy(&emu_block_bar);
    for (int w = 0; w < threads / 32; w++) pthread_barrier_destroy(&emu_warp_bar[w]);
}
template <typename F>
static void emu_launch(dim3_ grid, dim3_ block, F body) {
    emu_launch(grid, block, body, []() {});
}
