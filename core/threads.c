#include "core/threads.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef ER_BLAS
void openblas_set_num_threads(int n);
#endif

int threads_set(int n) {
#ifdef _OPENMP
    if (n <= 0)
        n = omp_get_num_procs();
    omp_set_num_threads(n);
#else
    n = 1;
#endif
#ifdef ER_BLAS
    openblas_set_num_threads(n);
#endif
    return n;
}

int threads_get(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

int threads_push(int n) {
#ifdef _OPENMP
    int prev = omp_get_max_threads();
    if (n > 0 && n != prev)
        omp_set_num_threads(n);
    return prev;
#else
    (void)n;
    return 1;
#endif
}

void threads_pop(int prev) {
#ifdef _OPENMP
    if (prev > 0 && prev != omp_get_max_threads())
        omp_set_num_threads(prev);
#else
    (void)prev;
#endif
}
