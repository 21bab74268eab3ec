// The CUDA emulator's own tests (make CUDA_EMU=1 test-cuda-emu; built like model/cuda/kernels.cu: the
// launches rewritten by sed, g++ with tests/cuda_emu/include first): that a barrier really is one, that
// a divergent one is a reported fault and not a hang, that shuffles exchange between lanes, CUDA's launch
// errors, bf16 rounding, and cuBLAS's argument checks and products.
#include <criterion/criterion.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

// Thread i writes its slot, then (after the barrier) reads its neighbour's: without a real barrier the
// first threads would read slots nobody wrote yet. Run twice per block: the second pass reuses `s`.
static __global__ void barrier_kernel(int *out) {
    __shared__ int s[256];
    for (int pass = 0; pass < 2; pass++) {
        s[threadIdx.x] = (int)(blockIdx.x * 1000 + threadIdx.x + pass);
        __syncthreads();
        out[(blockIdx.x * 2 + pass) * blockDim.x + threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
        __syncthreads();
    }
}

static __global__ void divergent_kernel(int *out) {
    if (threadIdx.x < 16)
        __syncthreads();
    out[threadIdx.x] = 1;
}

static __global__ void two_barriers_kernel(int *out) {
    if (threadIdx.x % 2)
        __syncthreads();
    else
        __syncthreads();
    out[threadIdx.x] = 1;
}

// Lane l: out = Σ over the warp of (l + 1) by xor butterflies, down = the value of lane l + 1 (own at 31).
static __global__ void shuffle_kernel(float *sum, int *down, double *idx) {
    float v = (float)(threadIdx.x % 32 + 1);
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    sum[threadIdx.x] = v;
    down[threadIdx.x] = __shfl_down_sync(0xffffffffu, (int)threadIdx.x, 1);
    idx[threadIdx.x] = __shfl_sync(0xffffffffu, (double)threadIdx.x, 3);
}

// Half a warp shuffles, the other half has left: a fault.
static __global__ void half_warp_shuffle_kernel(float *out) {
    if (threadIdx.x >= 16)
        return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

static __global__ void coords_kernel(int *out) {
    int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    out[b * blockDim.x * blockDim.y * blockDim.z + t] = b * 100 + t;
}

static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    cr_assert_eq(cudaMalloc(&p, bytes), cudaSuccess);
    return p;
}

Test(cuda_emu, syncthreads_is_a_barrier) {
    int n = 256 * 3 * 2, *d = (int *)dev_alloc(n * sizeof(int)), h[256 * 3 * 2];
    barrier_kernel<<<3, 256>>>(d);
    cr_assert_eq(cudaGetLastError(), cudaSuccess);
    cr_assert_eq(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int b = 0; b < 3; b++)
        for (int pass = 0; pass < 2; pass++)
            for (int t = 0; t < 256; t++)
                cr_assert_eq(h[(b * 2 + pass) * 256 + t], b * 1000 + (t + 1) % 256 + pass, "block %d pass %d thread %d",
                             b, pass, t);
    cudaFree(d);
}

Test(cuda_emu, divergent_syncthreads_is_a_sticky_launch_failure) {
    int *d = (int *)dev_alloc(64 * sizeof(int));
    divergent_kernel<<<1, 64>>>(d);
    cr_assert_eq(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    cr_assert_eq(cudaGetLastError(), cudaErrorLaunchFailure);
    cr_assert_eq(cudaGetLastError(), cudaErrorLaunchFailure, "a kernel fault is sticky");
    void *p = NULL;
    cr_assert_eq(cudaMalloc(&p, 16), cudaErrorLaunchFailure);
}

Test(cuda_emu, threads_at_two_different_syncthreads_are_a_fault) {
    int *d = (int *)dev_alloc(64 * sizeof(int));
    two_barriers_kernel<<<1, 64>>>(d);
    cr_assert_eq(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
}

Test(cuda_emu, shuffles_exchange_between_lanes) {
    float *s = (float *)dev_alloc(64 * sizeof(float)), hs[64];
    int *dn = (int *)dev_alloc(64 * sizeof(int)), hd[64];
    double *ix = (double *)dev_alloc(64 * sizeof(double)), hi[64];
    shuffle_kernel<<<1, 64>>>(s, dn, ix);
    cr_assert_eq(cudaGetLastError(), cudaSuccess);
    cudaMemcpy(hs, s, sizeof hs, cudaMemcpyDeviceToHost);
    cudaMemcpy(hd, dn, sizeof hd, cudaMemcpyDeviceToHost);
    cudaMemcpy(hi, ix, sizeof hi, cudaMemcpyDeviceToHost);
    for (int t = 0; t < 64; t++) {
        cr_assert_eq(hs[t], 528.0f, "thread %d: warp sum %g", t, hs[t]); // 1 + ... + 32
        cr_assert_eq(hd[t], t % 32 == 31 ? t : t + 1, "thread %d: shfl_down %d", t, hd[t]);
        cr_assert_eq(hi[t], (double)(t / 32 * 32 + 3), "thread %d: shfl %g", t, hi[t]);
    }
}

Test(cuda_emu, shuffle_of_part_of_a_warp_is_a_fault) {
    float *d = (float *)dev_alloc(32 * sizeof(float));
    half_warp_shuffle_kernel<<<1, 32>>>(d);
    cr_assert_eq(cudaGetLastError(), cudaErrorLaunchFailure);
}

Test(cuda_emu, coordinates_of_a_3d_grid) {
    dim3 grid(2, 3, 2), block(4, 2, 3);
    int n = 12 * 24, *d = (int *)dev_alloc(n * sizeof(int)), h[12 * 24];
    coords_kernel<<<grid, block, 0, 0>>>(d);
    cr_assert_eq(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < n; i++)
        cr_assert_eq(h[i], i / 24 * 100 + i % 24);
}

Test(cuda_emu, launch_errors_as_cuda_reports_them) {
    int *d = (int *)dev_alloc(sizeof(int));
    coords_kernel<<<1, 1025>>>(d);
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidConfiguration);
    cr_assert_eq(cudaGetLastError(), cudaSuccess, "a launch error is not sticky");
    coords_kernel<<<0, 32>>>(d);
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidConfiguration);
    coords_kernel<<<dim3(1, 65536), 32>>>(d);
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidConfiguration);
    coords_kernel<<<1, dim3(1, 1, 65)>>>(d);
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidConfiguration);
}

