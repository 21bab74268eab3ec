// The structs a caller fills (ErSessionParams, ErGenParams, ErCallbacks) and their size rule
// (infer/erinfer.h, "Structs"): *_init sets size and the defaults; a struct from an older header (smaller)
// gets the defaults for what it lacks, one from a newer header (bigger) is read when its unknown bytes are
// zero and refused when they are not; a size below the first version, or an uninitialised struct, is an
// error naming the struct, never a crash or a read far past it. Also the values ErSessionParams takes.
#include <criterion/criterion.h>
#include <stddef.h>
#include <string.h>

#include "core/error.h"
#include "infer/api_struct.h"
#include "infer/erinfer.h"
#include "tests/common/api_helpers.h"
#include "tests/common/helpers.h"

static HelperFixture fx; // per test: the temp dir and tmp/model

static void setup(void) { helper_fixture_open(&fx, "er_api_params_", NULL); }
static void teardown(void) { helper_fixture_close(&fx); }
TestSuite(api_params, .init = setup, .fini = teardown);

// Two versions of one struct: v2 added `b` (default 7) after v1's `a` (default 3).
typedef struct {
    size_t size;
    long long a;
} V1;
typedef struct {
    size_t size;
    long long a;
    long long b;
} V2;
#define V1_END (offsetof(V1, a) + sizeof(long long))

Test(api_params, an_older_struct_gets_the_defaults_of_the_fields_added_since) {
    const V2 defaults = {sizeof(V2), 3, 7};
    V1 old;
    cr_assert_eq(api_struct_init(&old, sizeof old, &defaults, sizeof defaults, V1_END, "v1_init"), ER_OK, "%s",
                 er_last_error());
    cr_assert_eq(old.size, sizeof old);
    cr_assert_eq(old.a, 3, "the older struct's own field gets its default");
    old.a = 11;
    V2 lib = defaults;
    cr_assert_eq(api_struct_read(&lib, sizeof lib, &old, V1_END, "f", "V"), ER_OK, "%s", er_last_error());
    cr_assert_eq(lib.a, 11, "what the caller set is read");
    cr_assert_eq(lib.b, 7, "the field its header did not have keeps the default");
    cr_assert_eq(lib.size, sizeof lib);
}

Test(api_params, a_newer_struct_is_read_while_its_new_fields_are_zero) {
    const V1 defaults = {sizeof(V1), 3};
    V2 newer;
    // A newer header's init running on the older library: what that library knows, and zeros past it.
    memset(&newer, 0xAB, sizeof newer);
    cr_assert_eq(api_struct_init(&newer, sizeof newer, &defaults, sizeof defaults, V1_END, "v1_init"), ER_OK);
    cr_assert_eq(newer.size, sizeof newer);
    cr_assert_eq(newer.a, 3);
    cr_assert_eq(newer.b, 0, "bytes the library does not know are zeroed");
    V1 lib = defaults;
    newer.a = 5;
    cr_assert_eq(api_struct_read(&lib, sizeof lib, &newer, V1_END, "f", "V"), ER_OK, "%s", er_last_error());
    cr_assert_eq(lib.a, 5);
    newer.b = 1; // a field the library cannot honour: refused, not ignored
    cr_assert_eq(api_struct_read(&lib, sizeof lib, &newer, V1_END, "er_f", "V"), ER_EINVAL);
    cr_assert(strstr(er_last_error(), "er_f") && strstr(er_last_error(), "V.size") &&
                  strstr(er_last_error(), "does not know"), "%s", er_last_error());
}

Test(api_params, sizes_below_the_first_version_or_far_past_are_refused) {
    const V2 defaults = {sizeof(V2), 3, 7};
    V2 lib = defaults, p = defaults;
    size_t bad[] = {0, sizeof(size_t), V1_END - 1, sizeof(V2) + API_STRUCT_SLACK_MAX + 1, (size_t)-1};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        p.size = bad[i];
        cr_assert_eq(api_struct_read(&lib, sizeof lib, &p, V1_END, "er_f", "V2"), ER_EINVAL, "size %zu", bad[i]);
        cr_assert(strstr(er_last_error(), "V2.size") && strstr(er_last_error(), "_init"), "%s", er_last_error());
        cr_assert_eq(api_struct_init(&p, bad[i], &defaults, sizeof defaults, V1_END, "v2_init"), ER_EINVAL, "size %zu",
                     bad[i]);
        cr_assert(strstr(er_last_error(), "v2_init"), "%s", er_last_error());
    }
    cr_assert_eq(lib.a, 3, "a refused struct changes nothing");
}

