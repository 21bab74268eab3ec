// The public C API against misuse: sizes whose arithmetic overflows an int are refused with an error
// status; `make SAN=1 test` runs these under ASan + UBSan.
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "infer/erinfer.h"
#include "tests/common/heads_helpers.h"

static HelperFixture fx; // per test: the temp dir and tmp/model

static void setup(void) {
    threads_set(2);
    helper_fixture_open(&fx, "er_api_misuse_", NULL);
}

static void teardown(void) { helper_fixture_close(&fx); }

TestSuite(api_misuse, .init = setup, .fini = teardown);

static ErModel *load_model(void) {
    ErModel *m;
    cr_assert_eq(er_model_load(&m, fx.model), 0, "%s", er_last_error());
    return m;
}

// ---- sizes ----

// INT_MAX samples overflowed max_samples + 1 (the KV sequences: samples and the prompt); half of INT_MAX
// rows overflowed rows + cached prompts; INT_MAX / 16 + 1 samples of 16 positions are more positions
// than a KV cache numbers. Each is refused before any size is computed from it, naming the numbers.
Test(api_misuse, session_and_batch_sizes_do_not_overflow) {
    ErModel *m = load_model();
    static const int sizes[][2] = {{INT_MAX, 16}, {INT_MAX - 1, 2}, {INT_MAX / 2 + 1, 16}, {INT_MAX / 16 + 1, 16}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char n[32];
        snprintf(n, sizeof n, "%d", sizes[i][0]);
        ErSession *s = (ErSession *)0x1;
        cr_assert_eq(er_session_open(&s, m, sizes[i][0], sizes[i][1], 0), ER_ERANGE, "%d samples x %d: %s",
                     sizes[i][0], sizes[i][1], er_last_error());
        cr_assert_null(s);
        cr_assert(strstr(er_last_error(), "er_session_open") && strstr(er_last_error(), n), "%s", er_last_error());
        ErBatch *b = (ErBatch *)0x1;
        cr_assert_eq(er_batch_open(&b, m, sizes[i][0], sizes[i][1], 1), ER_ERANGE, "%d rows x %d: %s", sizes[i][0],
                     sizes[i][1], er_last_error());
        cr_assert_null(b);
        cr_assert(strstr(er_last_error(), "er_batch_open") && strstr(er_last_error(), n), "%s", er_last_error());
    }
    ErSession *s;
    cr_assert_eq(er_session_open(&s, m, 4, 64, 0), 0, "%s", er_last_error()); // the model is still fine
    er_session_free(s);
    er_model_free(m);
}
