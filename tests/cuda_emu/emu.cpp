// Test-only CUDA emulator (make CUDA_EMU=1; docs/gpu.md "Emulated CUDA"): model/cuda/kernels.cu compiled as
// host C++ runs its kernels here, and model/cuda/backend.c's cudart and cuBLAS calls land here.
//
// Kernels. A launch runs its blocks one after another on the calling thread; the threads of a block are
// fibers (ucontext for the first entry, GCC's __builtin_setjmp/__builtin_longjmp after: no system call
// per switch, and none of ASan's longjmp handling, which clears the shadow of the whole stack each time). A thread runs
// until it finishes or waits: at __syncthreads (released when every thread of the block waits there, at
// the same call) or at a warp barrier (__syncwarp, and each shuffle: every lane deposits its value, all 32
// meet, each reads its partner's; released when the warp's last lane arrives). A barrier
// that part of the block (or warp) can never reach, because the others exited or wait elsewhere, is a
// kernel fault: one line on stderr naming the kernel, block and barrier, and the sticky
// cudaErrorLaunchFailure every later call returns, as a GPU's fault does.
//
// This file itself is built without ASan (-DCUDA_EMU_ASAN: it tells ASan of each switch of stacks instead):
// instrumented, each switch would clear the shadow of a whole stack.
//
// Memory is host memory (malloc: under ASan an out-of-bounds device access is reported), and the
// runtime knows every allocation, so copies and memsets are checked against their bounds too. cuBLAS is
// tests/cuda_emu/cublas.cpp.
#include <map>
#include <mutex>
#include <string>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <cuda_runtime.h>

#ifdef CUDA_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define FIBER_STACK (256 * 1024)
#else
#define FIBER_STACK (64 * 1024)
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

// The emulated device: its name and memory (what cudaMemGetInfo reports; cudaMalloc beyond it fails).
#define EMU_NAME "cuda_emu (kernels emulated on the host)"
#define EMU_MEM ((size_t)16 << 30)
#define MAX_THREADS 1024

