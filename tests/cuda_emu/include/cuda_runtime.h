// Test-only (make CUDA_EMU=1): what nvcc gives a .cu file, for model/cuda/kernels.cu compiled as host C++
// by g++ (forced in with -include). Qualifiers and attributes vanish, __shared__ is static storage (blocks
// run one after another), and the thread's coordinates, __syncthreads and the warp shuffles are the
// emulator's (tests/cuda_emu/emu.cpp: every thread of a block a fiber). The Makefile rewrites each
// `kernel<<<grid, block, shm, stream>>>(args)` into `cuda_emu::launch(kernel, "kernel", grid, block, shm,
// stream)(args)`.
#ifndef CUDA_EMU_RUNTIME_H
#define CUDA_EMU_RUNTIME_H

#include "cuda_runtime_api.h"

#ifdef __cplusplus
#include <math.h>
#include <stddef.h>
#include <tuple>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __launch_bounds__(...)
#define __restrict__ __restrict

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// The running fiber's (set by the emulator before it enters a thread).
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

namespace cuda_emu {
enum ShflKind { SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_XOR };
void syncthreads(const char *file, int line);
void syncwarp(unsigned mask, const char *file, int line);
void shfl(unsigned mask, const void *in, void *out, size_t bytes, ShflKind kind, int arg, int width, const char *file,
          int line);
// Runs body(ctx) as every thread of every block of the grid (a launch error is left for cudaGetLastError).
void run(const char *name, dim3 grid, dim3 block, size_t shm, cudaStream_t s, void (*body)(void *), void *ctx);

// launch(kernel, "kernel", grid, block, shm, stream)(args): the arguments are converted to the kernel's
// parameter types once, at the launch, as CUDA does; each thread gets its own copy of them.
template <class... P> struct Launch {
    void (*kernel)(P...);
    const char *name;
    dim3 grid, block;
    size_t shm;
    cudaStream_t stream;
    template <class... A> void operator()(A &&...a) const {
        std::tuple<P...> args(std::forward<A>(a)...);
        struct Ctx {
            void (*kernel)(P...);
            std::tuple<P...> *args;
        } c = {kernel, &args};
        run(name, grid, block, shm, stream, [](void *p) { std::apply(((Ctx *)p)->kernel, *((Ctx *)p)->args); }, &c);
    }
};

template <class... P>
Launch<P...> launch(void (*kernel)(P...), const char *name, dim3 grid, dim3 block, size_t shm = 0,
                    cudaStream_t stream = 0) {
    return Launch<P...>{kernel, name, grid, block, shm, stream};
}
} // namespace cuda_emu

#define __syncthreads() cuda_emu::syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) cuda_emu::syncwarp((__VA_ARGS__ + 0u ?: 0xffffffffu), __FILE__, __LINE__)

template <class T> static inline T cuda_emu_shfl(unsigned mask, T v, cuda_emu::ShflKind kind, int arg, int width,
                                                 const char *file, int line) {
    static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
    T out;
    cuda_emu::shfl(mask, &v, &out, sizeof(T), kind, arg, width, file, line);
    return out;
}
// The width argument is optional, as in CUDA (32 without it).
#define CUDA_EMU_SHFL(kind, m, v, l, ...) cuda_emu_shfl(m, v, kind, l, (__VA_ARGS__ + 0 ?: 32), __FILE__, __LINE__)
#define __shfl_sync(...) CUDA_EMU_SHFL(cuda_emu::SHFL_IDX, __VA_ARGS__)
#define __shfl_up_sync(...) CUDA_EMU_SHFL(cuda_emu::SHFL_UP, __VA_ARGS__)
#define __shfl_down_sync(...) CUDA_EMU_SHFL(cuda_emu::SHFL_DOWN, __VA_ARGS__)
#define __shfl_xor_sync(...) CUDA_EMU_SHFL(cuda_emu::SHFL_XOR, __VA_ARGS__)

// Conversions: round to nearest, ties to even (the host's default rounding mode, which lrintf follows).
static inline int __float2int_rn(float x) { return (int)lrintf(x); }
#endif

#endif
