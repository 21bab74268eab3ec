#include "switcher_train/switcher.h"

#include "core/error.h"
#include "data/grade.h"

int switcher_features(Engine *e, const int *prompt, int n_prompt, const LoraAdapter *adapter,
                      const PromptFeatureSpec *spec, float *feat) {
    return engine_prefill(e, prompt, n_prompt, adapter, spec, feat, NULL);
}

// One sample of g's route, graded.
static int route_correct(Engine *e, const int *prompt, int n_prompt, const GenConfig *g, const char *gold, int *ok,
                         long *tokens) {
    GenConfig one = *g;
    one.n_samples = 1;
    one.sampler.temperature = 0;
    one.keep_kv = 0;
    GenSample s;
    GenStats st;
    ER_TRY(engine_generate(e, prompt, n_prompt, &one, NULL, NULL, &s, &st));
    int rc = grade_response(s.text, s.answer_at, gold);
    if (tokens)
        *tokens += s.n_tokens;
    gen_samples_free(&s, 1);
    if (rc < 0)
        return rc;
    *ok = rc;
    return ER_OK;
}

int switcher_derive_label(Engine *e, const int *prompt, int n_prompt, const GenConfig *direct,
                          const GenConfig *reasoning, const char *gold, int *label, int *base_ok, int *adapter_ok,
                          long *tokens) {
    if (!gold)
        return er_error(ER_EINVAL, "switcher labels: the record has no gold answer");
    if (!reasoning->adapter)
        return er_error(ER_EINVAL, "switcher labels: deriving them needs the reasoning adapter");
    GenConfig d = *direct;
    d.adapter = NULL;
    d.response_prefix = NULL;
    int b, a;
    ER_TRY(route_correct(e, prompt, n_prompt, &d, gold, &b, tokens));
    ER_TRY(route_correct(e, prompt, n_prompt, reasoning, gold, &a, tokens));
    *label = !b && a;
    if (base_ok)
        *base_ok = b;
    if (adapter_ok)
        *adapter_ok = a;
    return ER_OK;
}
