// Small heads (model/head.h): the backward against central finite differences (MLP with dropout,
// linear), the BCE gradient, and trained heads on disk: round trip, refusal for another model, for
// the wrong role and for broken files.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/rng.h"
#include "model/head.h"
#include "model/model.h"

static double loss_of(const Head *h, const float *x, const float *y, int N, uint64_t drop_seed) {
    float logit[16];
    HeadActs a;
    cr_assert_eq(head_acts_alloc(&a, h, N), 0);
    ErRng r;
    rng_seed(&r, drop_seed);
    cr_assert_eq(head_forward(h, x, N, logit, &a, &r), 0);
    head_acts_free(&a);
    return head_bce(logit, y, N, NULL);
}

static void check_grad(HeadKind kind, float dropout) {
    enum { N = 6, C = 5 };
    Head h;
    cr_assert_eq(head_init(&h, kind, C, 4, dropout, 1, 9), 0);
    float x[N * C], y[N] = {1, 0, 1, 1, 0, 0}, logit[N], dlogit[N];
    ErRng r;
    rng_seed(&r, 4);
    for (int i = 0; i < N * C; i++)
        x[i] = rng_normal(&r);
    HeadActs a;
    cr_assert_eq(head_acts_alloc(&a, &h, N), 0);
    ErRng dr;
    rng_seed(&dr, 77);
    head_zero_grad(&h);
    cr_assert_eq(head_forward(&h, x, N, logit, &a, &dr), 0);
    head_bce(logit, y, N, dlogit);
    cr_assert_eq(head_backward(&h, x, dlogit, N, &a), 0);
    int dropped = 0;
    for (int i = 0; i < N * a.H; i++)
        dropped += a.dgate[i] == 0;
    if (kind == HEAD_MLP && dropout > 0)
        cr_assert(dropped > 0, "dropout must drop some units");
    for (size_t i = 0; i < h.n_params; i++) {
        float keep = h.params[i], eps = 1e-3f;
        h.params[i] = keep + eps;
        double lp = loss_of(&h, x, y, N, 77);
        h.params[i] = keep - eps;
        double lm = loss_of(&h, x, y, N, 77);
        h.params[i] = keep;
        double num = (lp - lm) / (2.0 * eps);
        cr_assert(fabs(num - h.grads[i]) <= 2e-3 + 1e-2 * fabs(num), "param %zu: backward %g, finite difference %g", i,
                  h.grads[i], num);
    }
    head_acts_free(&a);
    head_free(&h);
}

Test(head, mlp_backward_matches_finite_differences) { check_grad(HEAD_MLP, 0.0f); }
Test(head, mlp_dropout_backward_matches_finite_differences) { check_grad(HEAD_MLP, 0.3f); }
Test(head, linear_backward_matches_finite_differences) { check_grad(HEAD_LINEAR, 0.0f); }

Test(head, bce_is_stable_and_matches_its_gradient) {
    float logit[4] = {100.0f, -100.0f, 0.0f, 3.0f}, y[4] = {1, 0, 1, 0}, d[4];
    double l = head_bce(logit, y, 4, d);
    cr_assert(isfinite(l));
    cr_assert_float_eq(l, (0 + 0 + log(2.0) + (3 + log1p(exp(-3.0)))) / 4, 1e-6);
    cr_assert_float_eq(d[2], (0.5f - 1) / 4, 1e-7);
    cr_assert_float_eq(d[3], head_sigmoid(3.0f) / 4, 1e-7);
    cr_assert(head_sigmoid(-1000.0f) >= 0 && head_sigmoid(1000.0f) <= 1);
}

Test(head, predict_is_the_sigmoid_of_the_forward_without_dropout) {
    Head h;
    cr_assert_eq(head_init(&h, HEAD_MLP, 3, 8, 0.5f, 0, 1), 0);
    float x[3] = {0.3f, -1.0f, 2.0f}, p1, p2;
    cr_assert_eq(head_predict(&h, x, 1, &p1), 0);
    cr_assert_eq(head_predict(&h, x, 1, &p2), 0);
    cr_assert_eq(p1, p2, "inference is deterministic (no dropout)");
    cr_assert(p1 > 0 && p1 < 1);
    head_free(&h);
}

