// Model dirs: save -> load round trips, and every kind of bad model dir gets one clear error.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/safetensors.h"
#include "model/model.h"

static ModelConfig small_config(int tied) {
    ModelConfig c = {.arch = ARCH_QWEN2, .C = 8, .FF = 12, .L = 2, .NH = 2, .NKV = 1, .HS = 4, .V = 10, .max_pos = 32,
                     .rope_theta = 10000.0f, .eps = 1e-6f, .tied = tied, .qkv_bias = 1, .dtype = DT_F32,
                     .bos_id = -1, .eos_id = 3};
    return c;
}

// Temporary model dirs, removed after each test.
static char tmp_dirs[8][32];
static int n_tmp;
static char *tmpdir(void) {
    cr_assert(n_tmp < 8);
    char *d = tmp_dirs[n_tmp++];
    strcpy(d, "/tmp/er_model_XXXXXX");
    cr_assert(mkdtemp(d));
    return d;
}
static void remove_tmp(void) {
    for (; n_tmp > 0; n_tmp--) {
        char cmd[64];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dirs[n_tmp - 1]);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", tmp_dirs[n_tmp - 1]);
    }
}
TestSuite(model_io, .fini = remove_tmp);

static void write_text(const char *dir, const char *name, const char *text) {
    char *p = path_join(dir, name);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
    free(p);
}

static void roundtrip(int tied, int bf16) {
    ModelConfig c = small_config(tied);
    Model a, b;
    cr_assert_eq(model_build_random(&a, &c, 0.5f, 5), 0);
    char *dir = tmpdir();
    cr_assert_eq(model_save(&a, dir, bf16), 0, "%s", er_last_error());
    cr_assert_eq(model_load(&b, dir, MODEL_LOAD_TRAINABLE), 0, "%s", er_last_error());
    cr_assert_eq(b.n_params, a.n_params);
    cr_assert_eq(b.cfg.tied, tied);
    cr_assert_eq(b.cfg.eos_id, 3);
    for (int i = 0; i < a.n_params; i++) {
        cr_assert_str_eq(a.params[i].name, b.params[i].name);
        for (size_t j = 0; j < a.params[i].numel; j++) {
            float want = bf16 ? bf16_to_f32(f32_to_bf16(a.params[i].data[j])) : a.params[i].data[j];
            cr_assert_eq(b.params[i].data[j], want, "%s[%zu]", a.params[i].name, j);
        }
    }
    model_free(&b);
    // Inference load: BF16 matrices stay BF16 (half the memory), vectors become fp32.
    cr_assert_eq(model_load(&b, dir, 0), 0, "%s", er_last_error());
    cr_assert_eq(b.layers[0].wq.fmt, bf16 ? WF_BF16 : WF_F32);
    cr_assert_eq(b.trainable, 0);
    model_free(&b);
    model_free(&a);
}

Test(model_io, roundtrip_f32_untied) { roundtrip(0, 0); }
Test(model_io, roundtrip_f32_tied) { roundtrip(1, 0); }
Test(model_io, roundtrip_bf16) { roundtrip(0, 1); }

static const char *good_config =
    "{\"model_type\": \"qwen2\", \"hidden_size\": 8, \"intermediate_size\": 12, \"num_hidden_layers\": 2,"
    " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 4, \"vocab_size\": 10,"
    " \"rope_theta\": 10000.0, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false}";

// Loads `dir` expecting failure whose message contains every needle.
static void expect_load_error(const char *dir, const char *needle) {
    Model m;
    er_clear_error();
    int rc = model_load(&m, dir, 0);
    cr_assert(rc < 0, "loading %s should fail (%s)", dir, needle);
    cr_assert(strstr(er_last_error(), needle), "error \"%s\" should mention \"%s\"", er_last_error(), needle);
    cr_assert(!strchr(er_last_error(), '\n'), "one line");
}

