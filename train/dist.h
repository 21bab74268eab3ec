// Data parallelism over MPI (`make MPI=1`, OpenMPI): N copies of a training command run under
// `mpirun -np N`, each reads its own share of every global batch, and the gradients are summed
// across them before the optimizer step, so parameters and optimizer state stay the same on every
// rank. Without MPI=1 this file compiles to one rank: every call is a no-op (the normal build needs
// no MPI header or library).
//
// What a rank takes of n items (batch rows, GRPO prompt groups, eval records) is dist_share's
// contiguous block, so items in rank order are the items in order. Rank 0 alone writes files.
// Every call here is collective: all ranks make it, in the same order.
#ifndef TRAIN_DIST_H
#define TRAIN_DIST_H

#include <stddef.h>

#include "model/backend.h"

// The entry programs: before and after everything else (argc/argv as MPI_Init wants them).
int dist_init(int *argc, char ***argv);
void dist_finalize(void);
// Ends every rank of the job with `code` (for the entry programs, after their one error line; a
// no-op with one rank, where the program exits itself).
void dist_abort(int code);

int dist_rank(void); // 0 without MPI
int dist_size(void); // 1 without MPI
// This rank among the ranks on its own node (MPI_COMM_TYPE_SHARED, whatever launched them): which GPU it
// takes. 0 and 1 without MPI.
int dist_local_rank(void);
int dist_local_size(void);

// Items [*lo, *hi) of n for `rank` of `size`: contiguous blocks differing by at most one.
void dist_share(int n, int rank, int size, int *lo, int *hi);

// x (n) = the sum over ranks of x, in place; floats go in buckets (MPI counts are int).
int dist_sum_floats(float *x, size_t n);
int dist_sum_doubles(double *x, int n);
// x (n floats on backend be) = the sum over ranks, in place; host (n floats) is scratch. On a CUDA backend
// in a build with NCCL (make CUDA=1 MPI=1, NCCL found) the sum runs on the GPUs (ncclAllReduce on be's
// queue; the communicator is made on the first call from rank 0's id, sent by MPI); otherwise, or when
// `shared` (the device is shared with other ranks: NCCL refuses one GPU twice in a communicator), or when
// any rank cannot use NCCL (decided together on the first call), x goes through the host: copied there,
// dist_sum_floats, copied back. Both give the sum of the same values; only the order of the additions differs.
int dist_sum_device_floats(Backend *be, float *x, float *host, size_t n, int shared);
// *all (allocated, er_free) = every rank's `mine` (n_mine items of `size` bytes) one after the other
// in rank order, on every rank; *n_all their total count.
int dist_gather(const void *mine, size_t n_mine, size_t size, void **all, size_t *n_all);
// Errors when `bytes` at p differ between ranks (a hash compared across ranks; `what` names them).
int dist_check_same(const void *p, size_t bytes, const char *what);
// Seconds spent in dist_sum_floats so far on this rank (the all-reduce share the bench reports).
double dist_reduce_seconds(void);

#endif