// ---- files ----

static char tmp[64];
static Model model_a, model_b;

static void setup(void) {
    strcpy(tmp, "/tmp/er_head_XXXXXX");
    cr_assert(mkdtemp(tmp));
    ModelConfig c = {.arch = ARCH_QWEN2, .C = 8, .FF = 12, .L = 1, .NH = 2, .NKV = 1, .HS = 4, .V = 10,
                     .max_pos = 32, .rope_theta = 10000.0f, .eps = 1e-6f, .tied = 1, .qkv_bias = 1, .dtype = DT_F32,
                     .bos_id = -1, .eos_id = 3};
    cr_assert_eq(model_build_random(&model_a, &c, 0.5f, 1), 0);
    cr_assert_eq(model_build_random(&model_b, &c, 0.5f, 2), 0);
}
static void teardown(void) {
    model_free(&model_a);
    model_free(&model_b);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmp);
}
TestSuite(head_io, .init = setup, .fini = teardown);

static void make_head(TrainedHead *t, HeadRole role, const Model *m) {
    memset(t, 0, sizeof *t);
    cr_assert_eq(head_init(&t->net, role == HEAD_SWITCHER ? HEAD_MLP : HEAD_LINEAR, m->cfg.C, 8, 0.2f, 0, 5), 0);
    t->role = role;
    t->threshold = 0.375f;
    t->chunk = 128;
    t->alpha = 0.5f;
    t->verify_prompt = role == HEAD_VERIFIER ? er_strdup("\nIs this solution correct?") : NULL;
    t->adapter_on = 1;
    model_fingerprint(m, t->fingerprint);
    t->metrics = cJSON_CreateObject();
    cJSON_AddNumberToObject(t->metrics, "auc", 0.75);
}

Test(head_io, round_trip_switcher_and_verifier) {
    for (int role = HEAD_SWITCHER; role <= HEAD_VERIFIER; role++) {
        TrainedHead t, u;
        make_head(&t, (HeadRole)role, &model_a);
        char path[128];
        snprintf(path, sizeof path, "%s/%d.safetensors", tmp, role);
        cr_assert_eq(trained_head_save(&t, path), 0, "%s", er_last_error());
        char js[128];
        snprintf(js, sizeof js, "%s/%d.json", tmp, role);
        cr_assert(path_exists(js), "the JSON sits next to the tensors");
        // The path works with or without the suffix.
        snprintf(path, sizeof path, "%s/%d", tmp, role);
        cr_assert_eq(trained_head_load(&u, path, (HeadRole)role, &model_a), 0, "%s", er_last_error());
        cr_assert_eq(u.net.kind, t.net.kind);
        cr_assert_eq(u.net.n_params, t.net.n_params);
        cr_assert_arr_eq(u.net.params, t.net.params, sizeof(float) * t.net.n_params);
        cr_assert_float_eq(u.threshold, 0.375f, 1e-7);
        cr_assert_str_eq(u.fingerprint, t.fingerprint);
        if (role == HEAD_SWITCHER) {
            cr_assert_eq(u.chunk, 128);
            cr_assert_float_eq(u.alpha, 0.5f, 1e-7);
            cr_assert_float_eq(u.net.dropout, 0.2f, 1e-7);
        } else {
            cr_assert_str_eq(u.verify_prompt, "\nIs this solution correct?");
            cr_assert_eq(u.adapter_on, 1);
        }
        cr_assert(u.metrics && cJSON_GetObjectItem(u.metrics, "auc"));
        float x[8] = {1, 2, 3, 4, -1, -2, 0.5f, 0}, p, q;
        cr_assert_eq(head_predict(&t.net, x, 1, &p), 0);
        cr_assert_eq(head_predict(&u.net, x, 1, &q), 0);
        cr_assert_eq(p, q);
        // The other role is refused by name.
        TrainedHead w;
        cr_assert_lt(trained_head_load(&w, path, role == HEAD_SWITCHER ? HEAD_VERIFIER : HEAD_SWITCHER, &model_a), 0);
        cr_assert(strstr(er_last_error(), role == HEAD_SWITCHER ? "switcher head" : "verifier head"), "%s",
                  er_last_error());
        trained_head_free(&t);
        trained_head_free(&u);
    }
}

