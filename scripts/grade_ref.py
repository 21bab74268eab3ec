#!/usr/bin/env python3
"""The project's answer grading rule (data/grade.h, data/grade.c) in Python, for scripts that grade replies they
got from erinfer serve (scripts/memory_recall.sh). A line-by-line port of grade_answer (no forced answer suffix),
grade_answer_correct and grade_normalize, on bytes as the C reads them (ASCII ctype, UTF-8 passed through):

- a reply holding "<think>" is read only after the first "</think>" after it (none: no answer);
- the answer is the last \\boxed{...} / \\fbox, else the rest of the line after the last "####", else after the last
  "Answer:" / "Final answer:" (case-insensitive; the next non-empty line when that one is empty);
- the leading-number rule ("36 apples" -> "36") on all but a \\boxed{} answer, and on the gold answer;
- both normalised (LaTeX wrappers, units in \\text{ }, $ and %, spaces, thousands separators, x = 5, a/b, .5, 17.0)
  and equal as strings, or as numbers (integers exactly, others within 1e-6 relative).

Grading is case-sensitive, as in C: "Answer: Cartographer" is not "cartographer".

usage: grade_ref.py REPLY GOLD    prints "correct", "wrong" or "unformatted" (no answer found), the answer read
"""
import math
import sys

SPACE = b" \t\n\v\f\r"


def _at(s, i):
    return s[i] if 0 <= i < len(s) else 0


def _isdigit(c):
    return 48 <= c <= 57


def _isalpha(c):
    return 65 <= c <= 90 or 97 <= c <= 122


def _isspace(c):
    return c != 0 and c in SPACE


def _is_digits(s):
    return len(s) > 0 and all(_isdigit(c) for c in s)


def _brace_end(s, open_):
    """Index of the '}' matching the '{' at s[open_], skipping escaped \\{ and \\}; -1 when unbalanced."""
    depth, i = 0, open_
    while i < len(s):
        c = s[i]
        if c == 0x5C and i + 1 < len(s):
            i += 2
            continue
        if c == ord("{"):
            depth += 1
        elif c == ord("}"):
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def _find_cmd(s, at, cmd):
    while True:
        p = s.find(cmd, at)
        if p < 0:
            return -1
        if not _isalpha(_at(s, p + len(cmd))):
            return p
        at = p + 1


def _unwrap_cmd(s, cmd):
    at = 0
    while True:
        i = _find_cmd(s, at, cmd)
        if i < 0:
            return s
        j = i + len(cmd)
        while _at(s, j) == ord(" "):
            j += 1
        e = _brace_end(s, j) if _at(s, j) == ord("{") else -1
        if e < 0:
            at = i + 1
            continue
        s = s[:e] + s[e + 1 :]
        s = s[:i] + s[j + 1 :]
        at = i


def _remove_cmd(s, cmd):
    at = 0
    while True:
        i = _find_cmd(s, at, cmd)
        if i < 0:
            return s
        s = s[:i] + s[i + len(cmd) :]
        at = i


def _remove_latex_spacing(s):
    out, i = bytearray(), 0
    while i < len(s):
        if s[i] == 0x5C and _at(s, i + 1) == 0x5C:
            out += s[i : i + 2]
            i += 2
        elif s[i] == 0x5C and _at(s, i + 1) != 0 and _at(s, i + 1) in b" ,;:!":
            i += 2
        else:
            out.append(s[i])
            i += 1
    return bytes(out)


def _fix_short_args(s, cmd, nargs):
    at = 0
    while True:
        p = s.find(cmd, at)
        if p < 0:
            return s
        j = p + len(cmd)
        if _isalpha(_at(s, j)):
            at = j
            continue
        for _ in range(nargs):
            c = _at(s, j)
            if c == ord("{"):
                e = _brace_end(s, j)
                if e < 0:
                    break
                j = e + 1
            elif c and c != 0x5C and c != ord("}"):
                s = s[:j] + b"{" + s[j : j + 1] + b"}" + s[j + 1 :]
                j += 3
            else:
                break
        at = j


def _fix_thousands(s):
    p = s[1:] if s[:1] in (b"-", b"+") else s
    lead = 0
    while lead < len(p) and _isdigit(p[lead]):
        lead += 1
    if lead < 1 or lead > 3 or _at(p, lead) != ord(","):
        return s
    q = lead
    while _at(p, q) == ord(","):
        if len(p[q + 1 : q + 4]) < 3 or not _is_digits(p[q + 1 : q + 4]) or _isdigit(_at(p, q + 4)):
            return s
        q += 4
    if (not _is_digits(p[q + 1 :])) if _at(p, q) == ord(".") else q < len(p):
        return s
    return s.replace(b",", b"")


