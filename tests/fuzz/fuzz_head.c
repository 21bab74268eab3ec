// fuzz_head: the input is NAME.json FUZZ_SEP NAME.safetensors of a trained head, loaded by
// trained_head_load (model/head.h) against the tiny-base model (loaded once: the loader checks the
// model's fingerprint and hidden size), and, for a quarter of the inputs, with no model. A head that
// loads predicts once and must survive trained_head_save + trained_head_load unchanged.
#include "tests/fuzz/fuzz_common.h"

#include <math.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/threads.h"
#include "model/head.h"
#include "model/model.h"

static Model tiny;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    threads_set(1);
    if (model_load(&tiny, "models/tiny-base", 0) < 0) {
        fprintf(stderr, "fuzz_head: %s (run from the project root)\n", er_last_error());
        abort();
    }
    fuzz_root_dir("head");
    fuzz_mkdir("saved");
    return 0;
}

static void predict_once(const TrainedHead *t) {
    const Head *h = &t->net;
    size_t n = (size_t)2 * h->in;
    float *x = er_alloc(n * sizeof(float)), p[2];
    if (!x)
        return;
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((int)(i % 7) - 3) * 0.25f;
    FUZZ_CHECK(head_predict(h, x, 2, p) == ER_OK, "head_predict: %s", er_last_error());
    for (int i = 0; i < 2; i++)
        FUZZ_CHECK(isnan(p[i]) || (p[i] >= 0 && p[i] <= 1), "p = %g", p[i]);
    er_free(x);
}

static void check_save_load(const TrainedHead *t, const Model *m) {
    char path[FUZZ_PATH_MAX];
    fuzz_path(path, "saved/h");
    if (trained_head_save(t, path) < 0) {
        fuzz_check_save_failure("saving a loaded head");
        return;
    }
    TrainedHead u;
    int rc = trained_head_load(&u, path, t->role, m);
    FUZZ_CHECK(rc == ER_OK, "a saved head does not load: %s", er_last_error());
    const Head *a = &t->net, *b = &u.net;
    FUZZ_CHECK(a->kind == b->kind && a->in == b->in && a->hidden == b->hidden && a->n_params == b->n_params &&
                   t->threshold == u.threshold && strcmp(t->fingerprint, u.fingerprint) == 0,
               "head changed in a save / load round trip");
    if (t->role == HEAD_SWITCHER)
        FUZZ_CHECK(t->chunk == u.chunk && t->alpha == u.alpha, "switcher features changed");
    else
        FUZZ_CHECK(strcmp(t->verify_prompt, u.verify_prompt) == 0 && t->adapter_on == u.adapter_on,
                   "verifier features changed");
    FUZZ_CHECK(memcmp(a->params, b->params, a->n_params * sizeof(float)) == 0, "parameters changed");
    trained_head_free(&u);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *part[2];
    size_t len[2];
    static const char *const names[2] = {"h.json", "h.safetensors"};
    fuzz_write_parts(data, size, names, 2, part, len);
    // The caller knows which role it wants; take the one the file claims so most inputs get past that check.
    HeadRole role = memmem(part[0], len[0], "\"verifier\"", 10) ? HEAD_VERIFIER : HEAD_SWITCHER;
    const Model *m = size % 4 == 3 ? NULL : &tiny;
    char path[FUZZ_PATH_MAX];
    TrainedHead t;
    // Both spellings of the path: NAME and NAME.safetensors.
    int rc = trained_head_load(&t, fuzz_path(path, (size & 2) ? "h.safetensors" : "h"), role, m);
    if (rc < 0)
        return fuzz_refused("refused");
    FUZZ_CHECK(t.role == role && t.net.in >= 1 && t.net.params, "loaded head");
    if (m)
        FUZZ_CHECK(t.net.in == m->cfg.C, "head for %d inputs accepted for hidden size %d", t.net.in, m->cfg.C);
    predict_once(&t);
    check_save_load(&t, m);
    trained_head_free(&t);
    return 0;
}
