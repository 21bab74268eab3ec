// What the OpenMP parallel regions a thread starts ran on. GCC lowers every region (`parallel`, `parallel for`,
// with or without `if` and `num_threads`) to one GOMP_parallel call, and the test program is linked with
// -Wl,--wrap=GOMP_parallel (Makefile), so every region of the code under test passes through the probe: the
// team it got is counted on the thread that started it. Regions inside shared libraries (OpenBLAS) are not
// seen.
#ifndef TESTS_COMMON_OMP_PROBE_H
#define TESTS_COMMON_OMP_PROBE_H

typedef struct {
    long regions; // parallel regions this thread started since omp_probe_reset
    int widest;   // the most threads one of them ran on
} OmpProbe;

void omp_probe_reset(void);
OmpProbe omp_probe_get(void); // the calling thread's counts

#endif
