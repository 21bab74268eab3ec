// The GOMP_parallel wrapper behind tests/common/omp_probe.h.
#include "tests/common/omp_probe.h"

#include <omp.h>

static _Thread_local OmpProbe probe;

void omp_probe_reset(void) { probe = (OmpProbe){0, 0}; }
OmpProbe omp_probe_get(void) { return probe; }

// The region's body, entered by each thread of its team; the team's thread 0 is the thread that started
// the region, the owner of `starter`.
typedef struct {
    void (*fn)(void *);
    void *data;
    OmpProbe *starter;
} Region;

static void region_body(void *arg) {
    Region *r = arg;
    if (omp_get_thread_num() == 0) {
        r->starter->regions++;
        if (omp_get_num_threads() > r->starter->widest)
            r->starter->widest = omp_get_num_threads();
    }
    r->fn(r->data);
}

void __real_GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);
void __wrap_GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);

void __wrap_GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags) {
    Region r = {fn, data, &probe};
    __real_GOMP_parallel(region_body, &r, num_threads, flags);
}