// A head is named by NAME or either of its files: saved as NAME.json it is NAME.safetensors + NAME.json
// (it was NAME.json.safetensors + NAME.json.json), and loads by each of the three.
Test(head_io, either_file_names_the_head) {
    TrainedHead t, u;
    make_head(&t, HEAD_VERIFIER, &model_a);
    char path[128];
    snprintf(path, sizeof path, "%s/vf.json", tmp);
    cr_assert_eq(trained_head_save(&t, path), 0, "%s", er_last_error());
    snprintf(path, sizeof path, "%s/vf.safetensors", tmp);
    cr_assert(path_exists(path), "%s", path);
    static const char *names[] = {"vf", "vf.json", "vf.safetensors"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", tmp, names[i]);
        cr_assert_eq(trained_head_load(&u, path, HEAD_VERIFIER, &model_a), 0, "%s: %s", names[i], er_last_error());
        cr_assert_str_eq(u.verify_prompt, t.verify_prompt);
        trained_head_free(&u);
    }
    cr_assert_eq(trained_head_name_len("a/b.json"), 3);
    cr_assert_eq(trained_head_name_len("a/b.safetensors"), 3);
    cr_assert_eq(trained_head_name_len("a/b.json.json"), 8, "one suffix only");
    cr_assert_eq(trained_head_name_len(".json"), 5, "a suffix alone is a name");
    trained_head_free(&t);
}

Test(head_io, another_model_is_refused) {
    char fa[17], fb[17], fa2[17];
    model_fingerprint(&model_a, fa);
    model_fingerprint(&model_b, fb);
    model_fingerprint(&model_a, fa2);
    cr_assert_str_eq(fa, fa2);
    cr_assert_str_neq(fa, fb);
    TrainedHead t, u;
    make_head(&t, HEAD_SWITCHER, &model_a);
    char path[128];
    snprintf(path, sizeof path, "%s/sw.safetensors", tmp);
    cr_assert_eq(trained_head_save(&t, path), 0);
    cr_assert_lt(trained_head_load(&u, path, HEAD_SWITCHER, &model_b), 0);
    cr_assert(strstr(er_last_error(), "trained on another model"), "%s", er_last_error());
    cr_assert_eq(trained_head_load(&u, path, HEAD_SWITCHER, NULL), 0, "no model: no check");
    trained_head_free(&u);
    trained_head_free(&t);
}

Test(head_io, broken_files_fail_cleanly) {
    TrainedHead t, u;
    make_head(&t, HEAD_SWITCHER, &model_a);
    char path[128], js[128];
    snprintf(path, sizeof path, "%s/sw.safetensors", tmp);
    snprintf(js, sizeof js, "%s/sw.json", tmp);
    cr_assert_lt(trained_head_load(&u, path, HEAD_SWITCHER, &model_a), 0, "missing files");
    cr_assert_eq(trained_head_save(&t, path), 0);
    const char *bad[] = {
        "{\"format\": \"other\"}",
        "{\"format\": \"er_head\", \"role\": \"switcher\", \"kind\": \"mlp\", \"in\": 8, \"hidden\": 0}",
        "not json",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(file_write_atomic(js, bad[i], strlen(bad[i])), 0);
        cr_assert_lt(trained_head_load(&u, path, HEAD_SWITCHER, &model_a), 0, "%s", bad[i]);
        cr_assert(strstr(er_last_error(), "sw.json"), "names the file: %s", er_last_error());
    }
    // Tensors of the wrong shape for the JSON.
    cr_assert_eq(trained_head_save(&t, path), 0);
    t.net.hidden = 4;
    TrainedHead small;
    make_head(&small, HEAD_SWITCHER, &model_a);
    head_free(&small.net);
    cr_assert_eq(head_init(&small.net, HEAD_MLP, 8, 4, 0.2f, 0, 1), 0);
    char other[128];
    snprintf(other, sizeof other, "%s/small.safetensors", tmp);
    cr_assert_eq(trained_head_save(&small, other), 0);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cp %s/small.safetensors %s", tmp, path);
    cr_assert_eq(system(cmd), 0);
    cr_assert_lt(trained_head_load(&u, path, HEAD_SWITCHER, &model_a), 0);
    cr_assert(strstr(er_last_error(), "shape"), "%s", er_last_error());
    t.net.hidden = 8;
    trained_head_free(&small);
    trained_head_free(&t);
}

