// PEFT adapter files: exact save/load round trips (all targets, a subset, rsLoRA, BF16/F16 tensors
// written by someone else), the exact key names and shapes on disk, and every malformed or
// unsupported input refused with one line naming the file and the key.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/json.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "lora/peft.h"

// Spelled out here rather than taken from lora_target_name: the test checks the names on disk.
static const char *const NAMES[LT_COUNT] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

static const LoraShape SHAPE = {.L = 2, .C = 16, .q_dim = 16, .kv_dim = 8, .FF = 24};

static void in_out(const LoraShape *s, int t, int *in, int *out) {
    int ins[LT_COUNT] = {s->C, s->C, s->C, s->q_dim, s->C, s->C, s->FF};
    int outs[LT_COUNT] = {s->q_dim, s->kv_dim, s->kv_dim, s->C, s->FF, s->FF, s->C};
    *in = ins[t];
    *out = outs[t];
}

static void key(char *buf, size_t n, int l, int t, char ab) {
    snprintf(buf, n, "base_model.model.model.layers.%d.%s.%s.lora_%c.weight", l, t < 4 ? "self_attn" : "mlp", NAMES[t],
             ab);
}

static void make_dir(char *dir) {
    strcpy(dir, "/tmp/er_peft_XXXXXX");
    cr_assert(mkdtemp(dir), "mkdtemp");
}

static void file_in(char *buf, size_t n, const char *dir, const char *name) { snprintf(buf, n, "%s/%s", dir, name); }

static void remove_dir(const char *dir) {
    char p[256];
    file_in(p, sizeof p, dir, "adapter_config.json");
    unlink(p);
    file_in(p, sizeof p, dir, "adapter_model.safetensors");
    unlink(p);
    rmdir(dir);
}

// A random adapter with B != 0 (lora_init leaves B zero, which would hide A/B mix-ups).
static void make_adapter(LoraAdapter *a, int r, float alpha, int rslora, float dropout, unsigned targets, uint64_t seed) {
    cr_assert_eq(lora_init(a, &SHAPE, r, alpha, rslora, dropout, targets, 0, seed), 0, "%s", er_last_error());
    ErRng rng;
    rng_seed(&rng, seed + 1);
    for (int l = 0; l < a->L; l++)
        for (int t = 0; t < LT_COUNT; t++) {
            LoraMat *m = &a->mats[l * LT_COUNT + t];
            if (m->A)
                for (int i = 0; i < m->out * r; i++)
                    m->B[i] = 2.0f * rng_uniform(&rng) - 1.0f;
        }
}

static void assert_same_adapter(const LoraAdapter *x, const LoraAdapter *y) {
    cr_assert_eq(x->L, y->L);
    cr_assert_eq(x->r, y->r);
    cr_assert_eq(x->alpha, y->alpha, "alpha %.9g vs %.9g", x->alpha, y->alpha);
    cr_assert_eq(x->rslora, y->rslora);
    cr_assert_eq(x->scale, y->scale, "scale %.9g vs %.9g", x->scale, y->scale);
    cr_assert_eq(x->dropout, y->dropout, "dropout %.9g vs %.9g", x->dropout, y->dropout);
    cr_assert_eq(x->targets, y->targets, "targets %#x vs %#x", x->targets, y->targets);
    cr_assert_eq(x->masked, y->masked);
    cr_assert_eq(!x->reasoning_prefix, !y->reasoning_prefix);
    if (x->reasoning_prefix)
        cr_assert_str_eq(x->reasoning_prefix, y->reasoning_prefix);
    cr_assert_eq(!x->base_model, !y->base_model);
    if (x->base_model)
        cr_assert_str_eq(x->base_model, y->base_model);
    cr_assert_eq(x->n_params, y->n_params);
    cr_assert_eq(memcmp(x->params, y->params, x->n_params * sizeof(float)), 0, "parameters differ");
    for (int i = 0; i < x->L * LT_COUNT; i++) {
        cr_assert_eq(!x->mats[i].A, !y->mats[i].A);
        if (x->mats[i].A) {
            size_t r = (size_t)x->r;
            cr_assert_eq(memcmp(x->mats[i].A, y->mats[i].A, r * x->mats[i].in * sizeof(float)), 0);
            cr_assert_eq(memcmp(x->mats[i].B, y->mats[i].B, r * x->mats[i].out * sizeof(float)), 0);
        }
    }
}