static char *dir_with_model(void) {
    ModelConfig c = small_config(0);
    Model a;
    cr_assert_eq(model_build_random(&a, &c, 0.5f, 5), 0);
    char *dir = tmpdir();
    cr_assert_eq(model_save(&a, dir, 0), 0);
    model_free(&a);
    return dir;
}

Test(model_io, bad_configs) {
    char *dir = dir_with_model();
    struct { const char *json, *needle; } cases[] = {
        {"{not json", "not valid JSON"},
        {"[1, 2]", "JSON object"},
        {"{\"model_type\": \"gpt2\"}", "model_type \"gpt2\""},
        {"{\"model_type\": \"qwen2\", \"hidden_size\": 8}", "intermediate_size"},
        {"{\"model_type\": \"qwen2\", \"hidden_size\": \"8\", \"intermediate_size\": 12}", "hidden_size"},
        {"{\"model_type\": \"qwen2\", \"hidden_size\": -8, \"intermediate_size\": 12}", "out of range"},
    };
    // Values checked as the floats the model uses (found by fuzzing): inf, zero, one.
    const char *floats[][3] = {{"\"rope_theta\": 10000.0", "\"rope_theta\": 1e300", "rope_theta"},
                               {"\"rms_norm_eps\": 1e-6", "\"rms_norm_eps\": 1e-50", "rms_norm_eps"},
                               {"\"rms_norm_eps\": 1e-6", "\"rms_norm_eps\": 0.99999999999", "rms_norm_eps"}};
    for (size_t i = 0; i < 3; i++) {
        const char *at = strstr(good_config, floats[i][0]);
        cr_assert(at);
        char cfg[1200];
        snprintf(cfg, sizeof cfg, "%.*s%s%s", (int)(at - good_config), good_config, floats[i][1],
                 at + strlen(floats[i][0]));
        write_text(dir, "config.json", cfg);
        expect_load_error(dir, floats[i][2]);
    }
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_text(dir, "config.json", cases[i].json);
        expect_load_error(dir, cases[i].needle);
        expect_load_error(dir, "config.json");
    }
    // Heads that do not divide, unsupported rope scaling.
    write_text(dir, "config.json",
               "{\"model_type\": \"qwen2\", \"hidden_size\": 8, \"intermediate_size\": 12, \"num_hidden_layers\": 2,"
               " \"num_attention_heads\": 3, \"num_key_value_heads\": 2, \"vocab_size\": 10}");
    expect_load_error(dir, "multiple of num_key_value_heads");
    write_text(dir, "config.json",
               "{\"model_type\": \"qwen2\", \"hidden_size\": 8, \"intermediate_size\": 12, \"num_hidden_layers\": 2,"
               " \"num_attention_heads\": 2, \"vocab_size\": 10, \"rope_scaling\": {\"type\": \"yarn\"}}");
    expect_load_error(dir, "rope_scaling");
}

Test(model_io, config_does_not_match_weights) {
    char *dir = dir_with_model();
    // vocab 12 in the config, 10 rows in the file
    char cfg[1024];
    snprintf(cfg, sizeof cfg, "%s", good_config);
    char *v = strstr(cfg, "\"vocab_size\": 10");
    memcpy(v, "\"vocab_size\": 12", 16);
    write_text(dir, "config.json", cfg);
    expect_load_error(dir, "model.embed_tokens.weight");
    expect_load_error(dir, "vocab_size gives 12");
    // Checked against the files before anything is sized from the config: 2^24 layers over 2 would
    // otherwise reserve gigabytes before failing.
    snprintf(cfg, sizeof cfg, "%s", good_config);
    char big[1200];
    char *at = strstr(cfg, "\"num_hidden_layers\": 2");
    snprintf(big, sizeof big, "%.*s\"num_hidden_layers\": 16777216%s", (int)(at - cfg), cfg, at + 22);
    write_text(dir, "config.json", big);
    expect_load_error(dir, "num_hidden_layers is 16777216 but the weight files hold 2 layers");
    snprintf(cfg, sizeof cfg, "%s", good_config);
    memcpy(strstr(cfg, "\"intermediate_size\": 12"), "\"intermediate_size\": 24", 23);
    write_text(dir, "config.json", cfg);
    expect_load_error(dir, "intermediate_size gives 24");
    // Products of dimensions are checked too: heads x head_dim = 2^48 would overflow an int.
    write_text(dir, "config.json",
               "{\"model_type\": \"qwen2\", \"hidden_size\": 8, \"intermediate_size\": 12, \"num_hidden_layers\": 2,"
               " \"num_attention_heads\": 16777216, \"num_key_value_heads\": 1, \"head_dim\": 16777216,"
               " \"vocab_size\": 10}");
    expect_load_error(dir, "num_attention_heads x head_dim");
}