namespace {

// ---- errors ----

cudaError_t last_error = cudaSuccess, sticky = cudaSuccess;

cudaError_t fail(cudaError_t e) {
    if (e != cudaSuccess)
        last_error = e;
    return e;
}

// ---- fibers ----

struct Ctx {
    void *jb[5]; // __builtin_setjmp's buffer
    void *fake = nullptr; // ASan's fake stack while away
    const void *bottom = nullptr;
    size_t size = 0;
};

enum State { READY, WAIT_WARP, WAIT_BLOCK, DONE };

struct Fiber {
    Ctx ctx;
    ucontext_t uc;
    bool started;
    State state;
    uint3 tid;
    int index;
    const char *file; // the __syncthreads it waits at
    int line;
    unsigned char slot[2][8]; // its value in a shuffle, odd and even ones: one barrier per shuffle suffices
    unsigned shuffles;        // (a lane writes slot[s % 2] again only after every lane passed shuffle s + 1)
};

Fiber *fibers[MAX_THREADS];
Ctx sched;
Fiber *cur;
int nthreads;
int warp_arrived[MAX_THREADS / 32];
void (*body)(void *);
void *body_ctx;
const char *kernel_name;
char fault[512]; // set by a fiber: the block is abandoned

void asan_start(Ctx *from, const Ctx *to) {
#ifdef CUDA_EMU_ASAN
    __sanitizer_start_switch_fiber(&from->fake, to->bottom, to->size);
#endif
}

void asan_finish(Ctx *c) {
#ifdef CUDA_EMU_ASAN
    __sanitizer_finish_switch_fiber(c->fake, nullptr, nullptr);
#endif
}

__attribute__((noinline)) void long_jump(void **jb) { __builtin_longjmp(jb, 1); }

// Leaves `from` for fiber `to` (the scheduler when NULL); returns when something switches back to `from`.
void jump(Ctx *from, Fiber *to) {
    if (__builtin_setjmp(from->jb)) {
        asan_finish(from);
        return;
    }
    Ctx *dst = to ? &to->ctx : &sched;
    if (to) {
        cur = to;
        threadIdx = to->tid;
    }
    asan_start(from, dst);
    if (to && !to->started) {
        to->started = true;
        setcontext(&to->uc);
    }
    long_jump(dst->jb);
}

Fiber *next_ready(int after) {
    for (int i = 1; i <= nthreads; i++) {
        Fiber *f = fibers[(after + i) % nthreads];
        if (f->state == READY)
            return f;
    }
    return nullptr;
}

// The running fiber waits (its state says for what): on to the next ready thread, or the scheduler.
void wait_here() {
    Fiber *me = cur;
    jump(&me->ctx, next_ready(me->index));
}

void fiber_main() {
    asan_finish(&cur->ctx);
    for (;;) { // one thread of a block per turn, as long as the fiber lives
        body(body_ctx);
        cur->state = DONE;
        wait_here();
    }
}

void fiber_reset(Fiber *f) {
    f->started = false;
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = (char *)f->ctx.bottom;
    f->uc.uc_stack.ss_size = f->ctx.size;
    f->uc.uc_link = nullptr;
    makecontext(&f->uc, fiber_main, 0);
#ifdef CUDA_EMU_ASAN
    __asan_unpoison_memory_region(f->ctx.bottom, f->ctx.size); // frames abandoned by a fault
#endif
}

// Fibers for n threads (kept for later launches); false when there is no memory for their stacks.
bool fibers_for(int n) {
    for (int i = 0; i < n; i++) {
        if (fibers[i])
            continue;
        // a guard page below each stack: an overflow faults instead of writing into the next one
        char *m = (char *)mmap(nullptr, FIBER_STACK + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return false;
        mprotect(m, 4096, PROT_NONE);
        Fiber *f = new Fiber();
        f->index = i;
        f->ctx.bottom = m + 4096;
        f->ctx.size = FIBER_STACK;
        fiber_reset(f);
        fibers[i] = f;
    }
    return true;
}

// A kernel fault in the running fiber: recorded, and the block abandoned.
void fiber_fault(const char *file, int line, const char *what) {
    snprintf(fault, sizeof fault, "%s:%d: thread (%u,%u,%u): %s", file, line, cur->tid.x, cur->tid.y, cur->tid.z,
             what);
    jump(&cur->ctx, nullptr);
}

int warp_lanes(int w) { return nthreads - 32 * w < 32 ? nthreads - 32 * w : 32; }

void warp_wait() {
    Fiber *me = cur;
    int w = me->index / 32;
    me->state = WAIT_WARP;
    if (++warp_arrived[w] == warp_lanes(w)) { // the last lane: the warp goes on, this lane first
        warp_arrived[w] = 0;
        for (int i = 32 * w; i < 32 * w + warp_lanes(w); i++)
            fibers[i]->state = READY;
        return;
    }
    wait_here();
}

// Nothing is ready: every thread finished (true), or the block barrier is released, or it is a fault.
bool resolve(bool *finished) {
    int waiting = 0, done = 0;
    const Fiber *first = nullptr;
    for (int i = 0; i < nthreads; i++) {
        Fiber *f = fibers[i];
        done += f->state == DONE;
        if (f->state == WAIT_WARP) {
            snprintf(fault, sizeof fault, "warp %d: a warp barrier (__syncwarp or a shuffle) reached by %d of its %d "
                     "lanes; the others exited or wait at __syncthreads", i / 32, warp_arrived[i / 32],
                     warp_lanes(i / 32));
            return false;
        }
        if (f->state != WAIT_BLOCK)
            continue;
        if (first && (first->line != f->line || strcmp(first->file, f->file))) {
            snprintf(fault, sizeof fault, "threads wait at different __syncthreads: %s:%d and %s:%d", first->file,
                     first->line, f->file, f->line);
            return false;
        }
        first = first ? first : f;
        waiting++;
    }
    *finished = done == nthreads;
    if (*finished)
        return true;
    if (done) {
        snprintf(fault, sizeof fault, "__syncthreads at %s:%d reached by %d of the block's %d threads (the others "
                 "exited)", first->file, first->line, waiting, nthreads);
        return false;
    }
    for (int i = 0; i < nthreads; i++)
        fibers[i]->state = READY;
    return true;
}

// One block: false on a fault (in `fault`).
bool run_block() {
    for (int i = 0; i < nthreads; i++) {
        Fiber *f = fibers[i];
        f->state = READY;
        f->shuffles = 0;
        f->tid = {i % blockDim.x, i / blockDim.x % blockDim.y, i / (blockDim.x * blockDim.y)};
    }
    memset(warp_arrived, 0, sizeof warp_arrived);
    fault[0] = 0;
    for (;;) {
        Fiber *f = next_ready(nthreads - 1);
        bool finished = false;
        if (f)
            jump(&sched, f);
        else if (!resolve(&finished) || finished)
            break;
        if (fault[0])
            break;
    }
    if (!fault[0])
        return true;
    for (int i = 0; i < nthreads; i++)
        if (fibers[i]->state != DONE)
            fiber_reset(fibers[i]); // it stopped inside the kernel
    return false;
}

// CUDA's limits on a launch (compute capability 9.0).
bool config_ok(dim3 g, dim3 b) {
    unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    return g.x && g.y && g.z && b.x && b.y && b.z && threads <= MAX_THREADS && b.x <= 1024 && b.y <= 1024 &&
           b.z <= 64 && g.x <= 0x7fffffffu && g.y <= 65535 && g.z <= 65535;
}

std::mutex launch_lock; // __shared__ is static storage: one launch at a time
std::map<std::string, long> launches; // kernel name -> launches run (cuda_emu_launches)

} // namespace

void cuda_emu::run(const char *name, dim3 grid, dim3 block, size_t shm, cudaStream_t s, void (*fn)(void *),
                   void *ctx) {
    std::lock_guard<std::mutex> hold(launch_lock);
    if (sticky)
        return;
    if (!config_ok(grid, block) || shm > 0) { // (dynamic shared memory is not emulated)
        fail(shm > 0 ? cudaErrorInvalidValue : cudaErrorInvalidConfiguration);
        return;
    }
    nthreads = (int)(block.x * block.y * block.z);
    if (!fibers_for(nthreads)) {
        fprintf(stderr, "cuda_emu: %s: no memory for %d fiber stacks\n", name, nthreads);
        fail(sticky = cudaErrorLaunchFailure);
        return;
    }
    launches[name]++;
    body = fn;
    body_ctx = ctx;
    kernel_name = name;
    gridDim = grid;
    blockDim = block;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = {x, y, z};
                if (!run_block()) {
                    fprintf(stderr, "cuda_emu: kernel %s, block (%u,%u,%u): %s\n", name, x, y, z, fault);
                    fail(sticky = cudaErrorLaunchFailure);
                    return;
                }
            }
}

