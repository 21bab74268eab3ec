#!/usr/bin/env python3
"""An OpenAI chat request with tools rendered by jinja2 through a real template, for tests/infer/test_server.c.

    python3 scripts/chat_tools_golden.py qwen25|qwen3 REQUEST.json

Prints the prompt (generation prompt added) that transformers' apply_chat_template would give for the
request's messages and tools: the Qwen2.5-Instruct template of scripts/make_chat_golden.py or the Qwen3
template of ../shared/fixtures/qwen-tokenizer/tokenizer_config.json. Assistant tool calls are passed as
Hugging Face does ({"name", "arguments": dict}), so the template's tojson writes the arguments.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_chat_golden import QWEN25_TEMPLATE, render  # noqa: E402


def main():
    name, path = sys.argv[1], sys.argv[2]
    if name == "qwen25":
        template = QWEN25_TEMPLATE
    else:
        with open("../shared/fixtures/qwen-tokenizer/tokenizer_config.json", encoding="utf-8") as f:
            template = json.load(f)["chat_template"]
    with open(path, encoding="utf-8") as f:
        req = json.load(f)
    messages = []
    for m in req["messages"]:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{"type": "function", "function": {"name": c["function"]["name"],
                                "arguments": json.loads(c["function"]["arguments"])}} for c in m["tool_calls"]]
        messages.append(m)
    sys.stdout.write(render(template, messages, True, None, req.get("tools")))


if __name__ == "__main__":
    main()
