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
// (scripts/make_chat_golden.py). Tools (the OpenAI "tools" list and assistant tool calls) go through
// chat_tools_system and chat_tool_calls_text below, which turn them into the system and assistant
// contents the Qwen templates render. Not supported: the `reasoning_content` message field, and roles
// other than system, user, assistant and tool (refused with an error rather than silently dropped as
// the Jinja templates do).
#ifndef DATA_CHAT_H
#define DATA_CHAT_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "core/gguf.h"
#include "core/json.h"

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

// A hybrid-thinking model (Qwen3: CHAT_QWEN3) thinks or not after the same prompt: thinking off is the
// template's empty think block after the assistant header (enable_thinking=false), thinking on opens
// the block. The routed pipeline's direct and reasoning routes force these at the response's start.
#define CHAT_THINK_OFF "<think>\n\n</think>\n\n"
#define CHAT_THINK_ON "<think>\n"
// 1 when the style's model thinks natively, with thinking switchable (CHAT_QWEN3).
int chat_style_hybrid(ChatStyle style);

// The style a Jinja chat_template string implements: the Qwen2.5 default system text -> CHAT_QWEN25;
// "</think>" handling -> CHAT_QWEN3; anything else -> CHAT_CHATML. NULL (no template) -> CHAT_CHATML.
ChatStyle chat_style_detect(const char *jinja_template);

// Reads "chat_template" from a tokenizer_config.json (or a model dir holding one; a string, or a
// list of {name, template} from which "default" is taken) and detects its style. A config without a
// template gives CHAT_CHATML. A GGUF model file (".gguf") gives the style of its tokenizer.chat_template.
int chat_style_from_config(const char *config_path_or_dir, ChatStyle *out);
// The same from a GGUF file already open (its tokenizer.chat_template), and from tokenizer_config.json's text in
// memory (NULL or a NULL text: no config, CHAT_CHATML).
int chat_style_from_gguf(const GgufFile *f, ChatStyle *out);
int chat_style_from_text(const JsonText *config, ChatStyle *out);

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

// ---- tools, as Qwen2.5's tool-calling template renders them ----
// v as Python's json.dumps(v, ensure_ascii=False) writes it (the templates' `tojson`): ", " and ": "
// separators, keys in their order, non-ASCII text as is. A new string in *out (er_free).
int chat_json_dumps(const cJSON *v, char **out);

// The system turn's content announcing `tools` (a JSON array of OpenAI tool objects, each written
// with chat_json_dumps): the system text (NULL: none; Qwen2.5 then uses its default system message),
// "\n\n# Tools ..." with one tool per line inside <tools></tools>, and the <tool_call> instruction,
// as the template's `if tools` branch writes it. CHAT_PLAIN has no tool format: ER_EUNSUPPORTED.
int chat_tools_system(ChatStyle style, const char *system, const cJSON *tools, char **out);
// The system text the template writes where a conversation has none: Qwen2.5's default, NULL for the others (a
// system message built for a conversation without one starts with it, so that the model still gets it).
const char *chat_default_system(ChatStyle style);

// An assistant turn's content with its tool calls, as the template renders message.tool_calls:
// content (when not empty) and a newline, then per call "<tool_call>\n{\"name\": \"NAME\",
// \"arguments\": ARGS}\n</tool_call>", joined by newlines. arguments[i] is JSON text (OpenAI sends
// a string): it is rewritten with chat_json_dumps; text that is not JSON is kept as is.
int chat_tool_calls_text(const char *content, const char *const *names, const char *const *arguments, int n,
                         char **out);

typedef struct {
    char *name;
    char *arguments; // compact JSON of the call's arguments
} ChatToolCall;

// The tool calls in a model's response: `text` is content (kept, content_len bytes) followed by one
// or more "<tool_call>{"name": ..., "arguments": {...}}</tool_call>" blocks with only whitespace
// between and after them. No "<tool_call>" in text: *n = 0 and content_len = len. Anything else
// (JSON that does not parse, no name, arguments not an object, an unclosed block, text after a
// block) is ER_EFORMAT with the problem recorded, and nothing allocated. Free with chat_tool_calls_free.
int chat_parse_tool_calls(const char *text, size_t len, ChatToolCall **calls, int *n, size_t *content_len);
void chat_tool_calls_free(ChatToolCall *calls, int n);

#endif
