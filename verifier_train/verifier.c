#include "verifier_train/verifier.h"

#include "core/alloc.h"
#include "core/error.h"
#include "data/grade.h"

int verifier_collect(Engine *e, const int *prompt, int n_prompt, const GenConfig *g, const int *vq, int nvq,
                     int adapter_on, const char *gold, float *feats, float *labels, long *tokens) {
    if (!gold)
        return er_error(ER_EINVAL, "verifier labels: the record has no gold answer");
    GenConfig k = *g;
    k.keep_kv = 1;
    int N = k.n_samples;
    GenSample *s = er_calloc((size_t)N, sizeof(GenSample));
    if (!s)
        return ER_ENOMEM;
    GenStats st;
    int rc = engine_generate(e, prompt, n_prompt, &k, NULL, NULL, s, &st);
    if (rc < 0) {
        er_free(s);
        return rc;
    }
    for (int i = 0; rc == ER_OK && i < N; i++) {
        int ok = grade_response(s[i].text, s[i].answer_at, gold);
        if (ok < 0) {
            rc = ok;
            break;
        }
        labels[i] = (float)ok;
        if (tokens)
            *tokens += s[i].n_tokens;
    }
    if (rc == ER_OK)
        rc = engine_verify_features_all(e, vq, nvq, adapter_on, feats);
    engine_release_samples(e);
    gen_samples_free(s, N);
    er_free(s);
    return rc;
}
