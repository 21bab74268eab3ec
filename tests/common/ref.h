// Shared by the suites that check against the independent PyTorch reference (scripts/ref/): where the
// reference data lies ($ER_REF_DIR, default build/ref), the loud skip when it was not generated, the
// tensors of an expected.safetensors, and the tolerance check against them.
#ifndef TESTS_COMMON_REF_H
#define TESTS_COMMON_REF_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/safetensors.h"

static inline const char *ref_dir(void) {
    const char *d = getenv("ER_REF_DIR");
    return d ? d : "build/ref";
}

// buf = ref_dir()/name. Skips the calling test, loudly, when the case's expected.safetensors is missing;
// what names the data in that message ("PyTorch reference data").
static inline void ref_case_dir(char *buf, size_t n, const char *name, const char *what) {
    snprintf(buf, n, "%s/%s", ref_dir(), name);
    char probe[1100];
    snprintf(probe, sizeof probe, "%s/expected.safetensors", buf);
    FILE *f = fopen(probe, "rb");
    if (!f) {
        fprintf(stderr, "\n*** SKIPPED: %s %s is missing. Install python3-torch "
                        "(scripts/deps.sh) and run `make ref` (make test runs it). ***\n\n", what, probe);
        cr_skip_test("%s missing (%s)", what, probe);
    }
    fclose(f);
}

// The tensor `name` of f; the test fails when it is not there.
static inline const StTensor *ref_need(const StFile *f, const char *name) {
    const StTensor *t = safetensors_find(f, name);
    cr_assert(t, "%s: missing %s", f->path, name);
    return t;
}

// ref_need, and the tensor must have dtype dt.
static inline const StTensor *ref_need_dtype(const StFile *f, const char *name, ErDType dt) {
    const StTensor *t = ref_need(f, name);
    cr_assert_eq(t->dtype, dt, "%s: %s has dtype %s", f->path, name, dtype_name(t->dtype));
    return t;
}

// max |a - b| <= tol * max |b| over n values (b the reference)
static inline void ref_assert_close(const char *what, const float *a, const float *b, size_t n, double tol) {
    double max_err = 0, max_ref = 0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (!(e <= max_err)) { // NaN counts as the worst
            max_err = e;
            worst = i;
        }
        if (fabs(b[i]) > max_ref)
            max_ref = fabs(b[i]);
    }
    cr_assert(max_ref > 0, "%s: reference is all zeros", what);
    cr_assert(max_err <= tol * max_ref, "%s: max error %.3g at %zu (ours %.7g, ref %.7g) > %g x max |ref| %.3g", what,
              max_err, worst, a[worst], b[worst], tol, max_ref);
}

#endif
