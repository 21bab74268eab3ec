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