Test(cuda_emu, memory_bounds) {
    void *p = NULL;
    cr_assert_eq(cudaMalloc(&p, (size_t)1 << 62), cudaErrorMemoryAllocation);
    cr_assert_eq(cudaGetLastError(), cudaErrorMemoryAllocation);
    cr_assert_eq(cudaGetLastError(), cudaSuccess);
    char *d = (char *)dev_alloc(100), h[101] = {0};
    cr_assert_eq(cudaMemcpy(d, h, 100, cudaMemcpyHostToDevice), cudaSuccess);
    cr_assert_eq(cudaMemcpy(d + 1, h, 100, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    cr_assert_eq(cudaMemcpy(h, d, 101, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    cr_assert_eq(cudaMemsetAsync(d + 50, 0, 51, 0), cudaErrorInvalidValue);
    cr_assert_eq(cudaMemcpy(h, h + 1, 10, cudaMemcpyDeviceToDevice), cudaErrorInvalidValue, "host pointers");
    cr_assert_eq(cudaFree(h), cudaErrorInvalidValue);
}

static uint16_t bf16_bits(float f) { return __float2bfloat16_rn(f).x; }

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

Test(cuda_emu, bf16_rounds_to_nearest_even) {
    cr_assert_eq(bf16_bits(from_bits(0x3f808000u)), 0x3f80); // a tie, even below: down
    cr_assert_eq(bf16_bits(from_bits(0x3f818000u)), 0x3f82); // a tie, odd below: up
    cr_assert_eq(bf16_bits(from_bits(0x3f808001u)), 0x3f81); // past the tie: up
    cr_assert_eq(bf16_bits(from_bits(0x7f7fffffu)), 0x7f80); // the largest float rounds to inf
    cr_assert_eq(bf16_bits(from_bits(0xff800000u)), 0xff80); // -inf stays
    cr_assert_eq(bf16_bits(from_bits(0xffc12345u)), 0x7fff); // any NaN: CUDA's canonical one
    cr_assert_eq(__bfloat162float(__float2bfloat16(-2.5f)), -2.5f);
}

// C (2, 3) = A (2, 4) B (4, 3), A stored column-major transposed (lda 4, OP_T), B as it is (ldb 4).
Test(cuda_emu, cublas_products_and_argument_checks) {
    cublasHandle_t h;
    cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    float At[8] = {1, 2, 3, 4, 5, 6, 7, 8}, B[12] = {1, 0, 0, 0, 0, 1, 0, 0, 1, 1, 1, 1}, C[6], one = 1, zero = 0;
    float want[6] = {1, 5, 2, 6, 10, 26};
    for (int i = 0; i < 6; i++)
        C[i] = NAN; // beta 0: C is not read
    cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 3, 4, &one, At, CUDA_R_32F, 4, B, CUDA_R_32F, 4, &zero, C,
                              CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_SUCCESS);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(C[i], want[i], "C[%d] = %g", i, C[i]);
    // two batches of it: the second B is 2 B, the second C at stride 6
    float B2[24], C2[12];
    for (int i = 0; i < 12; i++)
        B2[i] = B[i], B2[12 + i] = 2 * B[i];
    cr_assert_eq(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 3, 4, &one, At, CUDA_R_32F, 4, 0, B2,
                                            CUDA_R_32F, 4, 12, &zero, C2, CUDA_R_32F, 2, 6, 2, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_SUCCESS);
    for (int i = 0; i < 6; i++)
        cr_assert(C2[i] == want[i] && C2[6 + i] == 2 * want[i], "batch entry %d: %g %g", i, C2[i], C2[6 + i]);
    // lda below k for OP_T, ldc below m, a negative size, then mixed and unsupported types
    cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 3, 4, &one, At, CUDA_R_32F, 3, B, CUDA_R_32F, 4, &zero, C,
                              CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 3, 4, &one, At, CUDA_R_32F, 2, B, CUDA_R_32F, 4, &zero, C,
                              CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, -1, 4, &one, At, CUDA_R_32F, 2, B, CUDA_R_32F, 4, &zero,
                              C, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 3, 4, &one, At, CUDA_R_32F, 4, B, CUDA_R_16BF, 4, &zero,
                              C, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_NOT_SUPPORTED);
    cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 3, 4, &one, At, CUDA_R_32F, 4, B, CUDA_R_32F, 4, &zero, C,
                              CUDA_R_32F, 2, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_NOT_SUPPORTED);
    // bf16 x bf16 -> fp32, beta 1 adds to C
    __nv_bfloat16 Ab[8], Bb[12];
    for (int i = 0; i < 8; i++)
        Ab[i] = __float2bfloat16(At[i]);
    for (int i = 0; i < 12; i++)
        Bb[i] = __float2bfloat16(B[i]);
    cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 3, 4, &one, Ab, CUDA_R_16BF, 4, Bb, CUDA_R_16BF, 4, &one,
                              C, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_SUCCESS);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(C[i], 2 * want[i]);
    cr_assert_eq(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
}
