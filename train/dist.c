// One rank without ER_MPI; MPI_COMM_WORLD with it (train/dist.h).
#include "train/dist.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/progress.h"

#ifdef ER_MPI
#include <mpi.h>
#endif
#ifdef ER_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

// 4 Mi floats (16 MiB) per MPI_Allreduce: large enough to reach the link's bandwidth, small enough
// that a count never overflows an int.
#define BUCKET_FLOATS ((size_t)1 << 22)

static double reduce_seconds;

double dist_reduce_seconds(void) {
    return reduce_seconds;
}

void dist_share(int n, int rank, int size, int *lo, int *hi) {
    *lo = (int)((long)n * rank / size);
    *hi = (int)((long)n * (rank + 1) / size);
}

#ifdef ER_MPI

// The host-staged sum of a backend's buffer (dist_sum_device_floats without NCCL).
static int sum_via_host(Backend *be, float *x, float *host, size_t n) {
    size_t bytes = n * sizeof(float);
    ER_TRY(be->ops->download(be, host, x, bytes));
    ER_TRY(dist_sum_floats(host, n));
    return be->ops->upload(be, x, host, bytes);
}

static int initialised, local_rank, local_size = 1;

// FNV-1a over the bytes: equal buffers hash equal on every rank.
static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

// An MPI failure as this layer's error line.
static int mpi_error(int code, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "MPI error %d", code);
    return er_error(ER_EIO, "rank %d of %d: %s: %s", dist_rank(), dist_size(), what, msg);
}

int dist_init(int *argc, char ***argv) {
    int provided, rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS)
        return er_error(ER_EIO, "MPI_Init_thread failed (error %d)", rc);
    initialised = 1;
    // Errors come back as codes and become one error line, instead of MPI's own abort.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm node;
    rc = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    if (rc != MPI_SUCCESS)
        return mpi_error(rc, "finding the ranks of this node");
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
    return ER_OK;
}

#ifdef ER_NCCL
static ncclComm_t nccl;
#endif

void dist_finalize(void) {
#ifdef ER_NCCL
    if (nccl)
        ncclCommDestroy(nccl);
    nccl = NULL;
#endif
    if (initialised)
        MPI_Finalize();
    initialised = 0;
}

int dist_local_rank(void) {
    return local_rank;
}

int dist_local_size(void) {
    return local_size;
}

void dist_abort(int code) {
    if (initialised && dist_size() > 1)
        MPI_Abort(MPI_COMM_WORLD, code);
}

