// Shared by the heads tests: a tiny random model dir (tests/common/helpers.h) plus a masked reasoning
// adapter in PEFT layout, random heads for that model and a small chains dataset, all under one /tmp dir.
#ifndef TESTS_COMMON_HEADS_HELPERS_H
#define TESTS_COMMON_HEADS_HELPERS_H

#include "data/synth.h"
#include "infer/engine.h"
#include "lora/peft.h"
#include "model/head.h"
#include "tests/common/helpers.h"

// dir/adapter (masked, prefix "<think>\n", non-zero B) for the model in dir/model.
static inline void heads_add_adapter(const char *dir) {
    char *model = path_join(dir, "model"), *adapter = path_join(dir, "adapter");
    Model m;
    cr_assert_eq(model_load(&m, model, 0), 0, "%s", er_last_error());
    LoraAdapter a;
    helper_random_adapter(&a, &m.cfg, 0.05f, 5);
    a.masked = 1;
    a.reasoning_prefix = er_strdup("<think>\n");
    cr_assert_eq(peft_save(&a, adapter), 0, "%s", er_last_error());
    lora_free(&a);
    model_free(&m);
    er_free(model);
    er_free(adapter);
}

// dir/model (tiny random model + tokenizer) and its dir/adapter as above.
static inline void heads_make_model_and_adapter(const char *dir) {
    char *model = path_join(dir, "model");
    helper_make_model(model);
    er_free(model);
    heads_add_adapter(dir);
}

// dir/<sw> and dir/<vf> (paths as trained_head_save takes them) for the model in dir/model, fingerprinted
// to it: a random switcher (MLP, hidden 8, EMA over 16-token chunks, alpha 0.5) with the given
// threshold, and a random linear verifier scoring the state after verify_prompt.
static inline void heads_write_random_heads(const char *dir, const char *sw, const char *vf, float threshold,
                                            const char *verify_prompt) {
    char *p = path_join(dir, "model");
    Model m;
    cr_assert_eq(model_load(&m, p, 0), 0, "%s", er_last_error());
    er_free(p);
    TrainedHead s = {0}, v = {0};
    cr_assert_eq(head_init(&s.net, HEAD_MLP, m.cfg.C, 8, 0.2f, 0, 1), 0);
    s.role = HEAD_SWITCHER;
    s.chunk = 16;
    s.alpha = 0.5f;
    s.threshold = threshold;
    model_fingerprint(&m, s.fingerprint);
    cr_assert_eq(head_init(&v.net, HEAD_LINEAR, m.cfg.C, 1, 0, 0, 2), 0);
    v.role = HEAD_VERIFIER;
    v.verify_prompt = er_strdup(verify_prompt);
    model_fingerprint(&m, v.fingerprint);
    p = path_join(dir, sw);
    cr_assert_eq(trained_head_save(&s, p), 0, "%s", er_last_error());
    er_free(p);
    p = path_join(dir, vf);
    cr_assert_eq(trained_head_save(&v, p), 0, "%s", er_last_error());
    er_free(p);
    trained_head_free(&s);
    trained_head_free(&v);
    model_free(&m);
}

// dir/<name>: n chains records (problem, answer, steps, needs_reasoning, ...).
static inline char *heads_make_data(const char *dir, const char *name, long n, uint64_t seed) {
    char *path = path_join(dir, name);
    ChainsConfig c;
    chains_config_default(&c);
    cr_assert_eq(chains_write_jsonl(&c, n, seed, path, NULL, NULL), 0, "%s", er_last_error());
    return path;
}

// The reasoning route as the heads sample it: n_samples responses from adapter `ad` after the prefix
// "<think>\n", at most max_new tokens each, at `temperature` from `seed`.
static inline GenConfig heads_sample_config(int n_samples, int max_new, float temperature, uint64_t seed,
                                            const LoraAdapter *ad) {
    GenConfig g;
    gen_config_default(&g);
    g.n_samples = n_samples;
    g.max_new = max_new;
    g.sampler.temperature = temperature;
    g.seed = seed;
    g.adapter = ad;
    g.response_prefix = "<think>\n";
    return g;
}

#endif
