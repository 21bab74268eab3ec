// What the runners (infer/eval.h) and the erinfer commands share: opening a model dir with its
// adapter and heads into one session, and the JSON of a pipeline result.
#ifndef INFER_RUNNER_H
#define INFER_RUNNER_H

#include <cjson/cJSON.h>

#include "data/tokenizer.h"
#include "infer/erinfer.h"

// A model dir, its optional LoRA adapter (PEFT dir) and heads (ertrain heads), and the session's KV.
typedef struct {
    const char *model, *adapter, *switcher, *verifier;
    int kv_int8;
    int context; // positions per sample, prompt included; 0 = 4096 + max_new, at most max_position_embeddings
    const char *device; // where the passes run (er_model_set_device); NULL = the CPU
} SessionSpec;

// The positions per sample: context when given, else 4096 + max_new, at most the model's max_pos.
int runner_context(int context, int max_new, int max_pos);

// Loads the model, its adapter and heads (spec's model part); on failure *m is NULL.
int runner_load_model(const SessionSpec *spec, ErModel **m);
// The tokenizer the model loaded (owned by it; safe to share between threads), for CLI code that
// counts or renders tokens beside the model (defined in infer/api.c, which owns ErModel).
const Tokenizer *runner_model_tokenizer(const ErModel *m);
// runner_load_model, then a session for max_samples samples of max_new new tokens. On failure *m and
// *s are NULL.
int runner_open_session(const SessionSpec *spec, int max_samples, int max_new, ErModel **m, ErSession **s);

// A note for the CLIs when a head was fitted on another KV cache type than spec's (kv_int8): its
// features, and so its threshold, shift a little. Writes one sentence naming the head and both types
// into note and returns 1; 0 when every head matches or does not record its type (a head that cannot
// be read is left to the model load to report).
int runner_heads_kv_note(const SessionSpec *spec, char *note, size_t cap);

const char *runner_finish_name(int finish); // ER_FINISH_* -> "eos" | "stop" | "length"
// The pipeline's part of a result (route, switcher score, per-sample answers and verifier scores,
// votes, timings) as a new JSON object; NULL when the call ran without heads (r NULL): a route and
// its n samples (a session's last call or a batched request), or a session's last call.
cJSON *runner_route_json(const ErRoute *r, const ErSample *const *samples, int n);
cJSON *runner_session_route_json(const ErSession *s);

#endif