static void round_trip(int r, float alpha, int rslora, float dropout, unsigned targets, int masked, const char *prefix,
                       const char *base) {
    LoraAdapter a, b;
    make_adapter(&a, r, alpha, rslora, dropout, targets, 7);
    a.masked = masked;
    a.reasoning_prefix = prefix ? strdup(prefix) : NULL;
    a.base_model = base ? strdup(base) : NULL;
    char dir[64];
    make_dir(dir);
    cr_assert_eq(peft_save(&a, dir), 0, "%s", er_last_error());
    cr_assert_eq(peft_load(&b, dir, &SHAPE, 0), 0, "%s", er_last_error());
    assert_same_adapter(&a, &b);
    cr_assert_null(b.grads);
    lora_free(&b);
    // with gradients: allocated, zero, and laid out like the parameters
    cr_assert_eq(peft_load(&b, dir, &SHAPE, 1), 0, "%s", er_last_error());
    assert_same_adapter(&a, &b);
    cr_assert_not_null(b.grads);
    for (size_t i = 0; i < b.n_params; i++)
        cr_assert_eq(b.grads[i], 0.0f);
    for (int i = 0; i < b.L * LT_COUNT; i++)
        if (b.mats[i].A)
            cr_assert_eq(b.mats[i].gA - b.grads, b.mats[i].A - b.params);
    // saving what was loaded gives the same files
    char dir2[64];
    make_dir(dir2);
    cr_assert_eq(peft_save(&b, dir2), 0, "%s", er_last_error());
    for (int f = 0; f < 2; f++) {
        const char *name = f ? "adapter_model.safetensors" : "adapter_config.json";
        char p1[256], p2[256];
        file_in(p1, sizeof p1, dir, name);
        file_in(p2, sizeof p2, dir2, name);
        FILE *f1 = fopen(p1, "rb"), *f2 = fopen(p2, "rb");
        cr_assert(f1 && f2);
        int c1, c2;
        do {
            c1 = fgetc(f1);
            c2 = fgetc(f2);
            cr_assert_eq(c1, c2, "%s differs after load + save", name);
        } while (c1 != EOF);
        fclose(f1);
        fclose(f2);
    }
    lora_free(&a);
    lora_free(&b);
    remove_dir(dir);
    remove_dir(dir2);
}

Test(peft, round_trip_all_targets) { round_trip(4, 16.0f, 0, 0.0f, LORA_ALL_TARGETS, 1, "<think>\n", "Qwen/Qwen2.5-0.5B"); }

Test(peft, round_trip_subset_rslora) {
    round_trip(3, 7.3f, 1, 0.05f, (1u << LT_Q) | (1u << LT_V), 0, NULL, NULL);
}

Test(peft, round_trip_mlp_only_odd_alpha) {
    round_trip(5, 0.1f, 0, 0.1f, (1u << LT_DOWN) | (1u << LT_GATE), 1, "", "a \"quoted\" \\ name");
}

