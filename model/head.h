// Small heads on the transformer's final hidden state, shared by training and the runtime: a linear
// head (the verifier) and an MLP in -> H -> 1 with ReLU and dropout (the switcher). A head maps a
// feature vector (in) to one logit; p = sigmoid(logit). Plain loops (llm.c style): the forward is
// what erinfer runs, the backward is what ertrain heads trains with.
//
// On disk a trained head is two files written atomically, HF style:
//   NAME.safetensors  F32 tensors "w1" (H, in), "b1" (H), and for an MLP "w2" (1, H), "b2" (1)
//                     (a linear head: "w1" (1, in), "b1" (1))
//   NAME.json         {"format": "er_head", "version": 1, "role": "switcher" | "verifier",
//                      "kind": "linear" | "mlp", "in": C, "hidden": H, "dropout": p,
//                      "threshold": t, "features": {...}, "model_fingerprint": "16 hex digits",
//                      "metrics": {...}}
// where NAME is the path given without its ".safetensors" or ".json" suffix: NAME and either file name
// the head. "features" says how the runtime
// must compute the input: switcher {"kind": "prompt_ema", "chunk": 128, "alpha": 0.5}, verifier
// {"kind": "verify_last", "prompt": "\nIs this solution correct?", "adapter_on": false}, both with
// "kv": "f32" | "int8", the KV cache the features were computed on (absent in older files).
#ifndef MODEL_HEAD_H
#define MODEL_HEAD_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/rng.h"
#include "model/model.h"

typedef enum { HEAD_LINEAR, HEAD_MLP } HeadKind;

typedef struct {
    HeadKind kind;
    int in, hidden;   // hidden units H (MLP); 1 for a linear head
    float dropout;    // on the MLP's hidden units, training only
    float *w1;        // (H, in)
    float *b1;        // (H)
    float *w2;        // (H) MLP only, else NULL
    float *b2;        // (1) MLP only, else NULL
    float *params;    // every parameter, contiguous: w1 b1 [w2 b2]
    float *grads;     // same layout (NULL when not training)
    size_t n_params;
} Head;

// PyTorch nn.Linear init: weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)), from `seed`.
int head_init(Head *h, HeadKind kind, int in, int hidden, float dropout, int with_grads, uint64_t seed);
void head_free(Head *h);
void head_zero_grad(Head *h);

// What a training forward keeps for the backward (MLP): up to `cap` rows.
typedef struct {
    int cap, H;
    float *hid;   // (cap, H) hidden output after ReLU and dropout
    float *dgate; // (cap, H) d hid / d pre-activation: 0, 1, or 1/(1-p) where dropout kept the unit
} HeadActs;

int head_acts_alloc(HeadActs *a, const Head *h, int cap);
void head_acts_free(HeadActs *a);

// logit (N) for features x (N, in). acts NULL: inference (no dropout). With acts, the hidden units
// are kept for head_backward and dropped with probability h->dropout when rng is not NULL.
int head_forward(const Head *h, const float *x, int N, float *logit, HeadActs *acts, ErRng *rng);
// Accumulates h->grads from dlogit (N) with the x and acts of the forward.
int head_backward(Head *h, const float *x, const float *dlogit, int N, const HeadActs *acts);
// Mean binary cross-entropy of sigmoid(logit) against labels y (N) in {0, 1}, computed stably from
// the logits; dlogit (N, may be NULL) gets d loss / d logit = (sigmoid(logit) - y) / N.
double head_bce(const float *logit, const float *y, int N, float *dlogit);
float head_sigmoid(float x);
// p (N) = sigmoid(head logit) for features x (N, in): the runtime's call.
int head_predict(const Head *h, const float *x, int N, float *p);

// ---- trained heads on disk ----

typedef enum { HEAD_SWITCHER, HEAD_VERIFIER } HeadRole;

#define HEAD_DEFAULT_CHUNK 128
#define HEAD_DEFAULT_ALPHA 0.5f
#define HEAD_DEFAULT_VERIFY_PROMPT "\nIs this solution correct?"

// The KV cache a head's features were computed on: an int8 cache shifts the hidden states a little,
// so a threshold calibrated on one holds best on the same. 0: not recorded.
typedef enum { HEAD_KV_UNKNOWN = 0, HEAD_KV_F32, HEAD_KV_INT8 } HeadKv;

typedef struct {
    Head net;
    HeadRole role;
    HeadKv kv;            // the KV cache of the features it was fitted on
    float threshold;      // p >= threshold is positive (switcher: needs reasoning; verifier: correct)
    int chunk;            // switcher: positions per chunk of the prompt EMA
    float alpha;          // switcher: EMA weight of a new chunk's mean
    char *verify_prompt;  // verifier: text appended to each response (owned)
    int adapter_on;       // verifier: the adapter is on for the verification tokens
    char fingerprint[17]; // of the model the head was trained on (model_fingerprint)
    cJSON *metrics;       // held-out metrics stored with the head (owned; may be NULL)
} TrainedHead;

void trained_head_free(TrainedHead *t);
// The length of NAME in a path naming a head: the path without a ".safetensors" or ".json" suffix.
size_t trained_head_name_len(const char *path);
// Writes NAME.safetensors and NAME.json (see the top of this file) atomically.
int trained_head_save(const TrainedHead *t, const char *path);
// Loads a head. With m != NULL, a head trained on another model (fingerprint or hidden size) is
// refused; `role` must match the file's.
int trained_head_load(TrainedHead *t, const char *path, HeadRole role, const Model *m);

// 16 hex digits identifying a model's weights: FNV-1a over its dimensions and 16 evenly spaced
// rows of the embedding matrix as fp32. A quantized copy of a model is a different model.
void model_fingerprint(const Model *m, char out[17]);

#endif
