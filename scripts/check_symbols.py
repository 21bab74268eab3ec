#!/usr/bin/env python3
"""The symbol rule of the libraries (docs/design.md, "Libraries and symbols"), run by make test (check-symbols).

    check_symbols.py --header infer/erinfer.h --shipped LIB.a [LIB.so] --internal LIB.a ...
    check_symbols.py --self-test [--cc CC] [--cross PREFIX]

1. A shipped library (liberinfer.a, whose symbols are read from its symbol table, and liberinfer.so, from its
   dynamic one) defines no global symbol but the public API (in the archive whatever its visibility): every
   name it exports starts with er_ and is a function the header declares with ER_API; and every ER_API
   function is defined there. An application links
   it beside anything else (llama.cpp's ggml has names of ours) and sees nothing of the inside.
2. No object of an internal archive (liberinfer-internal.a, libertrain.a) gives default visibility to a symbol
   outside the public API: everything else is compiled -fvisibility=hidden, which is what lets the shipped
   archive make it local.

--self-test builds small libraries with a C compiler (a leaked helper, a hidden helper left global, an exported
er_ helper, a missing API function, a default-visibility helper in an internal archive, and libraries as they
should be, the shipped one made as the Makefile makes it) and checks that the rule fails the first five and passes
the last: the check is known to fail when it should.

Symbols are read with readelf (any ELF machine: the aarch64 build too; READELF overrides). Exits 1 with one
line per offending symbol, naming the library, its member and the symbol.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

READELF = os.environ.get("READELF", "readelf")
ER_API = re.compile(r"^\s*ER_API\b[^;]*?\b([A-Za-z_][A-Za-z0-9_]*)\s*\(", re.M)
GLOBAL_BINDS = ("GLOBAL", "WEAK", "UNIQUE")


def public_api(header):
    """The functions the header declares with ER_API."""
    with open(header) as f:
        text = f.read()
    names = set(ER_API.findall(text))
    if not names:
        sys.exit(f"check_symbols: {header}: no ER_API declaration found")
    return names


def symbols(path, dynamic):
    """(member, name, bind, vis) of every defined symbol of an object, archive or shared library."""
    opt = "--dyn-syms" if dynamic else "--syms"
    r = subprocess.run([READELF, "-W", opt, path], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"check_symbols: {path}: {READELF} failed: {r.stderr.strip()}")
    member, out = os.path.basename(path), []
    for line in r.stdout.splitlines():
        m = re.match(r"^File: .*\((.*)\)$", line)
        if m:
            member = m.group(1)
            continue
        f = line.split()
        # Num: Value Size Type Bind Vis Ndx Name
        if len(f) < 8 or not f[0].endswith(":") or f[6] == "UND" or f[3] in ("SECTION", "FILE"):
            continue
        out.append((member, f[7].split("@")[0], f[4], f[5]))
    return out


def is_shared(path):
    return path.endswith(".so") or ".so." in os.path.basename(path)


def check_shipped(path, api):
    # An archive's global symbols take part in a static link whatever their visibility (a hidden one still
    # clashes with, or resolves, an application's or a static ggml's name): none but the API may be global.
    # A shared library's dynamic symbols are what it exports.
    bad, defined = [], set()
    for member, name, bind, vis in symbols(path, is_shared(path)):
        if bind not in GLOBAL_BINDS:
            continue
        defined.add(name)
        if name not in api:
            why = "not declared ER_API in the public header" if name.startswith("er_") else "not an er_ name"
            bad.append(f"{path}({member}): defines global {name}: {why} (a shipped library's only globals are "
                       "the public API)")
    for name in sorted(api - defined):
        bad.append(f"{path}: does not export {name}, an ER_API function of the public header")
    return bad


def check_internal(path, api):
    bad = []
    for member, name, bind, vis in symbols(path, False):
        if bind in GLOBAL_BINDS and vis == "DEFAULT" and name not in api:
            bad.append(f"{path}({member}): {name} has default visibility (library objects are compiled "
                       "-fvisibility=hidden; only ER_API functions are visible)")
    return bad


def run(header, shipped, internal):
    api = public_api(header)
    bad = []
    for p in shipped:
        bad += check_shipped(p, api)
    for p in internal:
        bad += check_internal(p, api)
    return bad


SELF_HEADER = """#define ER_API __attribute__((visibility("default")))
ER_API const char *er_version(void);
ER_API int er_answer(int x);
"""
SELF_API = 'const char *er_version(void) { return "0"; }\nint er_answer(int x) { return x; }\n'


def self_test(cc, cross):
    """The rule on small libraries: five that break it, one that keeps it."""
    with tempfile.TemporaryDirectory(prefix="check_symbols_") as d:
        def path(name):
            return os.path.join(d, name)

        def build(name, src, hidden):
            with open(path(name + ".c"), "w") as f:
                f.write(src)
            cmd = f"{cc} -c -fPIC {'-fvisibility=hidden' if hidden else ''} -include {path('api.h')} "
            subprocess.run(cmd + f"{path(name + '.c')} -o {path(name + '.o')}", shell=True, check=True)

        def archive(name, objs):
            subprocess.run(["ar", "rcs", path(name)] + [path(o + ".o") for o in objs], check=True)
            return [path(name)]

        with open(path("api.h"), "w") as f:
            f.write(SELF_HEADER)
        build("api", SELF_API, True)
        build("helper", "int helper(void) { return 2; }\n", True)
        build("leak", "int gguf_find_tensor(void) { return 1; }\n", False)  # compiled without hiding
        build("er_leak", "void *er_alloc(void) { return 0; }\n", False)  # an er_ name outside the API
        build("half_api", 'const char *er_version(void) { return "0"; }\n', True)
        leak, good = archive("leak.a", ["api", "leak"]), archive("good.a", ["api", "helper"])
        # The shipped archive as the Makefile makes it: one prelinked object, its hidden symbols local.
        subprocess.run([cross + "ld", "-r", path("api.o"), path("helper.o"), "-o", path("one.o")], check=True)
        subprocess.run([cross + "objcopy", "--localize-hidden", path("one.o")], check=True)
        shipped = archive("shipped.a", ["one"])
        cases = [  # (what, shipped, internal, breaks the rule)
            ("a leaked helper in the shipped archive", leak, [], True),
            ("a hidden helper left global in the shipped archive", good, [], True),
            ("an er_ helper exported by the shipped archive", archive("er.a", ["api", "er_leak"]), [], True),
            ("an ER_API function missing from the shipped archive", archive("half.a", ["half_api"]), [], True),
            ("a default-visibility helper in an internal archive", [], leak, True),
            ("libraries as they should be", shipped, good, False),
        ]
        for what, shipped, internal, breaks in cases:
            bad = run(path("api.h"), shipped, internal)
            if bool(bad) != breaks:
                sys.exit(f"check_symbols --self-test: {what}: the rule {'passed' if breaks else 'failed'} "
                         f"({'; '.join(bad) or 'no finding'})")
    print("check_symbols: self-test passed (a leaked, visible or missing symbol breaks the rule)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--header")
    ap.add_argument("--shipped", nargs="*", default=[])
    ap.add_argument("--internal", nargs="*", default=[])
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--cc", default=os.environ.get("CC", "cc"))
    ap.add_argument("--cross", default="", help="binutils prefix for the self-test (make CROSS=...)")
    a = ap.parse_args()
    if a.self_test:
        self_test(a.cc, a.cross)
        return
    if not a.header or not (a.shipped or a.internal):
        ap.error("--header and at least one library are needed")
    for p in a.shipped + a.internal:
        if not os.path.exists(p):
            sys.exit(f"check_symbols: {p}: no such file")
    bad = run(a.header, a.shipped, a.internal)
    for line in bad:
        print(line)
    if bad:
        sys.exit(f"check_symbols: {len(bad)} symbol(s) break the rule (docs/design.md, \"Libraries and symbols\")")
    n = len(public_api(a.header))
    print(f"check_symbols: {' '.join(a.shipped)} export the {n} ER_API functions only; "
          f"{' '.join(a.internal)}: nothing else visible")


if __name__ == "__main__":
    main()
