// Thread setup: one OpenMP pool for our loops and, with OpenBLAS's OpenMP build, for BLAS too.
// BLAS is only called outside our parallel regions (never nested).
#ifndef CORE_THREADS_H
#define CORE_THREADS_H

// n <= 0 means all cores. Returns the count in effect.
int threads_set(int n);
int threads_get(void);

#endif