// The public structs: their init functions, and every call that reads one refusing a bad size.
Test(api_params, public_structs_follow_the_rule) {
    ErGenParams g;
    cr_assert_eq(er_gen_params_init_size(&g, sizeof g), ER_OK);
    cr_assert_eq(g.size, sizeof g);
    cr_assert_eq(g.max_new_tokens, 256);
    cr_assert_eq(g.top_p, 1.0f);
    ErSessionParams sp;
    er_session_params_init(&sp);
    cr_assert_eq(sp.size, sizeof sp);
    cr_assert(sp.max_samples == 1 && sp.max_tokens == 2048 && sp.kv_type == ER_KV_F32 && sp.n_threads == 0 &&
              !sp.callbacks);
    ErCallbacks cb;
    er_callbacks_init(&cb);
    cr_assert(cb.size == sizeof cb && !cb.user && !cb.log && !cb.progress && !cb.abort);
    cr_assert_eq(er_gen_params_init_size(&g, 4), ER_EINVAL);
    cr_assert_eq(er_session_params_init_size(&sp, sizeof sp - sizeof(void *) - 1), ER_EINVAL);

    ErModel *m;
    ErSession *s;
    cr_assert_eq(er_model_load(&m, fx.model), ER_OK, "%s", er_last_error());
    sp = helper_session_params(1, 64, 0);
    sp.size = 3;
    cr_assert_eq(er_session_open(&s, m, &sp), ER_EINVAL);
    cr_assert(strstr(er_last_error(), "er_session_open") && strstr(er_last_error(), "ErSessionParams.size"), "%s",
              er_last_error());
    cr_assert_null(s);
    ErModel *m2 = (ErModel *)0x1;
    cr_assert_eq(er_model_load_ex(&m2, fx.model, &(ErCallbacks){.size = 1}), ER_EINVAL);
    cr_assert(strstr(er_last_error(), "ErCallbacks.size"), "%s", er_last_error());
    cr_assert_null(m2);
    sp = helper_session_params(1, 64, 0);
    cr_assert_eq(er_session_open(&s, m, &sp), ER_OK, "%s", er_last_error());

    // An ErGenParams never initialised (garbage, as a stack struct has it): refused, nothing generated.
    ErGenParams junk;
    memset(&junk, 0x5A, sizeof junk);
    cr_assert_eq(er_generate_raw(s, "Start with 2.", &junk, NULL, NULL), ER_EINVAL);
    cr_assert(strstr(er_last_error(), "er_generate_raw") && strstr(er_last_error(), "ErGenParams.size"), "%s",
              er_last_error());
    // One from a newer header: zero past this library's fields is read, anything else refused.
    struct {
        ErGenParams p;
        int added;
    } newer;
    memset(&newer, 0, sizeof newer);
    cr_assert_eq(er_gen_params_init_size(&newer.p, sizeof newer), ER_OK);
    newer.p.max_new_tokens = 3;
    ErMessage msg = {"user", "Start with 2."};
    cr_assert_eq(er_generate(s, &msg, 1, &newer.p, NULL, NULL), ER_OK, "%s", er_last_error());
    cr_assert_eq(er_result_sample(s, 0)->n_tokens, 3, "the caller's max_new_tokens was read");
    newer.added = 1;
    cr_assert_eq(er_generate(s, &msg, 1, &newer.p, NULL, NULL), ER_EINVAL);
    cr_assert(strstr(er_last_error(), "does not know"), "%s", er_last_error());
    er_session_free(s);
    er_model_free(m);
}

Test(api_params, session_values_are_checked) {
    ErModel *m;
    ErSession *s = NULL;
    ErBatch *b = NULL;
    cr_assert_eq(er_model_load(&m, fx.model), ER_OK, "%s", er_last_error());
    const struct {
        int samples, tokens, kv, threads;
        const char *field;
    } bad[] = {{0, 64, 0, 0, "max_samples"},  {1, 1, 0, 0, "max_tokens"},  {1, 64, 2, 0, "kv_type"},
               {1, 64, -1, 0, "kv_type"},     {1, 64, 0, -1, "n_threads"}, {1, 64, 0, ER_THREADS_MAX + 1, "n_threads"},
               {1, 64, 0, -1000, "n_threads"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ErSessionParams p = helper_session_params(bad[i].samples, bad[i].tokens, 0);
        p.kv_type = bad[i].kv;
        p.n_threads = bad[i].threads;
        cr_assert_eq(er_session_open(&s, m, &p), ER_EINVAL, "%s", bad[i].field);
        cr_assert(strstr(er_last_error(), "er_session_open") && strstr(er_last_error(), bad[i].field), "%s: %s",
                  bad[i].field, er_last_error());
        cr_assert_null(s);
        cr_assert_eq(er_batch_open(&b, m, &p), ER_EINVAL, "%s", bad[i].field);
        cr_assert(strstr(er_last_error(), "er_batch_open") && strstr(er_last_error(), bad[i].field), "%s",
                  er_last_error());
        cr_assert_null(b);
    }
    ErSessionParams p = helper_session_params(1, 64, 1);
    p.n_threads = ER_THREADS_MAX;
    cr_assert_eq(er_session_open(&s, m, &p), ER_OK, "%s", er_last_error());
    er_session_free(s);
    er_model_free(m);
}
