#!/usr/bin/env python3
"""Golden chat-template renderings for tests/data/test_chat.c.

Renders a set of conversations with jinja2 (Debian python3-jinja2, configured like Hugging Face
transformers' apply_chat_template: sandboxed, trim_blocks, lstrip_blocks, loopcontrols) through
  qwen3   the Qwen3 template from ../shared/fixtures/qwen-tokenizer/tokenizer_config.json
  qwen25  the Qwen2.5-Instruct template (below; default system message "You are Qwen, ...")
  chatml  the tiny models' template from data/tiny_tokenizer/tokenizer_config.json
  plain   "role: content" lines (below)
and writes tests/data/golden/chat_cases.json (templates, expected C style per template, the cases)
plus tests/data/golden/chat_<template>_<case>.txt (the exact bytes). The C renderer (data/chat.c)
must reproduce each file byte for byte.

    /usr/bin/python3 scripts/make_chat_golden.py      (from the repository root)
"""
import argparse
import json
import os

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Qwen2.5-Instruct's chat_template (tokenizer_config.json of Qwen/Qwen2.5-*-Instruct).
QWEN25_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

PLAIN_TEMPLATE = ("{%- for message in messages %}{{- message.role + ': ' + message.content + '\\n' }}{%- endfor %}"
                  "{%- if add_generation_prompt %}{{- 'assistant: ' }}{%- endif %}")

SYS = {"role": "system", "content": "You are a careful math tutor."}
CASES = [
    ("user_gen", [{"role": "user", "content": "What is 7 + 5?"}], True, None),
    ("system_user_gen", [SYS, {"role": "user", "content": "Compute 12 * 3."}], True, None),
    ("system_user_assistant", [SYS, {"role": "user", "content": "Compute 12 * 3."},
                               {"role": "assistant", "content": "12 * 3 = 36\nAnswer: 36"}], False, None),
    ("user_assistant", [{"role": "user", "content": "Start with 4. Add 9. What is the result?"},
                        {"role": "assistant", "content": "4 + 9 = 13\nAnswer: 13"}], False, None),
    ("multi_turn_gen", [SYS, {"role": "user", "content": "What is 2 + 2?"},
                        {"role": "assistant", "content": "Answer: 4"},
                        {"role": "user", "content": "And doubled?"}], True, None),
    ("multi_turn_nosys", [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "7"},
                          {"role": "user", "content": "Another one?"}, {"role": "assistant", "content": "11"}],
     False, None),
    ("unicode", [{"role": "user", "content": "Combien font 7 × 8 ? Réponds en français. 日本語もOK 😀"},
                 {"role": "assistant", "content": "7 × 8 = 56 ✓"}], False, None),
    ("think_history", [{"role": "user", "content": "What is 2+2?"},
                       {"role": "assistant", "content": "<think>\nI add 2 and 2.\n</think>\n\nThe answer is 4."},
                       {"role": "user", "content": "And 3+3?"}], True, None),
    ("think_last", [{"role": "user", "content": "What is 2+2?"},
                    {"role": "assistant", "content": "<think>\nQuick: 2 + 2 = 4.\n</think>\n\n4"}], False, None),
    ("no_thinking", [{"role": "user", "content": "Hi"}], True, False),
    ("system_middle", [{"role": "user", "content": "a"}, {"role": "system", "content": "Be brief."},
                       {"role": "user", "content": "b"}], True, None),
    ("newlines", [{"role": "user", "content": ""},
                  {"role": "assistant", "content": "\n\nLeading newlines\nand trailing\n"}], False, None),
    ("tool", [{"role": "user", "content": "What's the weather?"}, {"role": "assistant", "content": "Let me check."},
              {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "tool", "content": "{\"sky\": \"clear\"}"},
              {"role": "assistant", "content": "It is 21 degrees and clear."}], False, None),
]


def render(template, messages, add_generation_prompt, enable_thinking, tools=None):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.globals["raise_exception"] = raise_exception
    kwargs = {"messages": messages, "add_generation_prompt": add_generation_prompt}
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    if tools is not None:
        kwargs["tools"] = tools
    return env.from_string(template).render(**kwargs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixture", default="../shared/fixtures/qwen-tokenizer/tokenizer_config.json")
    ap.add_argument("--tiny", default="data/tiny_tokenizer/tokenizer_config.json")
    ap.add_argument("--out", default="tests/data/golden")
    args = ap.parse_args()
    with open(args.fixture, encoding="utf-8") as f:
        qwen3 = json.load(f)["chat_template"]
    with open(args.tiny, encoding="utf-8") as f:
        chatml = json.load(f)["chat_template"]
    templates = {"qwen3": qwen3, "qwen25": QWEN25_TEMPLATE, "chatml": chatml, "plain": PLAIN_TEMPLATE}
    # The style data/chat.c detects from each template ("plain" is only selectable by name).
    styles = {"qwen3": "qwen3", "qwen25": "qwen2.5", "chatml": "chatml", "plain": None}
    os.makedirs(args.out, exist_ok=True)
    cases = []
    for name, messages, gen, thinking in CASES:
        case = {"name": name, "messages": messages, "add_generation_prompt": gen}
        if thinking is not None:
            case["enable_thinking"] = thinking
        cases.append(case)
        for t, text in templates.items():
            out = render(text, messages, gen, thinking)
            with open(os.path.join(args.out, f"chat_{t}_{name}.txt"), "w", encoding="utf-8", newline="") as f:
                f.write(out)
    with open(os.path.join(args.out, "chat_cases.json"), "w", encoding="utf-8") as f:
        json.dump({"templates": templates, "styles": styles, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(cases) * len(templates)} renderings of {len(cases)} conversations to {args.out}")


if __name__ == "__main__":
    main()