// The files as PEFT and Hugging Face expect them: every key, its shape and dtype, and the config.
Test(peft, layout_on_disk) {
    LoraAdapter a;
    unsigned targets = (1u << LT_K) | (1u << LT_O) | (1u << LT_UP);
    make_adapter(&a, 4, 8.0f, 1, 0.0f, targets, 11);
    a.reasoning_prefix = strdup("<think>\n");
    char dir[64], p[256];
    make_dir(dir);
    cr_assert_eq(peft_save(&a, dir), 0, "%s", er_last_error());

    file_in(p, sizeof p, dir, "adapter_model.safetensors");
    StFile f;
    cr_assert_eq(safetensors_open(&f, p), 0, "%s", er_last_error());
    cr_assert_eq(f.n_tensors, SHAPE.L * 3 * 2, "exactly A and B of each targeted module in each layer");
    for (int l = 0; l < SHAPE.L; l++)
        for (int t = 0; t < LT_COUNT; t++)
            for (int ab = 0; ab < 2; ab++) {
                char k[128];
                key(k, sizeof k, l, t, ab ? 'B' : 'A');
                const StTensor *st = safetensors_find(&f, k);
                if (!(targets & (1u << t))) {
                    cr_assert_null(st, "%s should not be there", k);
                    continue;
                }
                cr_assert_not_null(st, "missing %s", k);
                int in, out;
                in_out(&SHAPE, t, &in, &out);
                cr_assert_eq(st->dtype, DT_F32, "%s dtype", k);
                cr_assert_eq(st->ndim, 2, "%s ndim", k);
                cr_assert_eq(st->shape[0], ab ? out : 4, "%s dim 0", k);
                cr_assert_eq(st->shape[1], ab ? 4 : in, "%s dim 1", k);
                const LoraMat *m = lora_mat(&a, l, (LoraTarget)t);
                cr_assert_eq(memcmp(st->data, ab ? m->B : m->A, st->nbytes), 0, "%s data", k);
            }
    cr_assert_str_eq(safetensors_meta(&f, "format"), "pt");
    safetensors_close(&f);

    file_in(p, sizeof p, dir, "adapter_config.json");
    cJSON *j;
    cr_assert_eq(json_parse_file(p, 1 << 20, &j), 0, "%s", er_last_error());
#define STR(k, v) cr_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(j, k)), v, "%s", k)
    STR("peft_type", "LORA");
    STR("task_type", "CAUSAL_LM");
    STR("bias", "none");
    STR("base_model_name_or_path", "");
    STR("er_mask", "response");
    STR("er_reasoning_prefix", "<think>\n");
#undef STR
    cr_assert_eq(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "r")), 4.0);
    cr_assert_eq(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "lora_alpha")), 8.0);
    cr_assert_eq(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "lora_dropout")), 0.0);
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(j, "use_rslora")));
    cr_assert(cJSON_IsFalse(cJSON_GetObjectItem(j, "fan_in_fan_out")));
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(j, "inference_mode")));
    cJSON *tm = cJSON_GetObjectItem(j, "target_modules");
    cr_assert(cJSON_IsArray(tm));
    cr_assert_eq(cJSON_GetArraySize(tm), 3);
    cr_assert_str_eq(cJSON_GetArrayItem(tm, 0)->valuestring, "k_proj");
    cr_assert_str_eq(cJSON_GetArrayItem(tm, 1)->valuestring, "o_proj");
    cr_assert_str_eq(cJSON_GetArrayItem(tm, 2)->valuestring, "up_proj");
    cJSON_Delete(j);
    lora_free(&a);
    remove_dir(dir);
}

// ---- files made by the test itself (as another PEFT writer would) ----

typedef struct {
    StWriteTensor t[64];
    char names[64][128];
    void *owned[64];
    int n;
} TensorSet;

// Every A and B of `a`, in the order given (F32, pointing into the adapter).
static void tensors_of(TensorSet *ts, const LoraAdapter *a) {
    memset(ts, 0, sizeof *ts);
    for (int l = 0; l < a->L; l++)
        for (int t = 0; t < LT_COUNT; t++) {
            const LoraMat *m = lora_mat(a, l, (LoraTarget)t);
            if (!m)
                continue;
            for (int ab = 0; ab < 2; ab++) {
                StWriteTensor *w = &ts->t[ts->n];
                key(ts->names[ts->n], 128, l, t, ab ? 'B' : 'A');
                w->name = ts->names[ts->n];
                w->dtype = DT_F32;
                w->ndim = 2;
                w->shape[0] = ab ? m->out : a->r;
                w->shape[1] = ab ? a->r : m->in;
                w->data = ab ? m->B : m->A;
                ts->n++;
            }
        }
}

static int find_tensor(const TensorSet *ts, const char *name) {
    for (int i = 0; i < ts->n; i++)
        if (strcmp(ts->names[i], name) == 0)
            return i;
    cr_assert_fail("no tensor %s", name);
    return -1;
}

// Re-encodes tensor i as dtype (F16 / BF16 / I32 from its fp32 values).
static void convert(TensorSet *ts, int i, ErDType dt) {
    StWriteTensor *w = &ts->t[i];
    size_t n = (size_t)(w->shape[0] * w->shape[1]);
    void *buf = malloc(n * dtype_size(dt));
    cr_assert_eq(dtype_from_f32(buf, dt, w->data, n), 0);
    ts->owned[i] = buf;
    w->data = buf;
    w->dtype = dt;
}

