// Chat templates rendered natively (no Jinja at run time). The Qwen family uses ChatML:
//     <|im_start|>{role}\n{content}<|im_end|>\n   per message,
//     <|im_start|>assistant\n                    as the generation prompt.
// Styles:
//   CHAT_CHATML  bare ChatML: messages as given, no default system message (the tiny models' template).
//   CHAT_QWEN25  Qwen2.5-Instruct: when the first message is not a system message, the default
//                "You are Qwen, created by Alibaba Cloud. You are a helpful assistant." is inserted.
//   CHAT_QWEN3   Qwen3: no default system message; assistant turns are rendered with the template's
//                <think> handling: reasoning (text up to </think>) is dropped from assistant turns
//                before the last user query, and assistant turns after it get a
//                "<think>\n{reasoning}\n</think>\n\n" block (an empty one on the final turn). With
//                CHAT_NO_THINKING the generation prompt ends in an empty think block, as the Jinja
//                template does for enable_thinking=false.
//   CHAT_PLAIN   "role: content\n" per message, "assistant: " as the generation prompt; no special
//                tokens, for models without a chat template.
// Matching the Jinja templates byte for byte is tested against renderings made by jinja2
// (scripts/make_chat_golden.py). Not supported: tools / tool_calls, the `reasoning_content` message
// field, and roles other than system, user, assistant and tool (refused with an error rather than
// silently dropped as the Jinja templates do).
#ifndef DATA_CHAT_H
#define DATA_CHAT_H

#include <stddef.h>

typedef enum { CHAT_CHATML, CHAT_QWEN25, CHAT_QWEN3, CHAT_PLAIN } ChatStyle;

typedef struct {
    const char *role;    // "system" | "user" | "assistant" | "tool"
    const char *content;
} ChatMessage;

enum {
    CHAT_ADD_GENERATION_PROMPT = 1, // end with the assistant header, ready for the model to continue
    CHAT_NO_THINKING = 2,           // Qwen3 enable_thinking=false: empty think block after the header
};

#define CHAT_QWEN25_DEFAULT_SYSTEM "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

// The style a Jinja chat_template string implements: the Qwen2.5 default system text -> CHAT_QWEN25;
// "</think>" handling -> CHAT_QWEN3; anything else -> CHAT_CHATML. NULL (no template) -> CHAT_CHATML.
ChatStyle chat_style_detect(const char *jinja_template);

// Reads "chat_template" from a tokenizer_config.json (or a model dir holding one; a string, or a
// list of {name, template} from which "default" is taken) and detects its style. A config without a
// template gives CHAT_CHATML. A GGUF model file (".gguf") gives the style of its tokenizer.chat_template.
int chat_style_from_config(const char *config_path_or_dir, ChatStyle *out);

// "chatml" | "qwen2.5" | "qwen3" | "plain" -> style (callers overriding the detected one).
int chat_style_parse(const char *name, ChatStyle *out);
const char *chat_style_name(ChatStyle style);

// out (room for cap) = `system` (NULL: none) in front of the n messages of in: the system message
// replaces the conversation's own (a leading "system" message of in is dropped when system is given).
// Messages past cap are left off. Returns the count written; the strings stay in's and system's.
int chat_set_system(ChatMessage *out, int cap, const ChatMessage *in, int n, const char *system);

// Renders n messages into a new NUL-terminated string (*out, free with er_free; *out_len if not
// NULL). flags: CHAT_ADD_GENERATION_PROMPT | CHAT_NO_THINKING.
int chat_render(ChatStyle style, const ChatMessage *msgs, int n, int flags, char **out, size_t *out_len);

#endif
