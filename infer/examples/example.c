// The smallest complete use of the erinfer library: only its header, erinfer.h (infer/erinfer.h here, on the
// include path as make install puts it: `cc example.c $(pkg-config --cflags --libs erinfer)` builds it too).
//
//     build/example MODEL_DIR [PROMPT]
//
// Loads the model dir, opens a session, generates a reply with tokens streamed to stdout as they
// come, prints the stats and frees everything. Exits 1 with one line on stderr when anything fails.
#include <stdio.h>
#include <string.h>

#include "erinfer.h"

typedef struct {
    long tokens; // callbacks seen: one per generated token
    size_t bytes;
} Stream;

static int on_token(void *user, int sample, const char *text, size_t len) {
    Stream *s = user;
    (void)sample;
    s->tokens++;
    s->bytes += len;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0; // non-zero would stop this sample
}

static int fail(const char *what) {
    fprintf(stderr, "example: %s: %s\n", what, er_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s MODEL_DIR [PROMPT]\n", argv[0]);
        return 1;
    }
    const char *prompt = argc == 3 ? argv[2] : "Start with 7. Add 5. Multiply by 3. What is the result?";
    if (strcmp(er_version(), ER_VERSION_STRING) != 0) // a shared library may be newer than this header
        fprintf(stderr, "example: built against erinfer %s, running %s\n", ER_VERSION_STRING, er_version());

    ErModel *model;
    if (er_model_load(&model, argv[1]) < 0)
        return fail("loading the model");
    ErSessionParams sp;
    er_session_params_init(&sp); // 1 sample, f32 KV cache, all cores
    sp.max_tokens = 1024;        // prompt and reply
    ErSession *session;
    if (er_session_open(&session, model, &sp) < 0) {
        er_model_free(model);
        return fail("opening a session");
    }

    ErGenParams params;
    er_gen_params_init(&params);
    params.max_new_tokens = 48;
    params.temperature = 0.7f;
    params.top_p = 0.95f;
    params.seed = 42;
    static const char *const stops[] = {"\nUser:", "\nQuestion:"}; // read during the call only
    params.stop = stops;
    params.n_stop = 2;
    ErMessage msgs[] = {{"user", prompt}};
    Stream stream = {0, 0};
    printf("prompt: %s\nreply: ", prompt);
    int rc = er_generate(session, msgs, 1, &params, on_token, &stream);
    printf("\n");
    if (rc < 0) {
        er_session_free(session);
        er_model_free(model);
        return fail("generating");
    }

    const ErSample *sample = er_result_sample(session, 0);
    const ErStats *st = er_result_stats(session);
    static const char *finish[] = {"eos", "stop", "length"};
    printf("streamed %ld tokens, %zu bytes\n", stream.tokens, stream.bytes);
    printf("sample: %d tokens, finish %s\n", sample->n_tokens, finish[sample->finish]);
    printf("stats: prompt %d tokens, generated %ld tokens, TTFT %.3f s, %.1f tokens/s, KV %zu bytes\n",
           st->prompt_tokens, st->generated_tokens, st->ttft_s, st->decode_tokens_per_s, st->kv_bytes);

    er_session_free(session);
    er_model_free(model);
    return 0;
}
