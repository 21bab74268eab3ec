#!/usr/bin/env python3
"""Checks the one-way layering of docs/design.md on the sources.

1. Includes: a file in folder X includes only headers of the folders X may use (the libraries never
   include the programs' folders erinfer/, ertrain/ or cli/, the command-line code both programs share).
2. Declarations: every function a header of folder X declares is defined in a folder X may use
   (so no lower header names a command or runner of a higher folder, included or not). The one
   exception is a hook of cli/ that each program defines for itself (PROGRAM_HOOKS).
3. Test helpers: a test in tests/X/ includes helpers of tests/X/ or tests/common/ only.
Prints one line per violation and exits 1 when there is any.
"""
import os
import re
import sys

RUNTIME = ["core", "quant", "lora", "model", "data", "infer"]
TRAIN = ["train", "rl", "switcher_train", "verifier_train"]
USES = {
    "core": ["core"],
    "quant": ["core", "quant"],
    "lora": ["core", "quant", "lora"],
    "model": ["core", "quant", "lora", "model"],
    "data": ["core", "data"],
    "infer": RUNTIME,
    "train": RUNTIME + ["train"],
    "rl": RUNTIME + ["train", "rl"],
    "switcher_train": RUNTIME + ["train", "switcher_train"],
    "verifier_train": RUNTIME + ["train", "verifier_train"],
    "cli": RUNTIME + ["cli"],
    "erinfer": RUNTIME + ["cli", "erinfer"],
    "ertrain": RUNTIME + TRAIN + ["cli", "ertrain"],
}
PROGRAMS = ["erinfer", "ertrain"]
# Declared in cli/cli.h, defined by every program (each prints its own error line): cli/ code calls it.
PROGRAM_HOOKS = {"cli_fail"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/')
DEFINE = re.compile(r"^[A-Za-z_][\w \*]*?\b([a-z_][a-z0-9_]*)\s*\([^;]*$")
DECLARE = re.compile(r"^(?:ER_API\s+)?[A-Za-z_][\w \*]*?\b([a-z_][a-z0-9_]*)\s*\([^)]*(\)[^{]*)?;?\s*(//.*)?$")


def sources(folder):
    for root, _, files in os.walk(folder):
        for name in sorted(files):
            if name.endswith((".c", ".h")):
                yield os.path.join(root, name)


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read().split("\n")


def main():
    bad = []
    defined = {}  # function name -> folder of its (first) definition
    defined_in = {}  # function name -> every folder that defines it
    for folder in USES:
        for path in sources(folder):
            lines = read(path)
            for i, line in enumerate(lines):
                m = INCLUDE.match(line)
                if m and m.group(1) in USES and m.group(1) not in USES[folder]:
                    bad.append(f"{path}:{i + 1}: includes {m.group(1)}/ (a {folder}/ file may use {' '.join(USES[folder])})")
                if path.endswith(".c") and not line.startswith(("static", " ", "\t", "#", "}")):
                    d = DEFINE.match(line)
                    nxt = next((l for l in lines[i:i + 12] if "{" in l or ";" in l), "")
                    if d and "{" in nxt:
                        defined.setdefault(d.group(1), folder)
                        defined_in.setdefault(d.group(1), set()).add(folder)
    for folder in USES:
        for path in sources(folder):
            if not path.endswith(".h"):
                continue
            for i, line in enumerate(read(path)):
                if line.startswith(("static", " ", "\t", "#", "//", "typedef", "}")):
                    continue
                d = DECLARE.match(line)
                hook = d and folder == "cli" and d.group(1) in PROGRAM_HOOKS
                if hook and defined_in.get(d.group(1)) == set(PROGRAMS):
                    continue
                if d and d.group(1) in defined and defined[d.group(1)] not in USES[folder]:
                    bad.append(f"{path}:{i + 1}: declares {d.group(1)}, defined in {defined[d.group(1)]}/ above {folder}/")
    for path in sources("tests"):
        here = path.split(os.sep)[1]
        for i, line in enumerate(read(path)):
            m = re.match(r'^\s*#\s*include\s+"tests/([a-z_]+)/', line)
            if m and m.group(1) not in (here, "common"):
                bad.append(f"{path}:{i + 1}: includes a helper of tests/{m.group(1)}/ (shared helpers live in tests/common/)")
    for b in bad:
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