// A switcher whose threshold is 1 sends nothing to reasoning: it was loaded and silently never routed.
Test(head_io, switcher_that_never_routes_is_refused) {
    TrainedHead t, u;
    make_head(&t, HEAD_SWITCHER, &model_a);
    t.threshold = 1.0f;
    char path[128];
    snprintf(path, sizeof path, "%s/never.safetensors", tmp);
    cr_assert_eq(trained_head_save(&t, path), 0, "%s", er_last_error());
    cr_assert_lt(trained_head_load(&u, path, HEAD_SWITCHER, &model_a), 0);
    cr_assert(strstr(er_last_error(), "threshold 1") && strstr(er_last_error(), "never.json"), "%s", er_last_error());
    trained_head_free(&t);
}

// "in" and "hidden" are checked against the file before anything is sized from them: with no model
// to pin "in", a 200-byte JSON asked for 4 TiB (found by fuzzing).
Test(head_io, sizes_checked_against_the_file_first) {
    TrainedHead t, u;
    make_head(&t, HEAD_SWITCHER, &model_a);
    char path[128], js[128];
    snprintf(path, sizeof path, "%s/big.safetensors", tmp);
    snprintf(js, sizeof js, "%s/big.json", tmp);
    cr_assert_eq(trained_head_save(&t, path), 0, "%s", er_last_error());
    cJSON *j;
    cr_assert_eq(json_parse_file(js, 1 << 20, &j), 0);
    cJSON_ReplaceItemInObject(j, "in", cJSON_CreateNumber(1 << 20));
    cJSON_ReplaceItemInObject(j, "hidden", cJSON_CreateNumber(1 << 20));
    cr_assert_eq(json_write_file(js, j), 0);
    cJSON_Delete(j);
    cr_assert_lt(trained_head_load(&u, path, HEAD_SWITCHER, NULL), 0);
    cr_assert(strstr(er_last_error(), "\"w1\"") && strstr(er_last_error(), "[1048576, 1048576]"), "%s",
              er_last_error());
    trained_head_free(&t);
}

// The KV cache type of the features ("features": {"kv"}) round-trips; a head without it loads as not
// recorded (older files); any other value is refused, naming the file and the field.
Test(head_io, kv_type_round_trips) {
    TrainedHead t, u;
    make_head(&t, HEAD_VERIFIER, &model_a);
    char path[128], js[128];
    snprintf(path, sizeof path, "%s/vf", tmp);
    snprintf(js, sizeof js, "%s/vf.json", tmp);
    for (int kv = HEAD_KV_UNKNOWN; kv <= HEAD_KV_INT8; kv++) {
        t.kv = (HeadKv)kv;
        cr_assert_eq(trained_head_save(&t, path), 0, "%s", er_last_error());
        cr_assert_eq(trained_head_load(&u, path, HEAD_VERIFIER, &model_a), 0, "%s", er_last_error());
        cr_assert_eq(u.kv, kv);
        trained_head_free(&u);
    }
    cJSON *j;
    cr_assert_eq(json_parse_file(js, 1 << 20, &j), 0);
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(j, "features"), "kv", cJSON_CreateString("int4"));
    cr_assert_eq(json_write_file(js, j), 0);
    cJSON_Delete(j);
    cr_assert_lt(trained_head_load(&u, path, HEAD_VERIFIER, &model_a), 0);
    cr_assert(strstr(er_last_error(), "vf.json") && strstr(er_last_error(), "\"kv\""), "%s", er_last_error());
    trained_head_free(&t);
}