static void write_tensors(TensorSet *ts, const char *dir) {
    char p[256];
    file_in(p, sizeof p, dir, "adapter_model.safetensors");
    cr_assert_eq(safetensors_write(p, ts->t, ts->n, NULL, 0), 0, "%s", er_last_error());
    for (int i = 0; i < 64; i++)
        free(ts->owned[i]);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char p[256];
    file_in(p, sizeof p, dir, name);
    FILE *f = fopen(p, "wb");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
}

// A config as PEFT 0.13 writes it (many keys this project ignores, no er_* keys), target_modules in
// set order, and BF16/F16 tensors: loads, with the tensors' exact values.
Test(peft, foreign_bf16_f16_adapter) {
    LoraAdapter a, b;
    unsigned targets = (1u << LT_Q) | (1u << LT_V) | (1u << LT_DOWN);
    make_adapter(&a, 2, 32.0f, 0, 0.0f, targets, 21);
    char dir[64];
    make_dir(dir);
    write_text(dir, "adapter_config.json",
               "{\n  \"alpha_pattern\": {},\n  \"auto_mapping\": null,\n  \"base_model_name_or_path\": "
               "\"Qwen/Qwen2.5-0.5B-Instruct\",\n  \"bias\": \"none\",\n  \"eva_config\": null,\n  \"exclude_modules\": "
               "null,\n  \"fan_in_fan_out\": false,\n  \"inference_mode\": true,\n  \"init_lora_weights\": true,\n  "
               "\"layer_replication\": null,\n  \"layers_pattern\": null,\n  \"layers_to_transform\": null,\n  "
               "\"loftq_config\": {},\n  \"lora_alpha\": 32,\n  \"lora_bias\": false,\n  \"lora_dropout\": 0.0,\n  "
               "\"megatron_config\": null,\n  \"megatron_core\": \"megatron.core\",\n  \"modules_to_save\": null,\n  "
               "\"peft_type\": \"LORA\",\n  \"r\": 2,\n  \"rank_pattern\": {},\n  \"revision\": null,\n  "
               "\"target_modules\": [\n    \"down_proj\",\n    \"v_proj\",\n    \"q_proj\"\n  ],\n  \"task_type\": "
               "\"CAUSAL_LM\",\n  \"use_dora\": false,\n  \"use_rslora\": false\n}\n");
    TensorSet ts;
    tensors_of(&ts, &a);
    for (int i = 0; i < ts.n; i++)
        convert(&ts, i, i % 3 == 2 ? DT_F16 : DT_BF16);
    // expected values: what the file holds, back in fp32
    float *want = malloc(a.n_params * sizeof(float));
    for (int i = 0; i < ts.n; i++) {
        int l, t;
        char ab, mod[16];
        cr_assert_eq(sscanf(ts.names[i], "base_model.model.model.layers.%d.%*[a-z_].%15[a-z_].lora_%c", &l, mod, &ab), 3);
        for (t = 0; strcmp(NAMES[t], mod) != 0; t++)
            ;
        const LoraMat *m = lora_mat(&a, l, (LoraTarget)t);
        float *dst = want + ((ab == 'B' ? m->B : m->A) - a.params);
        cr_assert_eq(dtype_to_f32(dst, ts.t[i].data, ts.t[i].dtype, (size_t)(ts.t[i].shape[0] * ts.t[i].shape[1])), 0);
    }
    write_tensors(&ts, dir);
    cr_assert_eq(peft_load(&b, dir, &SHAPE, 0), 0, "%s", er_last_error());
    cr_assert_eq(b.targets, targets);
    cr_assert_eq(b.r, 2);
    cr_assert_eq(b.scale, 16.0f);
    cr_assert_eq(b.masked, 0, "no er_mask: a standard (unmasked) adapter");
    cr_assert_null(b.reasoning_prefix);
    cr_assert_str_eq(b.base_model, "Qwen/Qwen2.5-0.5B-Instruct");
    cr_assert_eq(memcmp(b.params, want, a.n_params * sizeof(float)), 0, "BF16/F16 values not converted exactly");
    int differs = memcmp(b.params, a.params, a.n_params * sizeof(float)) != 0;
    cr_assert(differs, "bf16 rounding should have changed some values");
    free(want);
    lora_free(&a);
    lora_free(&b);
    remove_dir(dir);
}

