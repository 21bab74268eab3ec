// fuzz_quant_config: the input is a config.json "quantization_config" object, parsed by quant_config_from_json
// (quant/quant.h) with a to_json / from_json round trip, then spliced into a tiny config.json and loaded by
// model_load (model/model.h) against quantized dirs made at start-up, so the packed tensors and their scales,
// zeros and codebooks are checked against it; a dir that loads runs one forward, whose logits must be finite.
#include "tests/fuzz/fuzz_common.h"

#include <math.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "core/threads.h"
#include "model/model.h"
#include "quant/quant.h"
#include "quant/quantizer.h"

// The dims are chosen so that q4g32 / q4g64 groups divide every matrix, q4g128 only down_proj's 128 columns.
#define TINY_CONFIG_HEAD                                                                                   \
    "{\"model_type\": \"qwen2\", \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 1, " \
    "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 32, \"vocab_size\": 48, "          \
    "\"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-6, \"torch_dtype\": \"float32\", "

// One quantized dir per entry, as ertrain quantize would write it.
static const struct {
    int tied;
    const char *qc;
} dirs[] = {
    {0, "{\"quant_method\": \"ertrain\", \"weights\": \"q8\", \"embeddings\": \"int8\"}"},
    {0, "{\"quant_method\": \"ertrain\", \"weights\": \"q4\"}"},
    {0, "{\"quant_method\": \"ertrain\", \"weights\": \"q4g32\", \"group_size\": 32}"},
    {0, "{\"quant_method\": \"ertrain\", \"weights\": \"q2lut\", \"lm_head\": \"fp\"}"},
    {0, "{\"quant_method\": \"ertrain\", \"weights\": \"q4lut\", \"lm_head\": \"q8\"}"},
    {0, "{\"quant_method\": \"ertrain\", \"weights\": \"q2lut\", \"lm_head\": \"q4\", \"sparse_per_row\": 2}"},
    {1, "{\"quant_method\": \"ertrain\", \"weights\": \"q4\", \"embeddings\": \"int8\", \"lm_head\": \"q8\"}"},
};
#define N_DIRS ((int)(sizeof dirs / sizeof dirs[0]))
static QuantConfig dir_q[N_DIRS];

__attribute__((noreturn)) static void die(const char *what) {
    fprintf(stderr, "fuzz_quant_config: %s: %s\n", what, er_last_error());
    abort();
}

static cJSON *parse_text(const char *s, size_t n) { return cJSON_ParseWithLength(s, n); }

static ModelConfig tiny_config(int tied) {
    char text[1024];
    snprintf(text, sizeof text, TINY_CONFIG_HEAD "\"tie_word_embeddings\": %s}", tied ? "true" : "false");
    cJSON *j = parse_text(text, strlen(text));
    ModelConfig c;
    if (!j || model_config_from_json(&c, j, "tiny config") < 0)
        die("tiny config");
    cJSON_Delete(j);
    return c;
}

// Builds dir k: random weights, every matrix quantized to what dirs[k].qc says, saved by model_save.
static void make_dir(int k) {
    ModelConfig c = tiny_config(dirs[k].tied);
    Model m;
    if (model_build_random(&m, &c, 0.2f, 100 + (uint64_t)k) < 0)
        die("model_build_random");
    cJSON *qj = parse_text(dirs[k].qc, strlen(dirs[k].qc));
    if (!qj || quant_config_from_json(&m.quant, qj, "dir spec") < 0)
        die("dir spec");
    cJSON_Delete(qj);
    dir_q[k] = m.quant;
    for (int i = 0; i < m.n_params; i++) {
        ParamTensor *p = &m.params[i];
        int group, sparse;
        WeightFormat f = model_quant_format(&m, p, &group, &sparse);
        if (!weight_is_quantized(f))
            continue;
        QuantOptions o;
        quant_options_default(&o, f, group);
        o.sparse = sparse;
        Weight w;
        if (quantize_matrix(&w, p->data, p->w->rows, p->w->cols, NULL, &o) < 0 || model_set_weight(&m, p, &w) < 0)
            die("quantize");
    }
    char rel[32], path[FUZZ_PATH_MAX];
    snprintf(rel, sizeof rel, "q%d", k);
    if (model_save(&m, fuzz_path(path, rel), 0) < 0)
        die("model_save");
    model_free(&m);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    threads_set(1);
    fuzz_root_dir("quant_config");
    for (int k = 0; k < N_DIRS; k++)
        make_dir(k);
    return 0;
}

