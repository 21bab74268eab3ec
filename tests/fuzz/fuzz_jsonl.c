// fuzz_jsonl: the input is a JSONL dataset file, read whole by dataset_load and streamed by dataset_open /
// dataset_next (data/dataset.h; response_key "concise" when the input names that field). Every example that
// parses is rendered with chat_render, and its gold answer and response go through the grader (data/grade.h).
#include "tests/fuzz/fuzz_common.h"

#include "core/alloc.h"
#include "core/error.h"
#include "data/chat.h"
#include "data/dataset.h"
#include "data/grade.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_root_dir("jsonl");
    return 0;
}

static void check_example(const Example *ex, long prev_line) {
    FUZZ_CHECK(ex->line > prev_line, "line %ld after %ld", ex->line, prev_line);
    if (ex->text) {
        FUZZ_CHECK(!ex->messages && !ex->prompt && !ex->response && ex->text[0], "text record with other fields");
        return;
    }
    FUZZ_CHECK(ex->prompt && ex->n_messages > 0, "record without a prompt");
    char *out = NULL;
    int rc = chat_render(CHAT_QWEN3, ex->messages, ex->n_messages, CHAT_ADD_GENERATION_PROMPT, &out, NULL);
    FUZZ_CHECK(rc == ER_OK || rc == ER_ENOMEM, "a parsed example does not render: %s", er_last_error());
    er_free(out);
    FUZZ_CHECK(ex->budget == -1 || ex->budget > 0, "budget %d", ex->budget);
    FUZZ_CHECK(ex->needs_reasoning >= -1 && ex->needs_reasoning <= 1, "needs_reasoning %d", ex->needs_reasoning);
    if (ex->answer) {
        char *norm = NULL;
        if (grade_normalize(ex->answer, &norm) == ER_OK) {
            // The loader refuses gold answers that normalize to nothing ("", "$ $", "\boxed{}"), and any
            // other answer must equal itself.
            FUZZ_CHECK(norm[0] != 0, "gold answer \"%s\" accepted with an empty normal form", ex->answer);
            int eq = grade_equal(ex->answer, ex->answer);
            FUZZ_CHECK(eq == 1 || eq == ER_ENOMEM, "answer \"%s\" is not equal to itself", ex->answer);
            double v;
            (void)grade_parse_number(norm, &v);
            er_free(norm);
        }
    }
    if (ex->response) {
        char *got = NULL;
        if (grade_extract(ex->response, &got) == ER_OK)
            er_free(got);
        // As a generated response: without a forced answer suffix, and with one ending mid-text.
        long at[2] = {-1, (long)(strlen(ex->response) / 2)};
        for (int k = 0; k < 2; k++) {
            char *a = NULL;
            if (grade_answer(ex->response, at[k], 0, &a) == ER_OK && a && ex->answer) {
                int c = grade_answer_correct(a, ex->answer);
                FUZZ_CHECK(c == 0 || c == 1 || c == ER_ENOMEM, "grade_answer_correct gave %d", c);
            }
            er_free(a);
            if (ex->answer) {
                int g = grade_response(ex->response, at[k], 0, ex->answer, NULL);
                FUZZ_CHECK(g == 0 || g == 1 || g == ER_ENOMEM, "grade_response gave %d", g);
            }
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[FUZZ_PATH_MAX];
    fuzz_write("data.jsonl", data, size);
    fuzz_path(path, "data.jsonl");
    // Records that name a "concise" field are read with it as the response (as for the chains task).
    DatasetOptions opt = {.response_key = memmem(data, size, "\"concise\"", 9) ? "concise" : NULL};

    Dataset d;
    int rc = dataset_load(path, &opt, 0, &d);
    if (rc == ER_OK) {
        long prev = 0;
        for (int i = 0; i < d.n; i++) {
            check_example(&d.ex[i], prev);
            prev = d.ex[i].line;
        }
        dataset_free(&d);
    } else if (fuzz_verbose()) {
        fprintf(stderr, "refused: %s\n", er_last_error());
    }

    // Streaming sees the same records up to the first bad one.
    DatasetReader r;
    if (dataset_open(&r, path, &opt) < 0)
        return 0;
    Example ex;
    long prev = 0;
    int got;
    while ((got = dataset_next(&r, &ex)) == 1) {
        check_example(&ex, prev);
        prev = ex.line;
        example_free(&ex);
    }
    FUZZ_CHECK((got == 0) == (rc == ER_OK), "streaming ended with %d, whole-file load with %d", got, rc);
    dataset_close(&r);
    return 0;
}
