// Generation flags shared by erinfer generate, chat and eval (and so ertrain eval).
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "cli/cli.h"
#include "infer/runner.h"

// The library's defaults are the flags' defaults.
void gen_flags_default(GenFlags *f) {
    ErGenParams p;
    er_gen_params_init(&p);
    *f = (GenFlags){.default_max_new = p.max_new_tokens, .samples = p.n_samples, .answer_tokens = p.answer_tokens,
                    .temperature = p.temperature, .top_p = p.top_p, .kv = "f32"};
}

int gen_flags_specs(GenFlags *f, ArgSpec *s) {
    ArgSpec all[] = {
        {"model", ARG_STR, &f->model, "model dir (config.json, safetensors, tokenizer.json) or .gguf file", 1, 0, 0},
        {"adapter", ARG_STR, &f->adapter, "LoRA adapter dir (PEFT layout): off on the prompt, on in the response", 0, 0, 0},
        {"max-new", ARG_INT, &f->max_new, "new tokens per sample (0 = 256, or budget + answer tokens with --budget; "
                                          "chat: 512)", 0, 0, 1 << 20},
        {"temperature", ARG_FLOAT, &f->temperature, "sampling temperature (0 = greedy)", 0, 0, 100},
        {"top-k", ARG_INT, &f->top_k, "keep the k most likely tokens (0 = off)", 0, 0, 1 << 24},
        {"top-p", ARG_FLOAT, &f->top_p, "nucleus sampling mass (1 = off)", 0, 1e-9, 1},
        {"min-p", ARG_FLOAT, &f->min_p, "drop tokens below min-p x the top probability (0 = off)", 0, 0, 0.999999},
        {"seed", ARG_INT, &f->seed, "sampling seed (sample i uses stream i)", 0, 0, 2147483647},
        {"kv", ARG_STR, &f->kv, "KV cache type: f32 or int8", 0, 0, 0},
        {"budget", ARG_INT, &f->budget, "hard budget on the think length (through </think>): the answer suffix is "
         "forced to close it at this many tokens (0 = off)", 0, 0, 1 << 20},
        {"answer-tokens", ARG_INT, &f->answer_tokens, "tokens allowed after the budget, suffix included", 0, 1, 1 << 20},
        {"budget-suffix", ARG_TEXT, &f->suffix, "forced-answer text [\\n</think>\\n\\nFinal answer: ]", 0, 0, 0},
        {"prefix", ARG_TEXT, &f->prefix, "text forced at the start of the response [the adapter's reasoning prefix]", 0,
         0, 0},
        {"stop", ARG_TEXT, &f->stop, "stop string (cut from the output)", 0, 0, 0},
        {"system", ARG_STR, &f->system, "system message", 0, 0, 0},
        {"context", ARG_INT, &f->context,
         "positions per sample, prompt included (0 = 4096 + --max-new, at most the model's max_position_embeddings)", 0,
         0, 1 << 22},
        {"threads", ARG_INT, &f->threads, "threads (0 = all cores)", 0, 0, 4096},
        {"device", ARG_STR, &f->device, "where the passes run: cpu, or a GPU: cuda or cuda:N (a build with CUDA=1); "
                                        "sampling, the heads and the vote stay on the host [cpu]", 0, 0, 0},
        {"switcher", ARG_STR, &f->switcher, "switcher head (ertrain heads): route each query to the base's direct "
                                            "answer or to reasoning with the adapter", 0, 0, 0},
        {"verifier", ARG_STR, &f->verifier, "verifier head (ertrain heads): score each sample, weighted majority vote",
         0, 0, 0},
        {"route", ARG_STR, &f->route, "the routed pipeline's route: auto (the switcher decides), direct (the base "
         "answers) or reasoning; on a hybrid-thinking model (Qwen3) its thinking switch: direct = thinking off, "
         "reasoning = on (the adapter's, else the base's own) [auto]", 0, 0, 0},
        {"think", ARG_STR, &f->think, "on | off: the thinking switch (enable_thinking), --route reasoning | direct", 0,
         0, 0},
    };
    memcpy(s, all, sizeof all);
    return (int)(sizeof all / sizeof all[0]);
}

int gen_flags_max_new(const GenFlags *f) {
    if (f->max_new)
        return f->max_new;
    int with_budget = f->budget + f->answer_tokens;
    return f->budget > 0 && with_budget > f->default_max_new ? with_budget : f->default_max_new;
}

int gen_flags_params(const GenFlags *f, ErGenParams *p, int *kv_int8) {
    er_gen_params_init(p);
    p->max_new_tokens = gen_flags_max_new(f);
    p->n_samples = f->samples;
    p->temperature = (float)f->temperature;
    p->top_k = f->top_k;
    p->top_p = (float)f->top_p;
    p->min_p = (float)f->min_p;
    p->seed = (uint64_t)f->seed;
    p->budget = f->budget;
    p->answer_tokens = f->answer_tokens;
    p->budget_suffix = f->suffix;
    p->response_prefix = f->prefix;
    p->stop = &f->stop; // one --stop string, alive as long as the flags
    p->n_stop = f->stop ? 1 : 0;
    p->route = f->route;
    if (f->route && strcmp(f->route, "auto") != 0 && strcmp(f->route, "direct") != 0 &&
        strcmp(f->route, "reasoning") != 0)
        return er_error(ER_EINVAL, "--route must be auto, direct or reasoning, got \"%s\"", f->route);
    if (f->think) {
        if (strcmp(f->think, "on") != 0 && strcmp(f->think, "off") != 0)
            return er_error(ER_EINVAL, "--think must be on or off, got \"%s\"", f->think);
        const char *r = strcmp(f->think, "on") == 0 ? "reasoning" : "direct";
        if (f->route && strcmp(f->route, r) != 0)
            return er_error(ER_EINVAL, "--think %s and --route %s disagree: give one", f->think, f->route);
        p->route = r;
    }
    if (strcmp(f->kv, "f32") == 0)
        *kv_int8 = 0;
    else if (strcmp(f->kv, "int8") == 0)
        *kv_int8 = 1;
    else
        return er_error(ER_EINVAL, "--kv must be f32 or int8, got \"%s\"", f->kv);
    return ER_OK;
}

int gen_flags_open(const GenFlags *f, int max_samples, ErModel **m, ErSession **s) {
    *m = NULL;
    *s = NULL;
    ErGenParams unused;
    SessionSpec spec = {f->model, f->adapter, f->switcher, f->verifier, 0, f->context, f->device};
    ER_TRY(gen_flags_params(f, &unused, &spec.kv_int8));
    ER_TRY(runner_open_session(&spec, max_samples, gen_flags_max_new(f), m, s));
    char note[1400];
    if (runner_heads_kv_note(&spec, note, sizeof note))
        fprintf(stderr, "erinfer: warning: %s\n", note);
    return ER_OK;
}