void cuda_emu::syncthreads(const char *file, int line) {
    cur->file = file;
    cur->line = line;
    cur->state = WAIT_BLOCK;
    wait_here();
}

void cuda_emu::syncwarp(unsigned mask, const char *file, int line) {
    if (mask != 0xffffffffu)
        fiber_fault(file, line, "__syncwarp: only the full mask 0xffffffff is emulated");
    warp_wait();
}

void cuda_emu::shfl(unsigned mask, const void *in, void *out, size_t bytes, ShflKind kind, int arg, int width,
                    const char *file, int line) {
    if (mask != 0xffffffffu || width < 1 || width > 32 || (width & (width - 1)))
        fiber_fault(file, line, "shuffle: only the full mask 0xffffffff and a power-of-two width <= 32 are emulated");
    int lane = cur->index % 32, seg = lane / width * width, src = lane;
    switch (kind) { // CUDA: a source lane outside the lane's segment of `width` lanes leaves its own value
    case SHFL_IDX: src = seg + (arg % width + width) % width; break;
    case SHFL_UP: src = lane - arg >= seg ? lane - arg : lane; break;
    case SHFL_DOWN: src = lane + arg < seg + width ? lane + arg : lane; break;
    case SHFL_XOR: src = (lane ^ arg) < seg + width && (lane ^ arg) >= seg ? lane ^ arg : lane; break;
    }
    int from = cur->index - lane + src;
    if (from >= nthreads)
        fiber_fault(file, line, "shuffle from a lane past the block's last thread");
    unsigned parity = cur->shuffles++ % 2;
    memcpy(cur->slot[parity], in, bytes);
    warp_wait(); // every lane has deposited
    memcpy(out, fibers[from]->slot[parity], bytes);
}

