// fuzz_chat: the input is tokenizer_config.json FUZZ_SEP messages. The config goes to
// chat_style_from_config and its raw text to chat_style_detect; the messages (NUL-separated pieces, the
// first byte of each choosing its role) are rendered by chat_render (data/chat.h) in every style, and the
// bare ChatML and plain renderings are checked byte count for byte count.
#include "tests/fuzz/fuzz_common.h"

#include "core/alloc.h"
#include "core/error.h"
#include "data/chat.h"

#define MAX_MSGS 64

static const char *const roles[] = {"system", "user", "assistant", "tool"};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_root_dir("chat");
    fuzz_mkdir("model");
    return 0;
}

// Length chat.h's description gives for CHAT_CHATML and CHAT_PLAIN.
static size_t expected_len(ChatStyle style, const ChatMessage *m, int n, int flags) {
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += strlen(m[i].role) + strlen(m[i].content) +
                 (style == CHAT_PLAIN ? strlen(": \n") : strlen("<|im_start|>\n<|im_end|>\n"));
    if (flags & CHAT_ADD_GENERATION_PROMPT)
        total += style == CHAT_PLAIN ? strlen("assistant: ") : strlen("<|im_start|>assistant\n");
    return total;
}

static void render_all(const ChatMessage *msgs, int n, int flags, int all_known) {
    for (int s = 0; s < 4; s++) {
        char *out = NULL;
        size_t len = 0;
        int rc = chat_render((ChatStyle)s, msgs, n, flags, &out, &len);
        if (rc < 0) {
            FUZZ_CHECK(!all_known, "style %d refused known roles: %s", s, er_last_error());
            FUZZ_CHECK(out == NULL, "failed render left output");
            continue;
        }
        FUZZ_CHECK(all_known, "style %d accepted an unknown role", s);
        FUZZ_CHECK(out && strlen(out) == len, "rendered length %zu, strlen %zu", len, out ? strlen(out) : 0);
        if (s == CHAT_CHATML || s == CHAT_PLAIN)
            FUZZ_CHECK(len == expected_len((ChatStyle)s, msgs, n, flags), "style %d: %zu bytes, expected %zu", s, len,
                       expected_len((ChatStyle)s, msgs, n, flags));
        // Every user turn is rendered verbatim by the ChatML-family templates.
        if (s != CHAT_PLAIN)
            for (int i = 0; i < n; i++)
                if (strcmp(msgs[i].role, "user") == 0)
                    FUZZ_CHECK(strstr(out, msgs[i].content) != NULL, "style %d dropped user message %d", s, i);
        er_free(out);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *part[2];
    size_t len[2];
    int np = fuzz_split(data, size, part, len, 2);
    const uint8_t *cfg = part[0], *msg = np > 1 ? part[1] : part[0];
    size_t ncfg = len[0], nmsg = np > 1 ? len[1] : len[0];

    fuzz_write("model/tokenizer_config.json", cfg, ncfg);
    char path[FUZZ_PATH_MAX];
    ChatStyle style;
    // Odd sizes name the model dir, even ones the file.
    int rc = chat_style_from_config(fuzz_path(path, (size & 1) ? "model" : "model/tokenizer_config.json"), &style);
    if (rc == ER_OK)
        FUZZ_CHECK((unsigned)style < 4, "style %d", (int)style);
    else if (fuzz_verbose())
        fprintf(stderr, "config refused: %s\n", er_last_error());
    char *raw = fuzz_strndup(cfg, ncfg);
    FUZZ_CHECK((unsigned)chat_style_detect(raw) < 4, "detect");
    free(raw);

    // Messages: byte 0 holds the flags, then NUL-separated pieces; a piece's first byte picks the role
    // (mod 5; 4 = the rest of the piece up to '\n' is the role itself, usually an unknown one).
    if (nmsg == 0)
        return 0;
    int flags = msg[0] & (CHAT_ADD_GENERATION_PROMPT | CHAT_NO_THINKING);
    char *text = fuzz_strndup(msg + 1, nmsg - 1);
    ChatMessage msgs[MAX_MSGS];
    int n = 0, all_known = 1;
    for (char *p = text, *end = text + nmsg - 1; p <= end && n < MAX_MSGS;) {
        size_t plen = strlen(p);
        int r = plen ? (unsigned char)p[0] % 5 : 1;
        char *content = plen ? p + 1 : p;
        if (r < 4) {
            msgs[n].role = roles[r];
        } else {
            char *nl = strchr(content, '\n');
            msgs[n].role = content;
            if (nl) {
                *nl = 0;
                content = nl + 1;
            } else {
                content = content + strlen(content);
            }
            const char *role = msgs[n].role;
            all_known &= strcmp(role, "system") == 0 || strcmp(role, "user") == 0 || strcmp(role, "assistant") == 0 ||
                         strcmp(role, "tool") == 0;
        }
        msgs[n++].content = content;
        p += plen + 1;
    }
    render_all(msgs, n, flags, all_known);
    free(text);
    return 0;
}
