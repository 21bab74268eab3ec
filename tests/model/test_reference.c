// The forward, loss and gradients against the independent PyTorch reference (scripts/ref/), on random
// tiny checkpoints it wrote in HF layout: tied/untied, GQA, biases, F32/BF16 files, shards, llama with
// an explicit head_dim, Qwen3 (per-head q/k norms, head_dim apart from hidden / heads: untied F32, tied
// BF16, shards). `make test` generates them into $ER_REF_DIR first; without torch these tests are skipped
// with a loud message.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "core/threads.h"
#include "infer/score.h"
#include "model/model.h"
#include "tests/common/ref.h"

static void check_case(const char *name) {
    threads_set(2);
    char dir[1024], path[1100];
    ref_case_dir(dir, sizeof dir, name, "PyTorch reference data");
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    StFile ex;
    cr_assert_eq(safetensors_open(&ex, path), 0, "%s", er_last_error());
    const StTensor *tt = ref_need(&ex, "tokens");
    int B = (int)tt->shape[0], T = (int)tt->shape[1];
    const int *tokens = tt->data, *lengths = ref_need(&ex, "lengths")->data, *targets = ref_need(&ex, "targets")->data;
    const float *mask = ref_need(&ex, "loss_mask")->data, *ref_logits = ref_need(&ex, "logits")->data;
    double ref_loss = *(const float *)ref_need(&ex, "loss")->data;

    Model m;
    cr_assert_eq(model_load(&m, dir, MODEL_LOAD_TRAINABLE), 0, "%s", er_last_error());
    Activations a;
    cr_assert_eq(acts_alloc(&a, &m.cfg, B, T, ACTS_TRAIN, 0), 0);
    ModelInput in = {.B = B, .T = T, .tokens = tokens};
    cr_assert_eq(model_forward(&m, &in, &a), 0, "%s", er_last_error());

    // Logits at valid positions (padding rows are not defined by the reference).
    int V = m.cfg.V;
    for (int b = 0; b < B; b++) {
        char what[128];
        snprintf(what, sizeof what, "%s logits row %d", name, b);
        ref_assert_close(what, a.logits + (size_t)b * T * V, ref_logits + (size_t)b * T * V, (size_t)lengths[b] * V,
                         1e-4);
    }
    double loss;
    model_zero_grad(&m);
    cr_assert_eq(model_loss(&a, targets, mask, 1, &loss), 0);
    cr_assert(fabs(loss - ref_loss) <= 1e-4 * fabs(ref_loss), "%s loss %.8g vs reference %.8g", name, loss, ref_loss);
    cr_assert_eq(model_backward(&m, &in, &a), 0, "%s", er_last_error());
    for (int i = 0; i < m.n_params; i++) {
        char gname[128];
        snprintf(gname, sizeof gname, "grad.%s", m.params[i].name);
        const StTensor *g = ref_need(&ex, gname);
        cr_assert_eq((size_t)st_numel(g), m.params[i].numel, "%s: shape", gname);
        ref_assert_close(gname, m.params[i].grad, g->data, m.params[i].numel, 1e-3);
    }
    // Input gradient at valid positions.
    const float *ref_dx = ref_need(&ex, "grad.inputs_embeds")->data;
    int C = m.cfg.C;
    for (int b = 0; b < B; b++)
        ref_assert_close("grad.inputs_embeds", a.dres + (size_t)b * T * C, ref_dx + (size_t)b * T * C,
                     (size_t)lengths[b] * C, 1e-3);
    acts_free(&a);
    model_free(&m);

    // The inference load keeps matrices in the file's dtype (mmapped; BF16 stays BF16) and a
    // forward-only keeper: same logits.
    cr_assert_eq(model_load(&m, dir, 0), 0, "%s", er_last_error());
    cr_assert_eq(acts_alloc(&a, &m.cfg, B, T, ACTS_SCORE, 0), 0);
    cr_assert_eq(model_forward(&m, &in, &a), 0);
    for (int b = 0; b < B; b++)
        ref_assert_close("logits (inference load)", a.logits + (size_t)b * T * V, ref_logits + (size_t)b * T * V,
                     (size_t)lengths[b] * V, 1e-4);
    acts_free(&a);
    model_free(&m);
    safetensors_close(&ex);
}

Test(reference, qwen2_tied_f32) { check_case("qwen2_tied_f32"); }
Test(reference, qwen2_untied_f32) { check_case("qwen2_untied_f32"); }
Test(reference, qwen2_bf16) { check_case("qwen2_bf16"); }
Test(reference, qwen2_sharded) { check_case("qwen2_sharded"); }
Test(reference, llama_headdim) { check_case("llama_headdim"); }
Test(reference, qwen3_untied_f32) { check_case("qwen3_untied_f32"); }
Test(reference, qwen3_bf16) { check_case("qwen3_bf16"); }
Test(reference, qwen3_sharded) { check_case("qwen3_sharded"); }

// The score runner (erinfer score) on a checkpoint written by the reference: per-token log-probs match.
// (tests/lora/test_lora_reference.c runs the erinfer score command itself, with an adapter.)
Test(reference, score_run, .timeout = 60) {
    char dir[1024];
    ref_case_dir(dir, sizeof dir, "qwen2_untied_f32", "PyTorch reference data");
    char out[] = "/tmp/er_score_XXXXXX";
    int fd = mkstemp(out);
    cr_assert(fd >= 0);
    FILE *fp = fdopen(fd, "w");
    cr_assert(fp);
    char input[1100];
    snprintf(input, sizeof input, "%s/score_input.jsonl", dir);
    threads_set(1);
    ScoreConfig sc = {.model = dir, .input = input, .out = fp};
    ScoreResult res;
    cr_assert_eq(score_run(&sc, &res), 0, "%s", er_last_error());
    cr_assert_eq(fclose(fp), 0);

    char path[1100];
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    StFile ex;
    cr_assert_eq(safetensors_open(&ex, path), 0);
    const StTensor *lp = ref_need(&ex, "logprobs");
    const int *lengths = ref_need(&ex, "lengths")->data;
    int Tm1 = (int)lp->shape[1];
    const float *ref = lp->data;
    JsonlReader r;
    cr_assert_eq(jsonl_open(&r, out), 0);
    cJSON *rec;
    int row = 0;
    while (jsonl_next(&r, &rec) == 1) {
        cJSON *arr = cJSON_GetObjectItem(rec, "logprobs");
        int n = cJSON_GetArraySize(arr);
        cr_assert_eq(n, lengths[row] - 1, "row %d: %d logprobs for %d tokens", row, n, lengths[row]);
        cr_assert_eq((int)cJSON_GetObjectItem(rec, "n")->valuedouble, n);
        double sum = 0;
        for (int i = 0; i < n; i++) {
            double got = cJSON_GetArrayItem(arr, i)->valuedouble, want = ref[(size_t)row * Tm1 + i];
            cr_assert(fabs(got - want) <= 1e-4 * (1 + fabs(want)), "row %d logprob %d: %g vs %g", row, i, got, want);
            sum += got;
        }
        cr_assert_float_eq(cJSON_GetObjectItem(rec, "nll")->valuedouble, -sum / n, 1e-5);
        cJSON_Delete(rec);
        row++;
    }
    cr_assert_eq(row, (int)lp->shape[0], "one output line per input line");
    cr_assert_eq(res.records, row);
    jsonl_close(&r);
    safetensors_close(&ex);
    unlink(out);
}
