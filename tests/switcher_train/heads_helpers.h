// Shared by the heads tests: a tiny random model dir (tests/infer/helpers.h) plus a masked reasoning
// adapter in PEFT layout and a small chains dataset, all under one /tmp dir.
#ifndef TESTS_SWITCHER_TRAIN_HEADS_HELPERS_H
#define TESTS_SWITCHER_TRAIN_HEADS_HELPERS_H

#include "core/rng.h"
#include "data/synth.h"
#include "lora/peft.h"
#include "tests/infer/helpers.h"

// dir/model (tiny random model + tokenizer), dir/adapter (masked, prefix "<think>\n", non-zero B).
static inline void heads_make_model_and_adapter(const char *dir) {
    char *model = path_join(dir, "model"), *adapter = path_join(dir, "adapter");
    helper_make_model(model);
    Model m;
    cr_assert_eq(model_load(&m, model, 0), 0, "%s", er_last_error());
    const ModelConfig *c = &m.cfg;
    LoraShape s = {c->L, c->C, c->NH * c->HS, c->NKV * c->HS, c->FF};
    LoraAdapter a;
    cr_assert_eq(lora_init(&a, &s, 4, 8.0f, 0, 0.0f, LORA_ALL_TARGETS, 0, 2), 0);
    ErRng r;
    rng_seed(&r, 5);
    for (size_t i = 0; i < a.n_params; i++)
        a.params[i] += 0.05f * rng_normal(&r);
    a.masked = 1;
    a.reasoning_prefix = er_strdup("<think>\n");
    cr_assert_eq(peft_save(&a, adapter), 0, "%s", er_last_error());
    lora_free(&a);
    model_free(&m);
    er_free(model);
    er_free(adapter);
}

// dir/<name>: n chains records (problem, answer, steps, needs_reasoning, ...).
static inline char *heads_make_data(const char *dir, const char *name, long n, uint64_t seed) {
    char *path = path_join(dir, name);
    ChainsConfig c;
    chains_config_default(&c);
    cr_assert_eq(chains_write_jsonl(&c, n, seed, path, NULL, NULL), 0, "%s", er_last_error());
    return path;
}

#endif