Test(peft, all_linear_string) {
    LoraAdapter a, b;
    make_adapter(&a, 2, 4.0f, 0, 0.0f, LORA_ALL_TARGETS, 5);
    char dir[64];
    make_dir(dir);
    write_text(dir, "adapter_config.json",
               "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 4, \"target_modules\": \"all-linear\", "
               "\"init_lora_weights\": \"gaussian\", \"er_mask\": \"response\"}");
    TensorSet ts;
    tensors_of(&ts, &a);
    write_tensors(&ts, dir);
    cr_assert_eq(peft_load(&b, dir, &SHAPE, 0), 0, "%s", er_last_error());
    a.masked = 1;
    assert_same_adapter(&a, &b);
    lora_free(&a);
    lora_free(&b);
    remove_dir(dir);
}

// ---- malformed and unsupported input ----

// A valid adapter (r 4, targets q_proj and v_proj) in a new dir.
static void valid_dir(char *dir, LoraAdapter *a) {
    make_adapter(a, 4, 8.0f, 0, 0.0f, (1u << LT_Q) | (1u << LT_V), 31);
    make_dir(dir);
    cr_assert_eq(peft_save(a, dir), 0, "%s", er_last_error());
}

// peft_load fails, leaves nothing allocated, and says in one line which file and what.
static void expect_refused(const char *dir, const LoraShape *s, const char *file, const char *what) {
    LoraAdapter b;
    memset(&b, 0x5a, sizeof b);
    int rc = peft_load(&b, dir, s, 1);
    const char *msg = er_last_error();
    cr_assert_lt(rc, 0, "expected a refusal mentioning %s", what);
    cr_assert_null(b.params, "nothing allocated after a failure");
    cr_assert_null(b.mats);
    cr_assert(strstr(msg, file), "message does not name %s: %s", file, msg);
    cr_assert(strstr(msg, what), "message does not mention %s: %s", what, msg);
    cr_assert_null(strchr(msg, '\n'), "message is not one line: %s", msg);
}

// Sets `key` of adapter_config.json to the JSON `value` (NULL deletes it).
static void edit_config(const char *dir, const char *k, const char *value) {
    char p[256];
    file_in(p, sizeof p, dir, "adapter_config.json");
    cJSON *j;
    cr_assert_eq(json_parse_file(p, 1 << 20, &j), 0);
    cJSON_DeleteItemFromObjectCaseSensitive(j, k);
    if (value) {
        cJSON *v = cJSON_Parse(value);
        cr_assert_not_null(v, "test bug: %s", value);
        cJSON_AddItemToObject(j, k, v);
    }
    cr_assert_eq(json_write_file(p, j), 0);
    cJSON_Delete(j);
}

typedef struct {
    const char *key, *value, *expect;
} ConfigCase;