int dist_rank(void) {
    int r = 0;
    if (initialised)
        MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

int dist_size(void) {
    int n = 1;
    if (initialised)
        MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

int dist_sum_floats(float *x, size_t n) {
    if (dist_size() == 1)
        return ER_OK;
    double t0 = time_now();
    for (size_t i = 0; i < n; i += BUCKET_FLOATS) {
        int k = (int)(n - i < BUCKET_FLOATS ? n - i : BUCKET_FLOATS);
        int rc = MPI_Allreduce(MPI_IN_PLACE, x + i, k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS)
            return mpi_error(rc, "gradient all-reduce");
    }
    reduce_seconds += time_now() - t0;
    return ER_OK;
}

#ifdef ER_NCCL
static int nccl_error(ncclResult_t r, const char *what) {
    return er_error(ER_EIO, "rank %d of %d: %s (NCCL): %s", dist_rank(), dist_size(), what, ncclGetErrorString(r));
}

// The ranks' NCCL communicator, made on the first call (collective), each rank on its backend's device.
static int nccl_open(Backend *be) {
    if (nccl)
        return ER_OK;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t r = dist_rank() == 0 ? ncclGetUniqueId(&id) : ncclSuccess;
    if (r != ncclSuccess)
        return nccl_error(r, "ncclGetUniqueId");
    int rc = MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS)
        return mpi_error(rc, "sending NCCL's id");
    cudaError_t e = cudaSetDevice(be->index);
    if (e != cudaSuccess)
        return er_error(ER_EIO, "rank %d of %d: cudaSetDevice(%d): %s", dist_rank(), dist_size(), be->index,
                        cudaGetErrorString(e));
    r = ncclCommInitRank(&nccl, dist_size(), id, dist_rank());
    return r == ncclSuccess ? ER_OK : nccl_error(r, "ncclCommInitRank");
}

static int nccl_sum(Backend *be, float *x, size_t n) {
    ER_TRY(nccl_open(be));
    double t0 = time_now();
    cudaStream_t s = (cudaStream_t)be->queue;
    ncclResult_t r = ncclAllReduce(x, x, n, ncclFloat, ncclSum, nccl, s);
    if (r != ncclSuccess)
        return nccl_error(r, "gradient all-reduce");
    cudaError_t e = cudaStreamSynchronize(s); // the time it took, and a failure here rather than later
    if (e != cudaSuccess)
        return er_error(ER_EIO, "rank %d of %d: gradient all-reduce (NCCL): %s", dist_rank(), dist_size(),
                        cudaGetErrorString(e));
    reduce_seconds += time_now() - t0;
    return ER_OK;
}
#endif

int dist_sum_device_floats(Backend *be, float *x, float *host, size_t n, int shared) {
    if (dist_size() == 1)
        return ER_OK;
    // -1: not decided yet; 1: every rank sums with NCCL; 0: all through the host. Decided by all
    // together: a rank on NCCL and one on MPI would wait for each other forever.
    static int use_nccl = -1;
    if (use_nccl < 0) {
        int mine = 0;
#ifdef ER_NCCL
        mine = be->kind == BACKEND_CUDA && be->queue && !shared;
#endif
        (void)shared;
        int rc = MPI_Allreduce(&mine, &use_nccl, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS)
            return mpi_error(rc, "choosing the gradient all-reduce");
    }
#ifdef ER_NCCL
    if (use_nccl)
        return nccl_sum(be, x, n);
#endif
    return sum_via_host(be, x, host, n);
}

int dist_sum_doubles(double *x, int n) {
    if (dist_size() == 1)
        return ER_OK;
    int rc = MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? ER_OK : mpi_error(rc, "all-reduce of the step's sums");
}

int dist_gather(const void *mine, size_t n_mine, size_t size, void **all, size_t *n_all) {
    int n = dist_size(), rc = ER_OK;
    *all = NULL;
    *n_all = 0;
    int *count = er_calloc((size_t)n, sizeof(int)), *at = er_calloc((size_t)n, sizeof(int));
    if (!count || !at)
        ER_CHECK(ER_ENOMEM);
    if (n_mine > INT32_MAX / size)
        ER_CHECK(er_error(ER_ERANGE, "rank %d: %zu bytes to gather, more than MPI's int counts", dist_rank(),
                          n_mine * size));
    int k = (int)(n_mine * size), m = MPI_Allgather(&k, 1, MPI_INT, count, 1, MPI_INT, MPI_COMM_WORLD);
    if (m != MPI_SUCCESS)
        ER_CHECK(mpi_error(m, "gathering the counts"));
    size_t total = 0;
    for (int r = 0; r < n; r++) {
        at[r] = (int)total;
        total += (size_t)count[r];
    }
    if (total > INT32_MAX)
        ER_CHECK(er_error(ER_ERANGE, "%zu bytes to gather over %d ranks, more than MPI's int offsets", total, n));
    if (!(*all = er_alloc(total + 1)))
        ER_CHECK(ER_ENOMEM);
    m = MPI_Allgatherv(mine, k, MPI_BYTE, *all, count, at, MPI_BYTE, MPI_COMM_WORLD);
    if (m != MPI_SUCCESS)
        ER_CHECK(mpi_error(m, "gathering the ranks' results"));
    *n_all = total / size;
done:
    if (rc < 0) {
        er_free(*all);
        *all = NULL;
    }
    er_free(count);
    er_free(at);
    return rc;
}

int dist_check_same(const void *p, size_t bytes, const char *what) {
    if (dist_size() == 1)
        return ER_OK;
    uint64_t h = hash_bytes(p, bytes), lo = h, hi = h;
    int rc = MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    if (rc == MPI_SUCCESS)
        rc = MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS)
        return mpi_error(rc, "comparing the ranks' state");
    if (lo != hi)
        return er_error(ER_ERANGE, "rank %d of %d: the %s differ between ranks (hash %016llx here, range %016llx.."
                        "%016llx): the ranks no longer train the same model", dist_rank(), dist_size(), what,
                        (unsigned long long)h, (unsigned long long)lo, (unsigned long long)hi);
    return ER_OK;
}

#else // one rank

int dist_init(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    return ER_OK;
}

void dist_finalize(void) {}

void dist_abort(int code) {
    (void)code;
}

int dist_rank(void) {
    return 0;
}

int dist_size(void) {
    return 1;
}

int dist_local_rank(void) {
    return 0;
}

int dist_local_size(void) {
    return 1;
}

int dist_sum_device_floats(Backend *be, float *x, float *host, size_t n, int shared) {
    (void)be;
    (void)x;
    (void)host;
    (void)n;
    (void)shared;
    return ER_OK;
}

int dist_sum_floats(float *x, size_t n) {
    (void)x;
    (void)n;
    return ER_OK;
}

int dist_sum_doubles(double *x, int n) {
    (void)x;
    (void)n;
    return ER_OK;
}

int dist_gather(const void *mine, size_t n_mine, size_t size, void **all, size_t *n_all) {
    *n_all = n_mine;
    if (!(*all = er_alloc(n_mine * size + 1)))
        return ER_ENOMEM;
    memcpy(*all, mine, n_mine * size);
    return ER_OK;
}

int dist_check_same(const void *p, size_t bytes, const char *what) {
    (void)p;
    (void)bytes;
    (void)what;
    return ER_OK;
}

#endif
