// Thread setup: one OpenMP pool for our loops and, with OpenBLAS's OpenMP build, for BLAS too.
// BLAS is only called outside our parallel regions (never nested).
#ifndef CORE_THREADS_H
#define CORE_THREADS_H

// A parallel region costs a fork and a join: microseconds while the threads spin, tens of them when
// they sleep between regions (OMP_WAIT_POLICY=passive) or wait for a core, more than a small product or
// an element-wise pass over one token's row computes. Loops on the decode path with less work than
// this (multiply-adds, or elements) run on the calling thread (`#pragma omp ... if (work >= ...)`);
// what each row computes is the same either way.
enum { THREADS_MIN_WORK = 1 << 16 };

// n <= 0 means all cores. Returns the count in effect.
int threads_set(int n);
int threads_get(void);

// The thread count of the parallel regions the calling thread starts, for one call of a caller that has its
// own (a session's): OpenMP keeps that count (the nthreads ICV) per thread, so two threads in scopes of 1
// run side by side without either one's regions spreading onto the other's core. threads_push sets it to
// n (n <= 0: leaves it) and returns the count before, which threads_pop puts back. Only this thread's
// count changes: BLAS's global one (threads_set) is left alone; OpenBLAS's OpenMP build follows the calling
// thread's count.
int threads_push(int n);
void threads_pop(int prev);

#endif