def _fix_slash(s):
    neg = s[:1] == b"-"
    p = s[1:] if neg else s
    k = p.find(b"/")
    if k < 0 or not _is_digits(p[:k]) or not _is_digits(p[k + 1 :]):
        return s
    return (b"-" if neg else b"") + b"\\frac{" + p[:k] + b"}{" + p[k + 1 :] + b"}"


def _fix_decimal(s):
    if _at(s, 0) == ord("+") and (_isdigit(_at(s, 1)) or _at(s, 1) == ord(".")):
        s = s[1:]
    sign = 1 if _at(s, 0) == ord("-") else 0
    if _at(s, sign) == ord(".") and _isdigit(_at(s, sign + 1)):
        s = s[:sign] + b"0" + s[sign:]
    dot = s.find(b".", sign)
    if dot >= 0 and _is_digits(s[sign:dot]) and _is_digits(s[dot + 1 :]):
        s = s.rstrip(b"0")
        if s.endswith(b"."):
            s = s[:-1]
    return b"0" if s == b"-0" else s


def _fix_equation(s):
    eq = s.find(b"=")
    if eq < 0 or s.find(b"=", eq + 1) >= 0 or eq > 2 or eq == 0 or eq + 1 >= len(s):
        return s
    if not all(_isalpha(c) for c in s[:eq]):
        return s
    return s[eq + 1 :]


def normalize(answer):
    """grade_normalize: the normal form of an answer (bytes)."""
    s = answer.strip(SPACE)
    for unit in (b"\\text{ ", b"\\mbox{ "):
        u = s.find(unit)
        if u > 0:
            s = s[:u]
    for cmd in (b"\\boxed", b"\\fbox", b"\\text", b"\\textbf", b"\\textit", b"\\textrm", b"\\textnormal",
                b"\\mathrm", b"\\mathbf", b"\\mathit", b"\\mbox"):
        s = _unwrap_cmd(s, cmd)
    for cmd in (b"\\left", b"\\right", b"\\displaystyle", b"\\degree"):
        s = _remove_cmd(s, cmd)
    s = _remove_latex_spacing(s).replace(b"~", b"")
    for a, b in ((b"\xe2\x88\x92", b"-"), (b"\\dfrac", b"\\frac"), (b"\\tfrac", b"\\frac"), (b"^{\\circ}", b""),
                 (b"^\\circ", b""), (b"\xc2\xb0", b""), (b"\\%", b""), (b"%", b""), (b"\\$", b""), (b"$", b""),
                 (b"{,}", b",")):
        s = s.replace(a, b)
    s = bytes(c for c in s if not _isspace(c)).rstrip(b"." + SPACE)
    s = _fix_equation(s)
    s = _fix_short_args(s, b"\\frac", 2)
    s = _fix_short_args(s, b"\\sqrt", 1)
    return _fix_decimal(_fix_slash(_fix_thousands(s)))


def _parse_decimal(s):
    i, digits = 0, 0
    if _at(s, 0) in (ord("-"), ord("+")):
        i += 1
    while i < len(s) and _isdigit(s[i]):
        i, digits = i + 1, digits + 1
    if _at(s, i) == ord(".") and i < len(s):
        i += 1
        while i < len(s) and _isdigit(s[i]):
            i, digits = i + 1, digits + 1
    if i != len(s) or digits == 0 or len(s) > 64:
        return None
    v = float(s)
    return v if math.isfinite(v) else None


def parse_number(s):
    """grade_parse_number on a normalised answer: its value, or None."""
    v = _parse_decimal(s)
    if v is not None:
        return v
    sign, p = 1.0, s
    if _at(p, 0) in (ord("-"), ord("+")):
        sign, p = (-1.0 if p[0] == ord("-") else 1.0), p[1:]
    if p.startswith(b"\\frac{"):
        e1 = _brace_end(p, 5)
        if e1 < 0 or _at(p, e1 + 1) != ord("{"):
            return None
        e2 = _brace_end(p, e1 + 1)
        if e2 < 0 or e2 + 1 != len(p):
            return None
        num, den = _parse_decimal(p[6:e1]), _parse_decimal(p[e1 + 2 : e2])
    else:
        k = p.find(b"/")
        if k < 0:
            return None
        num, den = _parse_decimal(p[:k]), _parse_decimal(p[k + 1 :])
    if num is None or den is None or den == 0:
        return None
    return sign * num / den


def equal(a, b):
    """grade_equal."""
    na, nb = normalize(a), normalize(b)
    if na == nb and na:
        return True
    x, y = parse_number(na), parse_number(nb)
    if x is None or y is None:
        return False
    if (x == math.floor(x) and y == math.floor(y) and not any(c in na + nb for c in b"./")
            and b"frac" not in na and b"frac" not in nb):
        return x == y
    return x == y or abs(x - y) <= 1e-6 * max(abs(x), abs(y))