// A NaN or an infinity in the weights is refused at load, naming the tensor and the index.
Test(model_io, non_finite_weights) {
    ModelConfig c = small_config(0);
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (int inf = 0; inf < 2; inf++) {
            Model a;
            cr_assert_eq(model_build_random(&a, &c, 0.5f, 5), 0);
            ParamTensor *p = (ParamTensor *)model_find_param(&a, "model.layers.1.mlp.up_proj.weight");
            cr_assert(p);
            p->data[7] = inf ? -INFINITY : NAN;
            char *dir = tmpdir();
            cr_assert_eq(model_save(&a, dir, bf16), 0, "%s", er_last_error());
            model_free(&a);
            expect_load_error(dir, "\"model.layers.1.mlp.up_proj.weight\"");
            expect_load_error(dir, "at index 7");
            Model m;
            cr_assert(model_load(&m, dir, MODEL_LOAD_TRAINABLE) < 0, "a trainable load must refuse it too");
        }
}

Test(model_io, missing_tensor_and_files) {
    char *dir = dir_with_model();
    // Rewrite the weights without one tensor.
    char *path = path_join(dir, "model.safetensors");
    StFile f;
    cr_assert_eq(safetensors_open(&f, path), 0);
    StWriteTensor ts[64];
    int n = 0;
    for (int i = 0; i < f.n_tensors; i++) {
        if (strcmp(f.tensors[i].name, "model.norm.weight") == 0)
            continue;
        ts[n] = (StWriteTensor){f.tensors[i].name, f.tensors[i].dtype, f.tensors[i].ndim, {0}, f.tensors[i].data};
        memcpy(ts[n].shape, f.tensors[i].shape, sizeof ts[n].shape);
        n++;
    }
    char *other = path_join(dir, "other.safetensors");
    cr_assert_eq(safetensors_write(other, ts, n, NULL, 0), 0);
    safetensors_close(&f);
    cr_assert_eq(rename(other, path), 0);
    expect_load_error(dir, "model.norm.weight");
    expect_load_error(dir, "missing");
    // Truncated weights file.
    cr_assert_eq(truncate(path, 100), 0);
    expect_load_error(dir, "model.safetensors");
    // No weights at all.
    unlink(path);
    expect_load_error(dir, "no model.safetensors");
    // No config.
    char *cfg = path_join(dir, "config.json");
    unlink(cfg);
    expect_load_error(dir, "config.json");
    free(path);
    free(other);
    free(cfg);
}

Test(model_io, wrong_dtype) {
    ModelConfig c = small_config(0);
    Model a;
    cr_assert_eq(model_build_random(&a, &c, 0.5f, 5), 0);
    char *dir = dir_with_model();
    char *path = path_join(dir, "model.safetensors");
    StWriteTensor ts[64];
    int32_t *ints = calloc(1000, sizeof(int32_t));
    for (int i = 0; i < a.n_params; i++) {
        ParamTensor *p = &a.params[i];
        int is_norm = strcmp(p->name, "model.norm.weight") == 0;
        ts[i] = (StWriteTensor){p->name, is_norm ? DT_I32 : DT_F32, p->ndim, {p->shape[0], p->shape[1]},
                                is_norm ? (void *)ints : (void *)p->data};
    }
    cr_assert_eq(safetensors_write(path, ts, a.n_params, NULL, 0), 0);
    expect_load_error(dir, "dtype I32");
    free(ints);
    free(path);
    model_free(&a);
}