Test(peft, refuses_bad_configs) {
    static const ConfigCase cases[] = {
        {"use_dora", "true", "use_dora"},
        {"rank_pattern", "{\"q_proj\": 8}", "rank_pattern"},
        {"alpha_pattern", "{\"model.layers.0.self_attn.q_proj\": 32}", "alpha_pattern"},
        {"fan_in_fan_out", "true", "fan_in_fan_out"},
        {"bias", "\"all\"", "bias"},
        {"bias", "\"lora_only\"", "bias"},
        {"layers_to_transform", "[0]", "layers_to_transform"},
        {"layers_to_transform", "1", "layers_to_transform"},
        {"layers_pattern", "\"layers\"", "layers_pattern"},
        {"modules_to_save", "[\"lm_head\"]", "modules_to_save"},
        {"init_lora_weights", "\"pissa\"", "init_lora_weights"},
        {"init_lora_weights", "\"olora\"", "init_lora_weights"},
        {"init_lora_weights", "\"loftq\"", "init_lora_weights"},
        {"lora_bias", "true", "lora_bias"},
        {"use_qalora", "true", "use_qalora"},
        {"layer_replication", "[[0, 2]]", "layer_replication"},
        {"trainable_token_indices", "[1, 2]", "trainable_token_indices"},
        {"exclude_modules", "[\"q_proj\"]", "exclude_modules"},
        {"target_parameters", "[\"mlp.experts.gate_up_proj\"]", "target_parameters"},
        {"megatron_config", "{\"tp\": 2}", "megatron_config"},
        {"alora_invocation_tokens", "[5, 6]", "alora_invocation_tokens"},
        {"use_dora", "\"no\"", "use_dora"},
        {"peft_type", "\"IA3\"", "peft_type"},
        {"peft_type", NULL, "peft_type"},
        {"task_type", "\"SEQ_CLS\"", "task_type"},
        {"r", "0", "\"r\""},
        {"r", "-4", "\"r\""},
        {"r", "2.5", "\"r\""},
        {"r", "\"4\"", "\"r\""},
        {"r", NULL, "\"r\""},
        {"lora_alpha", "-1", "lora_alpha"},
        {"lora_alpha", "0", "lora_alpha"},
        {"lora_alpha", NULL, "lora_alpha"},
        {"lora_alpha", "1e38", "lora_alpha"}, // a finite alpha whose scale overflows the forward
        {"lora_alpha", "3.4e38", "lora_alpha"},
        {"lora_alpha", "1e39", "lora_alpha"},
        {"lora_alpha", "1e999", "lora_alpha"},
        {"lora_alpha", "1e6", "lora_alpha"}, // a scale of 250000 (r = 4)
        {"lora_dropout", "1.5", "lora_dropout"},
        {"target_modules", "[\"q_proj\", \"lm_head\"]", "lm_head"},
        {"target_modules", "\".*_proj\"", "target_modules"},
        {"target_modules", "[]", "target_modules"},
        {"target_modules", "[1]", "target_modules"},
        {"target_modules", "{\"q_proj\": 1}", "target_modules"},
        {"target_modules", NULL, "target_modules"},
        {"use_rslora", "\"yes\"", "use_rslora"},
        {"er_mask", "\"prompt\"", "er_mask"},
        {"er_reasoning_prefix", "3", "er_reasoning_prefix"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        LoraAdapter a;
        char dir[64];
        valid_dir(dir, &a);
        edit_config(dir, cases[i].key, cases[i].value);
        expect_refused(dir, &SHAPE, "adapter_config.json", cases[i].expect);
        lora_free(&a);
        remove_dir(dir);
    }
}

// A config whose "r" disagrees with the file is refused from the file's shapes before anything is sized
// from it (r = 65536 made a 60-byte config allocate 2.5 GB; the fuzz corpus replays that under a malloc
// limit).
Test(peft, rank_checked_against_the_file_first) {
    LoraAdapter a;
    char dir[64];
    valid_dir(dir, &a);
    edit_config(dir, "r", "65536");
    expect_refused(dir, &SHAPE, "adapter_model.safetensors", "expected [65536, ");
    lora_free(&a);
    remove_dir(dir);
}

// Training makes only adapters that load: lora_init refuses the scales peft_load refuses (sft --alpha 1e6
// trained, then could not be loaded).
Test(peft, init_refuses_an_absurd_scale) {
    LoraAdapter a;
    cr_assert_eq(lora_init(&a, &SHAPE, 4, 1e6f, 0, 0.0f, LORA_ALL_TARGETS, 0, 1), ER_ERANGE);
    cr_assert(strstr(er_last_error(), "scale"), "%s", er_last_error());
    cr_assert_null(a.mats);
    cr_assert_eq(lora_init(&a, &SHAPE, 1, 4e4f, 1, 0.0f, LORA_ALL_TARGETS, 0, 1), ER_ERANGE, "rsLoRA");
    cr_assert_eq(lora_init(&a, &SHAPE, 4, 4096.0f, 0, 0.0f, LORA_ALL_TARGETS, 0, 1), ER_OK, "%s", er_last_error());
    lora_free(&a);
}

Test(peft, neutral_values_are_accepted) {
    static const ConfigCase cases[] = {
        {"rank_pattern", "null", NULL},      {"alpha_pattern", "{}", NULL},        {"modules_to_save", "[]", NULL},
        {"layers_to_transform", "null", NULL}, {"init_lora_weights", "false", NULL}, {"task_type", NULL, NULL},
        {"bias", NULL, NULL},                {"lora_dropout", NULL, NULL},         {"use_dora", "false", NULL},
        {"base_model_name_or_path", "null", NULL}, {"some_future_key", "{\"x\": 1}", NULL},
        {"lora_alpha", "4096", NULL}, // a large scale (1024 at r = 4) that is still a scale
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        LoraAdapter a, b;
        char dir[64];
        valid_dir(dir, &a);
        edit_config(dir, cases[i].key, cases[i].value);
        cr_assert_eq(peft_load(&b, dir, &SHAPE, 0), 0, "%s = %s: %s", cases[i].key, cases[i].value, er_last_error());
        cr_assert_eq(memcmp(a.params, b.params, a.n_params * sizeof(float)), 0);
        lora_free(&a);
        lora_free(&b);
        remove_dir(dir);
    }
}

Test(peft, refuses_missing_or_broken_files) {
    LoraAdapter a;
    char dir[64], p[256];
    // no config
    valid_dir(dir, &a);
    file_in(p, sizeof p, dir, "adapter_config.json");
    unlink(p);
    expect_refused(dir, &SHAPE, "adapter_config.json", "missing");
    remove_dir(dir);
    // no weights
    cr_assert_eq(peft_save(&a, dir), 0);
    file_in(p, sizeof p, dir, "adapter_model.safetensors");
    unlink(p);
    expect_refused(dir, &SHAPE, "adapter_model.safetensors", "missing");
    remove_dir(dir);
    // no dir at all
    expect_refused("/nonexistent/er_peft", &SHAPE, "adapter_config.json", "missing");
    // bad JSON
    cr_assert_eq(peft_save(&a, dir), 0);
    write_text(dir, "adapter_config.json", "{\"peft_type\": \"LORA\", \"r\": 4,");
    expect_refused(dir, &SHAPE, "adapter_config.json", "JSON");
    // JSON that is not an object
    write_text(dir, "adapter_config.json", "[\"LORA\"]");
    expect_refused(dir, &SHAPE, "adapter_config.json", "object");
    remove_dir(dir);
    // truncated weights
    cr_assert_eq(peft_save(&a, dir), 0);
    file_in(p, sizeof p, dir, "adapter_model.safetensors");
    FILE *f = fopen(p, "rb");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    cr_assert_eq(truncate(p, size - 12), 0);
    expect_refused(dir, &SHAPE, "adapter_model.safetensors", "adapter_model.safetensors");
    cr_assert_eq(truncate(p, 5), 0);
    expect_refused(dir, &SHAPE, "adapter_model.safetensors", "adapter_model.safetensors");
    remove_dir(dir);
    lora_free(&a);
}

// What a TensorSet edit does to the file made from the valid adapter.
typedef enum { E_DROP, E_RENAME, E_DTYPE_I32, E_DTYPE_F64, E_NAN, E_ADD_K, E_ADD_LAYER2, E_ADD_OTHER } Edit;

static void tensor_case(Edit e, const char *expect) {
    LoraAdapter a, extra;
    char dir[64];
    valid_dir(dir, &a);
    TensorSet ts;
    tensors_of(&ts, &a);
    char k[128];
    float *nan_copy = NULL;
    int i = find_tensor(&ts, "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight");
    int with_extra = 0;
    switch (e) {
    case E_DROP:
        ts.n--;
        if (i != ts.n) {
            ts.t[i] = ts.t[ts.n];
            strcpy(ts.names[i], ts.names[ts.n]);
            ts.t[i].name = ts.names[i];
        }
        break;
    case E_RENAME: // PEFT without the ".weight" suffix (or with an adapter name left in)
        ts.names[i][strlen(ts.names[i]) - strlen(".weight")] = 0;
        break;
    case E_DTYPE_I32: convert(&ts, i, DT_I32); break;
    case E_DTYPE_F64: {
        double *d = malloc(sizeof(double) * ts.t[i].shape[0] * ts.t[i].shape[1]);
        for (int q = 0; q < ts.t[i].shape[0] * ts.t[i].shape[1]; q++)
            d[q] = ((const float *)ts.t[i].data)[q];
        ts.owned[i] = d;
        ts.t[i].data = d;
        ts.t[i].dtype = DT_F64;
        break;
    }
    case E_NAN:
        nan_copy = malloc(sizeof(float) * ts.t[i].shape[0] * ts.t[i].shape[1]);
        memcpy(nan_copy, ts.t[i].data, sizeof(float) * ts.t[i].shape[0] * ts.t[i].shape[1]);
        nan_copy[3] = NAN;
        ts.t[i].data = nan_copy;
        break;
    case E_ADD_K:
    case E_ADD_LAYER2:
    case E_ADD_OTHER: {
        // A tensor shaped right but for a module (k_proj) or layer (2 of 2) the adapter does not have.
        LoraShape big = SHAPE;
        big.L = 3;
        cr_assert_eq(lora_init(&extra, &big, 4, 8.0f, 0, 0.0f, LORA_ALL_TARGETS, 0, 1), 0);
        with_extra = 1;
        const LoraMat *m = e == E_ADD_K ? lora_mat(&extra, 0, LT_K) : lora_mat(&extra, 2, LT_Q);
        if (e == E_ADD_OTHER)
            strcpy(k, "base_model.model.lm_head.weight");
        else
            key(k, sizeof k, e == E_ADD_K ? 0 : 2, e == E_ADD_K ? LT_K : LT_Q, 'A');
        StWriteTensor *w = &ts.t[ts.n];
        strcpy(ts.names[ts.n], k);
        w->name = ts.names[ts.n];
        w->dtype = DT_F32;
        w->ndim = 2;
        w->shape[0] = 4;
        w->shape[1] = m->in;
        w->data = m->A;
        ts.n++;
        break;
    }
    }
    write_tensors(&ts, dir);
    expect_refused(dir, &SHAPE, "adapter_model.safetensors", expect);
    free(nan_copy);
    if (with_extra)
        lora_free(&extra);
    lora_free(&a);
    remove_dir(dir);
}

Test(peft, refuses_missing_tensor) { tensor_case(E_DROP, "missing tensor"); }
Test(peft, refuses_unknown_tensor_name) { tensor_case(E_RENAME, "v_proj.lora_B\""); }
Test(peft, refuses_int_dtype) { tensor_case(E_DTYPE_I32, "I32"); }
Test(peft, refuses_f64_dtype) { tensor_case(E_DTYPE_F64, "F64"); }
Test(peft, refuses_non_finite) { tensor_case(E_NAN, "non-finite"); }
Test(peft, refuses_untargeted_module) { tensor_case(E_ADD_K, "k_proj"); }
Test(peft, refuses_layer_beyond_model) { tensor_case(E_ADD_LAYER2, "layer 2"); }
Test(peft, refuses_non_lora_tensor) { tensor_case(E_ADD_OTHER, "lm_head"); }

// r in the config disagrees with the tensors; the base is not the one the adapter was made for.
Test(peft, refuses_wrong_shapes) {
    LoraAdapter a;
    char dir[64];
    valid_dir(dir, &a);
    edit_config(dir, "r", "8");
    expect_refused(dir, &SHAPE, "adapter_model.safetensors", "shape [4, 16], expected [8, 16]");
    edit_config(dir, "r", "4");
    LoraShape other = SHAPE;
    other.C = 32; // a wider base
    expect_refused(dir, &other, "adapter_model.safetensors", "expected [4, 32]");
    other = SHAPE;
    other.kv_dim = 4; // fewer KV heads
    expect_refused(dir, &other, "adapter_model.safetensors", "v_proj.lora_B.weight\" has shape [8, 4], expected [4, 4]");
    other = SHAPE;
    other.L = 3; // a deeper base: layer 2 has no tensors
    expect_refused(dir, &other, "adapter_model.safetensors", "missing tensor \"base_model.model.model.layers.2.");
    other = SHAPE;
    other.L = 1; // a shallower base
    expect_refused(dir, &other, "adapter_model.safetensors", "layer 1");
    // still loads against the right base
    LoraAdapter b;
    cr_assert_eq(peft_load(&b, dir, &SHAPE, 0), 0, "%s", er_last_error());
    lora_free(&b);
    lora_free(&a);
    remove_dir(dir);
}

Test(peft, save_refuses_uninitialised_adapter) {
    LoraAdapter a;
    memset(&a, 0, sizeof a);
    cr_assert_lt(peft_save(&a, "/tmp/er_peft_never_written"), 0);
    cr_assert(strstr(er_last_error(), "/tmp/er_peft_never_written"), "%s", er_last_error());
    cr_assert_eq(access("/tmp/er_peft_never_written", F_OK), -1, "nothing created");
}