// ---- cudart ----

namespace {
std::map<const char *, size_t> allocs; // device allocations: start -> bytes
size_t allocated;
std::mutex mem_lock;
int stream_token, event_token;

// [p, p + bytes) inside one device allocation.
bool on_device(const void *p, size_t bytes) {
    std::lock_guard<std::mutex> hold(mem_lock);
    auto it = allocs.upper_bound((const char *)p);
    if (it == allocs.begin())
        return false;
    --it;
    return (const char *)p + bytes <= it->first + it->second && (const char *)p >= it->first;
}

cudaError_t copy_check(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind == cudaMemcpyDefault)
        dst_dev = on_device(dst, bytes), src_dev = on_device(src, bytes);
    if ((dst_dev && !on_device(dst, bytes)) || (src_dev && !on_device(src, bytes)) || kind > cudaMemcpyDefault) {
        fprintf(stderr, "cuda_emu: cudaMemcpy of %zu bytes, kind %d: outside the device allocations\n", bytes, kind);
        return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}
} // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int *count) {
    *count = 1;
    return cudaSuccess;
}

long cuda_emu_launches(const char *kernel) {
    std::lock_guard<std::mutex> hold(launch_lock);
    auto it = launches.find(kernel);
    return it == launches.end() ? 0 : it->second;
}

// The emulated driver: CUDA 13.0's number (1000 * major + 10 * minor).
cudaError_t cudaDriverGetVersion(int *version) {
    *version = 13000;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    return sticky ? sticky : fail(device == 0 ? cudaSuccess : cudaErrorInvalidDevice);
}

cudaError_t cudaGetDevice(int *device) {
    *device = 0;
    return sticky;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device) {
    if (device != 0)
        return fail(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "%s", EMU_NAME);
    prop->totalGlobalMem = EMU_MEM;
    prop->sharedMemPerBlock = 48 << 10;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = MAX_THREADS;
    prop->multiProcessorCount = 1;
    prop->major = 9;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return sticky; }

cudaError_t cudaGetLastError(void) {
    cudaError_t e = sticky ? sticky : last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return sticky ? sticky : last_error; }

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    }
    return "unknown error";
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    *p = nullptr;
    if (sticky)
        return sticky;
    std::lock_guard<std::mutex> hold(mem_lock);
    void *m = nullptr;
    if (bytes > EMU_MEM - allocated || posix_memalign(&m, 256, bytes ? bytes : 1))
        return fail(cudaErrorMemoryAllocation);
    allocs[(const char *)m] = bytes;
    allocated += bytes;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    if (!p)
        return sticky;
    std::lock_guard<std::mutex> hold(mem_lock);
    auto it = allocs.find((const char *)p);
    if (it == allocs.end())
        return fail(cudaErrorInvalidValue);
    allocated -= it->second;
    allocs.erase(it);
    free(p);
    return sticky;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    std::lock_guard<std::mutex> hold(mem_lock);
    *free_bytes = EMU_MEM - allocated;
    *total_bytes = EMU_MEM;
    return sticky;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    if (sticky)
        return sticky;
    cudaError_t e = copy_check(dst, src, bytes, kind);
    if (e == cudaSuccess && bytes)
        memmove(dst, src, bytes);
    return e;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
    return cudaMemcpy(dst, src, bytes, kind);
}

cudaError_t cudaMemset(void *p, int value, size_t bytes) {
    if (sticky)
        return sticky;
    if (!on_device(p, bytes)) {
        fprintf(stderr, "cuda_emu: cudaMemset of %zu bytes: outside the device allocations\n", bytes);
        return fail(cudaErrorInvalidValue);
    }
    memset(p, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s) { return cudaMemset(p, value, bytes); }

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    *s = (cudaStream_t)&stream_token; // every stream runs its work at once
    return sticky;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) { return sticky; }
cudaError_t cudaStreamSynchronize(cudaStream_t s) { return sticky; }
cudaError_t cudaStreamQuery(cudaStream_t s) { return sticky; }

cudaError_t cudaEventCreate(cudaEvent_t *e) {
    *e = (cudaEvent_t)&event_token;
    return sticky;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) { return sticky; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { return sticky; }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return sticky; }
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) { return sticky; }

} // extern "C"