def _starts_with_cmd(s, i, cmd):
    return s.startswith(cmd, i) and not _isalpha(_at(s, i + len(cmd)))


def _extract_boxed(text):
    for i in range(len(text) - 1, -1, -1):
        if text[i] != 0x5C:
            continue
        cl = 6 if _starts_with_cmd(text, i, b"\\boxed") else 5 if _starts_with_cmd(text, i, b"\\fbox") else 0
        if not cl:
            continue
        j = i + cl
        while _at(text, j) == ord(" "):
            j += 1
        if _at(text, j) == ord("{"):
            e = _brace_end(text, j)
            if e < 0:
                continue
            return text[j + 1 : e]
        if j > i + cl and _at(text, j) and _at(text, j) != ord("$"):
            k = j
            while _at(text, k) and _at(text, k) != ord("$") and not _isspace(_at(text, k)):
                k += 1
            return text[j:k]
    return None


def _rest_of_line(text, at, next_line):
    p = at
    for _ in range(2 if next_line else 1):
        while _at(text, p) in (ord(" "), ord("\t"), ord("*"), ord(":")) and p < len(text):
            p += 1
        e = text.find(b"\n", p)
        e = len(text) if e < 0 else e
        t = e
        while t > p and (_isspace(text[t - 1]) or text[t - 1] == ord("*")):
            t -= 1
        if t > p:
            return text[p:t]
        if e >= len(text):
            return None
        p = e + 1
        while p < len(text) and text[p] in b"\n\r ":
            p += 1
    return None


def _leading_number(ans):
    if parse_number(normalize(ans)) is not None:
        return ans
    s = ans
    i = 1 if _at(s, 0) in (ord("-"), ord("+")) else 0
    i += _at(s, i) == ord("$")
    if not _isdigit(_at(s, i)):
        return ans
    while _isdigit(_at(s, i)):
        i += 1
    while (_at(s, i) == ord(",") and _isdigit(_at(s, i + 1)) and _isdigit(_at(s, i + 2)) and _isdigit(_at(s, i + 3))
           and not _isdigit(_at(s, i + 4))):
        i += 4
    if _at(s, i) == ord(".") and _isdigit(_at(s, i + 1)):
        i += 1
        while _isdigit(_at(s, i)):
            i += 1
    i += _at(s, i) == ord("%")
    c = _at(s, i)
    sep = c in (ord(" "), ord("\t"), ord(","), ord(";")) or (
        c == ord(".") and (_at(s, i + 1) == 0 or _isspace(_at(s, i + 1))))
    return s[:i] if sep else ans


def extract(text):
    """grade_extract: the final answer in text (bytes), or None."""
    boxed = _extract_boxed(text)
    if boxed is not None:
        return boxed
    i = text.rfind(b"####")
    if i >= 0:
        r = _rest_of_line(text, i + 4, False)
        if r is not None:
            return _leading_number(r)
    # "Final answer:" ends in "answer:", so one case-insensitive search covers both; the last one with an answer.
    low, end = text.lower(), len(text)
    while (i := low.rfind(b"answer", 0, end)) >= 0:
        j = i + 6
        while _at(text, j) == ord("*"):
            j += 1
        if _at(text, j) == ord(":"):
            r = _rest_of_line(text, j + 1, True)
            if r is not None:
                return _leading_number(r)
        end = i + 5  # the next one starts before i
    return None


def answer(reply):
    """grade_answer (no forced suffix, the reply not begun inside a think block): the answer as bytes, or None."""
    reply = reply.encode() if isinstance(reply, str) else reply
    reply = reply.split(b"\0", 1)[0]  # the C reads a string
    open_ = reply.find(b"<think>")
    if open_ < 0:
        return extract(reply)
    close = reply.find(b"</think>", open_ + len(b"<think>"))
    return None if close < 0 else extract(reply[close + len(b"</think>") :])


def answer_correct(ans, gold):
    """grade_answer_correct: the answer read from a reply against the gold answer, read by the same rule."""
    if ans is None or gold is None:
        return False
    gold = gold.encode() if isinstance(gold, str) else gold
    g = extract(gold) if any(m in gold for m in (b"\\boxed", b"\\fbox", b"####")) else None
    return equal(ans, g if g is not None else _leading_number(gold))


def grade(reply, gold):
    """grade_response: (correct, unformatted)."""
    ans = answer(reply)
    return answer_correct(ans, gold), ans is None


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.rsplit("usage: ", 1)[1])
    ans = answer(sys.argv[1])
    print("unformatted" if ans is None else "correct" if answer_correct(ans, sys.argv[2]) else "wrong",
          "" if ans is None else ans.decode(errors="replace"))