Test(model_io, forward_rejects_bad_tokens) {
    ModelConfig c = small_config(0);
    Model m;
    Activations a;
    cr_assert_eq(model_build_random(&m, &c, 0.5f, 5), 0);
    cr_assert_eq(acts_alloc(&a, &c, 1, 4, ACTS_SCORE, 0), 0);
    int toks[4] = {1, 2, 10, 3};
    ModelInput in = {.B = 1, .T = 4, .tokens = toks};
    cr_assert_eq(model_forward(&m, &in, &a), ER_ERANGE);
    cr_assert(strstr(er_last_error(), "token id 10"));
    toks[2] = 2;
    in.T = 8; // more positions than the activations hold
    cr_assert_eq(model_forward(&m, &in, &a), ER_EINVAL);
    Activations big;
    cr_assert(acts_alloc(&big, &c, 1, 1 << 20, ACTS_TRAIN, 1 << 20) < 0, "memory limit must be enforced up front");
    cr_assert(strstr(er_last_error(), "MiB"));
    acts_free(&a);
    model_free(&m);
}

// A vector of the wrong length is named with both shapes as written: "[8]" was printed "[80]".
Test(model_io, shape_message_of_a_vector) {
    char *dir = dir_with_model();
    char *path = path_join(dir, "model.safetensors"), *other = path_join(dir, "other.safetensors");
    StFile f;
    cr_assert_eq(safetensors_open(&f, path), 0);
    StWriteTensor ts[64];
    float nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    int n = 0;
    for (int i = 0; i < f.n_tensors; i++, n++) {
        ts[n] = (StWriteTensor){f.tensors[i].name, f.tensors[i].dtype, f.tensors[i].ndim, {0}, f.tensors[i].data};
        memcpy(ts[n].shape, f.tensors[i].shape, sizeof ts[n].shape);
        if (strcmp(f.tensors[i].name, "model.layers.1.post_attention_layernorm.weight") == 0) {
            ts[n].shape[0] = 9;
            ts[n].data = nine;
        }
    }
    cr_assert_eq(safetensors_write(other, ts, n, NULL, 0), 0);
    safetensors_close(&f);
    cr_assert_eq(rename(other, path), 0);
    expect_load_error(dir, "\"model.layers.1.post_attention_layernorm.weight\" has shape [9], expected [8] ");
    free(path);
    free(other);
}

// The committed configs load; Qwen3-0.6B's has the published size (0.6B parameters, 0.44B without the tied
// embedding) and head_dim 128 apart from hidden / heads (64).
Test(model_io, committed_configs) {
    const char *names[] = {"configs/tiny.json", "configs/small.json", "configs/qwen05b-2l.json",
                           "configs/qwen3-tiny.json", "configs/qwen3-0.6b.json"};
    ModelConfig c;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        cr_assert_eq(model_config_load(&c, names[i]), ER_OK, "%s", er_last_error());
        cr_expect_eq(c.arch, strstr(names[i], "qwen3") ? ARCH_QWEN3 : ARCH_QWEN2, "%s", names[i]);
    }
    size_t n = model_config_num_params(&c), embed = (size_t)c.V * c.C;
    cr_expect_eq(c.HS, 128);
    cr_expect_eq(c.C / c.NH, 64);
    cr_expect(n > 590000000 && n < 610000000 && n - embed > 435000000 && n - embed < 445000000,
              "Qwen3-0.6B: %zu parameters, %zu without the embedding", n, n - embed);
}