// The dir whose layout the parsed config describes, so that most inputs get past the packing checks.
static int pick_dir(const QuantConfig *q) {
    for (int k = 0; k < N_DIRS; k++)
        if (dir_q[k].linear == q->linear && dir_q[k].group == q->group && dir_q[k].embed == q->embed &&
            dir_q[k].lm_head == q->lm_head && dir_q[k].sparse == q->sparse)
            return k;
    for (int k = 0; k < N_DIRS; k++)
        if (dir_q[k].linear == q->linear)
            return k;
    return 0;
}

static int parse_and_round_trip(const uint8_t *data, size_t size, QuantConfig *q) {
    cJSON *j = parse_text((const char *)data, size);
    if (!j)
        return -1;
    int rc = quant_config_from_json(q, j, "fuzz");
    cJSON_Delete(j);
    if (rc < 0) {
        if (fuzz_verbose())
            fprintf(stderr, "quant config refused: %s\n", er_last_error());
        return rc;
    }
    FUZZ_CHECK(q->enabled, "accepted config is not enabled");
    cJSON *out = quant_config_to_json(q);
    if (!out)
        return rc;
    QuantConfig r;
    rc = quant_config_from_json(&r, out, "round trip");
    cJSON_Delete(out);
    FUZZ_CHECK(rc == ER_OK, "written quantization_config does not re-read: %s", er_last_error());
    FUZZ_CHECK(r.linear == q->linear && r.group == q->group && r.embed == q->embed &&
                   r.lm_head == q->lm_head && r.sparse == q->sparse && strcmp(r.method, q->method) == 0,
               "quantization_config changed in a round trip");
    return ER_OK;
}

static void run_forward(Model *m) {
    Activations a;
    if (acts_alloc(&a, &m->cfg, 1, 4, ACTS_SCORE, 0) < 0)
        return;
    static const int tokens[4] = {1, 17, 40, 3};
    ModelInput in = {.B = 1, .T = 4, .tokens = tokens};
    int rc = model_forward(m, &in, &a);
    FUZZ_CHECK(rc == ER_OK, "forward on a loaded model: %s", er_last_error());
    for (size_t i = 0; i < (size_t)4 * m->cfg.V; i++)
        FUZZ_CHECK(isfinite(a.logits[i]), "logit %zu is %g", i, a.logits[i]);
    acts_free(&a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    QuantConfig q;
    int k = parse_and_round_trip(data, size, &q) == ER_OK ? pick_dir(&q) : 0;
    if (size % 3 == 0) // a share of the inputs meets a dir of another layout: the mismatch checks
        k = (int)((size / 3) % N_DIRS);

    // config.json = the tiny config with the input as its quantization_config.
    static const char tail[] = ", \"quantization_config\": ";
    char tied[48];
    snprintf(tied, sizeof tied, "\"tie_word_embeddings\": %s", dirs[k].tied ? "true" : "false");
    size_t head = strlen(TINY_CONFIG_HEAD), nt = strlen(tied), ntail = strlen(tail);
    char *text = malloc(head + nt + ntail + size + 2);
    if (!text)
        return 0;
    memcpy(text, TINY_CONFIG_HEAD, head);
    memcpy(text + head, tied, nt);
    memcpy(text + head + nt, tail, ntail);
    if (size)
        memcpy(text + head + nt + ntail, data, size);
    text[head + nt + ntail + size] = '}';
    char rel[48], path[FUZZ_PATH_MAX];
    snprintf(rel, sizeof rel, "q%d/config.json", k);
    fuzz_write(rel, text, head + nt + ntail + size + 1);
    free(text);

    snprintf(rel, sizeof rel, "q%d", k);
    Model m;
    int rc = model_load(&m, fuzz_path(path, rel), 0);
    if (rc < 0)
        return fuzz_refused("model refused");
    run_forward(&m);
    model_free(&m);
    return 0;
}
