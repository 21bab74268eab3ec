#include "data/grade.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/alloc.h"
#include "core/error.h"

// Every string helper below takes ownership of its input and returns a new string, or NULL (input
// freed, ER_ENOMEM recorded) when an allocation fails, so a pipeline of them needs one check per step.

static char *dup_range(const char *s, size_t n) {
    char *d = er_alloc(n + 1);
    if (!d)
        return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

// s[at, at+del) replaced by ins.
static char *splice(char *s, size_t at, size_t del, const char *ins) {
    size_t n = strlen(s), m = strlen(ins);
    char *d = er_alloc(n - del + m + 1);
    if (d) {
        memcpy(d, s, at);
        memcpy(d + at, ins, m);
        memcpy(d + at + m, s + at + del, n - at - del + 1);
    }
    er_free(s);
    return d;
}

static char *replace_all(char *s, const char *from, const char *to) {
    size_t fl = strlen(from), tl = strlen(to);
    size_t at = 0;
    while (s) {
        char *p = strstr(s + at, from);
        if (!p)
            break;
        at = (size_t)(p - s);
        s = splice(s, at, fl, to);
        at += tl;
    }
    return s;
}

// Index of the '}' matching the '{' at s[open], skipping escaped \{ and \}; -1 when unbalanced.
static long brace_end(const char *s, size_t open) {
    int depth = 0;
    for (size_t i = open; s[i]; i++) {
        if (s[i] == '\\' && s[i + 1]) {
            i++;
            continue;
        }
        if (s[i] == '{')
            depth++;
        else if (s[i] == '}' && --depth == 0)
            return (long)i;
    }
    return -1;
}

// Offset of the first "\cmd" at or after `at` that is not the prefix of a longer command name, or -1.
static long find_cmd(const char *s, size_t at, const char *cmd) {
    size_t cl = strlen(cmd);
    for (const char *p; (p = strstr(s + at, cmd)) != NULL; at = (size_t)(p - s) + 1)
        if (!isalpha((unsigned char)p[cl]))
            return (long)(p - s);
    return -1;
}

// Replaces every "\cmd{X}" (cmd not followed by another letter) with X.
static char *unwrap_cmd(char *s, const char *cmd) {
    size_t cl = strlen(cmd), at = 0;
    long i;
    while (s && (i = find_cmd(s, at, cmd)) >= 0) {
        size_t j = (size_t)i + cl;
        while (s[j] == ' ')
            j++;
        long e = s[j] == '{' ? brace_end(s, j) : -1;
        if (e < 0) {
            at = (size_t)i + 1;
            continue;
        }
        s = splice(s, (size_t)e, 1, "");
        if (s)
            s = splice(s, (size_t)i, j + 1 - (size_t)i, "");
        at = (size_t)i;
    }
    return s;
}

// Removes "\cmd" wherever it is not the prefix of a longer command name.
static char *remove_cmd(char *s, const char *cmd) {
    size_t at = 0;
    long i;
    while (s && (i = find_cmd(s, at, cmd)) >= 0) {
        s = splice(s, (size_t)i, strlen(cmd), "");
        at = (size_t)i;
    }
    return s;
}

// LaTeX spacing (\, \; \: \! and "\ ") removed; a "\\" row break is kept whole.
static char *remove_latex_spacing(char *s) {
    size_t j = 0;
    for (size_t i = 0; s[i]; i++) {
        if (s[i] == '\\' && s[i + 1] == '\\') {
            s[j++] = s[i++];
            s[j++] = s[i];
        } else if (s[i] == '\\' && s[i + 1] && strchr(" ,;:!", s[i + 1])) {
            i++;
        } else {
            s[j++] = s[i];
        }
    }
    s[j] = 0;
    return s;
}

static char *remove_space(char *s) {
    size_t j = 0;
    for (size_t i = 0; s[i]; i++)
        if (!isspace((unsigned char)s[i]))
            s[j++] = s[i];
    s[j] = 0;
    return s;
}

// \frac12 -> \frac{1}{2}, \frac1{2} -> \frac{1}{2}, \frac{1}2 -> \frac{1}{2}; likewise \sqrt2.
static char *fix_short_args(char *s, const char *cmd, int nargs) {
    size_t cl = strlen(cmd), at = 0;
    while (s) {
        char *p = strstr(s + at, cmd);
        if (!p)
            break;
        size_t j = (size_t)(p - s) + cl;
        if (isalpha((unsigned char)s[j])) {
            at = j;
            continue;
        }
        for (int a = 0; a < nargs && s; a++) {
            if (s[j] == '{') {
                long e = brace_end(s, j);
                if (e < 0)
                    break;
                j = (size_t)e + 1;
            } else if (s[j] && s[j] != '\\' && s[j] != '}') {
                char arg[4] = {'{', s[j], '}', 0};
                s = splice(s, j, 1, arg);
                j += 3;
            } else {
                break;
            }
        }
        at = j;
    }
    return s;
}

static int is_digits(const char *s, size_t n) {
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isdigit((unsigned char)s[i]))
            return 0;
    return 1;
}

// "1,234,567" or "1,234.5" (groups of exactly three): commas removed.
static char *fix_thousands(char *s) {
    const char *p = s + (*s == '-' || *s == '+');
    size_t lead = strspn(p, "0123456789");
    if (lead < 1 || lead > 3 || p[lead] != ',')
        return s;
    const char *q = p + lead;
    while (*q == ',') {
        if (!is_digits(q + 1, 3) || isdigit((unsigned char)q[4]))
            return s;
        q += 4;
    }
    if (*q == '.' ? !is_digits(q + 1, strlen(q + 1)) : *q != 0)
        return s;
    return replace_all(s, ",", "");
}

// Whole-string "a/b" with integers -> \frac{a}{b} (sign outside).
static char *fix_slash(char *s) {
    const char *p = s + (*s == '-');
    const char *slash = strchr(p, '/');
    if (!slash || !is_digits(p, (size_t)(slash - p)) || !is_digits(slash + 1, strlen(slash + 1)))
        return s;
    size_t n = strlen(s) + 16;
    char *d = er_alloc(n);
    if (d)
        snprintf(d, n, "%s\\frac{%.*s}{%s}", *s == '-' ? "-" : "", (int)(slash - p), p, slash + 1);
    er_free(s);
    return d;
}

// Plain decimals: ".5" -> "0.5", "+5" -> "5", "17.50" -> "17.5", "17.0" -> "17".
static char *fix_decimal(char *s) {
    if (s[0] == '+' && (isdigit((unsigned char)s[1]) || s[1] == '.'))
        memmove(s, s + 1, strlen(s));
    size_t sign = s[0] == '-';
    if (s[sign] == '.' && isdigit((unsigned char)s[sign + 1]))
        s = splice(s, sign, 0, "0");
    if (!s)
        return NULL;
    const char *dot = strchr(s + sign, '.');
    if (dot && is_digits(s + sign, (size_t)(dot - s - sign)) && is_digits(dot + 1, strlen(dot + 1))) {
        size_t n = strlen(s);
        while (s[n - 1] == '0')
            s[--n] = 0;
        if (s[n - 1] == '.')
            s[--n] = 0;
    }
    if (strcmp(s, "-0") == 0)
        s[0] = '0', s[1] = 0;
    return s;
}

// "x=5" -> "5" when the left side is a short name (at most two letters).
static char *fix_equation(char *s) {
    char *eq = strchr(s, '=');
    if (!eq || strchr(eq + 1, '=') || eq - s > 2 || eq == s || !eq[1])
        return s;
    for (char *p = s; p < eq; p++)
        if (!isalpha((unsigned char)*p))
            return s;
    return splice(s, 0, (size_t)(eq - s) + 1, "");
}

static void strip_trailing_dots(char *s) {
    size_t n = strlen(s);
    while (n && (s[n - 1] == '.' || isspace((unsigned char)s[n - 1])))
        s[--n] = 0;
}

int grade_normalize(const char *answer, char **out) {
    *out = NULL;
    const char *a = answer;
    size_t n = strlen(a);
    while (n && isspace((unsigned char)*a))
        a++, n--;
    while (n && isspace((unsigned char)a[n - 1]))
        n--;
    char *s = dup_range(a, n);
    // Units after the value, "5\text{ cm}" (a \text{ opening with a space), are dropped as in the
    // MATH reference normaliser.
    static const char *const units[] = {"\\text{ ", "\\mbox{ "};
    for (size_t i = 0; i < 2 && s; i++) {
        char *u = strstr(s, units[i]);
        if (u && u > s)
            *u = 0;
    }
    static const char *const unwrap[] = {"\\boxed", "\\fbox", "\\text", "\\textbf", "\\textit", "\\textrm",
                                         "\\textnormal", "\\mathrm", "\\mathbf", "\\mathit", "\\mbox"};
    for (size_t i = 0; i < sizeof unwrap / sizeof unwrap[0]; i++)
        s = s ? unwrap_cmd(s, unwrap[i]) : NULL;
    static const char *const drop[] = {"\\left", "\\right", "\\displaystyle", "\\degree"};
    for (size_t i = 0; i < sizeof drop / sizeof drop[0]; i++)
        s = s ? remove_cmd(s, drop[i]) : NULL;
    s = s ? replace_all(remove_latex_spacing(s), "~", "") : NULL;
    static const char *const rep[][2] = {
        {"\xe2\x88\x92", "-"}, // U+2212 minus sign
        {"\\dfrac", "\\frac"}, {"\\tfrac", "\\frac"}, {"^{\\circ}", ""}, {"^\\circ", ""}, {"\xc2\xb0", ""},
        {"\\%", ""}, {"%", ""}, {"\\$", ""}, {"$", ""}, {"{,}", ","},
    };
    for (size_t i = 0; i < sizeof rep / sizeof rep[0]; i++)
        s = s ? replace_all(s, rep[i][0], rep[i][1]) : NULL;
    if (s) {
        s = remove_space(s);
        strip_trailing_dots(s);
        s = fix_equation(s);
    }
    s = s ? fix_short_args(s, "\\frac", 2) : NULL;
    s = s ? fix_short_args(s, "\\sqrt", 1) : NULL;
    s = s ? fix_thousands(s) : NULL;
    s = s ? fix_slash(s) : NULL;
    s = s ? fix_decimal(s) : NULL;
    if (!s)
        return er_error(ER_ENOMEM, "grade: out of memory normalising an answer of %zu bytes", strlen(answer));
    *out = s;
    return ER_OK;
}

// Plain decimal with optional sign, all of [s, s+n).
static int parse_decimal(const char *s, size_t n, double *out) {
    size_t i = 0, digits = 0;
    if (i < n && (s[i] == '-' || s[i] == '+'))
        i++;
    while (i < n && isdigit((unsigned char)s[i]))
        i++, digits++;
    if (i < n && s[i] == '.') {
        i++;
        while (i < n && isdigit((unsigned char)s[i]))
            i++, digits++;
    }
    if (i != n || digits == 0 || n > 64)
        return 0;
    char t[72];
    memcpy(t, s, n);
    t[n] = 0;
    *out = strtod(t, NULL);
    return isfinite(*out);
}

int grade_parse_number(const char *s, double *out) {
    size_t n = strlen(s);
    if (parse_decimal(s, n, out))
        return 1;
    double sign = 1, num, den;
    const char *p = s;
    if (*p == '-' || *p == '+')
        sign = *p++ == '-' ? -1 : 1;
    if (strncmp(p, "\\frac{", 6) == 0) {
        long e1 = brace_end(p, 5);
        if (e1 < 0 || p[e1 + 1] != '{')
            return 0;
        long e2 = brace_end(p, (size_t)e1 + 1);
        if (e2 < 0 || p[e2 + 1] != 0)
            return 0;
        if (!parse_decimal(p + 6, (size_t)e1 - 6, &num) || !parse_decimal(p + e1 + 2, (size_t)(e2 - e1 - 2), &den))
            return 0;
    } else {
        const char *slash = strchr(p, '/');
        if (!slash || !parse_decimal(p, (size_t)(slash - p), &num) ||
            !parse_decimal(slash + 1, strlen(slash + 1), &den))
            return 0;
    }
    if (den == 0)
        return 0;
    *out = sign * num / den;
    return 1;
}

int grade_equal(const char *a, const char *b) {
    char *na = NULL, *nb = NULL;
    int rc = ER_OK, eq;
    ER_CHECK(grade_normalize(a, &na));
    ER_CHECK(grade_normalize(b, &nb));
    eq = strcmp(na, nb) == 0 && na[0] != 0;
    double x, y;
    if (!eq && grade_parse_number(na, &x) && grade_parse_number(nb, &y)) {
        // Integers compare exactly (1000000 is not 1000001); anything with a fraction to 1e-6.
        if (x == floor(x) && y == floor(y) && !strpbrk(na, "./") && !strpbrk(nb, "./") && !strstr(na, "frac") &&
            !strstr(nb, "frac"))
            eq = x == y;
        else
            eq = x == y || fabs(x - y) <= 1e-6 * fmax(fabs(x), fabs(y));
    }
    rc = eq;
done:
    er_free(na);
    er_free(nb);
    return rc;
}

static int starts_with_cmd(const char *s, const char *cmd) {
    size_t n = strlen(cmd);
    return strncmp(s, cmd, n) == 0 && !isalpha((unsigned char)s[n]);
}

// The last well-formed \boxed{...} / \fbox{...} / "\boxed 5" in text.
static int extract_boxed(const char *text, char **out) {
    for (size_t i = strlen(text); i-- > 0;) {
        if (text[i] != '\\')
            continue;
        size_t cl = starts_with_cmd(text + i, "\\boxed") ? 6 : starts_with_cmd(text + i, "\\fbox") ? 5 : 0;
        if (!cl)
            continue;
        size_t j = i + cl;
        while (text[j] == ' ')
            j++;
        if (text[j] == '{') {
            long e = brace_end(text, j);
            if (e < 0)
                continue;
            *out = dup_range(text + j + 1, (size_t)e - j - 1);
            return *out ? 1 : ER_ENOMEM;
        }
        if (j > i + cl && text[j] && text[j] != '$') {
            size_t k = j;
            while (text[k] && text[k] != '$' && !isspace((unsigned char)text[k]))
                k++;
            *out = dup_range(text + j, k - j);
            return *out ? 1 : ER_ENOMEM;
        }
    }
    return 0;
}

// Trimmed rest of the line after text[at]; when that is empty, the next non-empty line.
static int rest_of_line(const char *text, size_t at, int next_line, char **out) {
    const char *p = text + at;
    for (int tries = 0; tries < (next_line ? 2 : 1); tries++) {
        while (*p == ' ' || *p == '\t' || *p == '*' || *p == ':')
            p++;
        const char *e = p + strcspn(p, "\n");
        const char *t = e;
        while (t > p && (isspace((unsigned char)t[-1]) || t[-1] == '*'))
            t--;
        if (t > p) {
            *out = dup_range(p, (size_t)(t - p));
            return *out ? 1 : ER_ENOMEM;
        }
        if (!*e)
            return 0;
        p = e + 1;
        while (*p == '\n' || *p == '\r' || *p == ' ')
            p++;
    }
    return 0;
}

// The leading-number rule (lm-eval's strict GSM8K match takes the number after "####" and nothing
// else): "36, 36 + 5 = 43, 43 + 5 =" -> "36". Kept whole: an answer that is a number as a whole
// ("1,000", "x = 5", "3/4", "50%"), and one that does not start with a number or whose number runs
// on into more of the answer ("2\sqrt{3}", "(1, 2)", "3x+1").
static int leading_number(char **ans) {
    char *norm;
    ER_TRY(grade_normalize(*ans, &norm));
    double v;
    int whole = grade_parse_number(norm, &v);
    er_free(norm);
    if (whole)
        return ER_OK;
    const unsigned char *s = (const unsigned char *)*ans;
    size_t i = s[0] == '-' || s[0] == '+';
    i += s[i] == '$';
    if (!isdigit(s[i]))
        return ER_OK;
    while (isdigit(s[i]))
        i++;
    while (s[i] == ',' && isdigit(s[i + 1]) && isdigit(s[i + 2]) && isdigit(s[i + 3]) && !isdigit(s[i + 4]))
        i += 4;
    if (s[i] == '.' && isdigit(s[i + 1])) {
        i++;
        while (isdigit(s[i]))
            i++;
    }
    i += s[i] == '%';
    int sep = s[i] == ' ' || s[i] == '\t' || s[i] == ',' || s[i] == ';' ||
              (s[i] == '.' && (!s[i + 1] || isspace(s[i + 1])));
    if (!sep)
        return ER_OK;
    char *d = dup_range(*ans, i);
    if (!d)
        return ER_ENOMEM;
    er_free(*ans);
    *ans = d;
    return ER_OK;
}

// An answer found by rest_of_line (rc 1), with the leading-number rule applied.
static int line_answer(int rc, char **out) {
    if (rc < 0 || (rc == 1 && leading_number(out) < 0)) {
        er_free(*out);
        *out = NULL;
        return er_error(ER_ENOMEM, "grade: out of memory extracting an answer");
    }
    return ER_OK;
}

int grade_extract(const char *text, char **out) {
    *out = NULL;
    int rc = extract_boxed(text, out);
    if (rc != 0)
        return rc < 0 ? er_error(ER_ENOMEM, "grade: out of memory extracting an answer") : ER_OK;
    size_t n = strlen(text);
    for (size_t i = n; i-- > 0;) {
        if (strncmp(text + i, "####", 4) == 0) {
            rc = rest_of_line(text, i + 4, 0, out);
            if (rc != 0)
                return line_answer(rc, out);
            break;
        }
    }
    // "Final answer:" ends in "answer:", so one case-insensitive search covers both.
    for (size_t i = n; i-- > 0;) {
        if (strncasecmp(text + i, "answer", 6) != 0)
            continue;
        size_t j = i + 6;
        while (text[j] == '*')
            j++;
        if (text[j] != ':')
            continue;
        rc = rest_of_line(text, j + 1, 1, out);
        if (rc != 0)
            return line_answer(rc, out);
    }
    return ER_OK;
}

int grade_think_opens(const char *response_prefix) {
    const char *open = NULL;
    for (const char *p = response_prefix ? strstr(response_prefix, GRADE_THINK_OPEN) : NULL; p;
         p = strstr(p + 1, GRADE_THINK_OPEN))
        open = p;
    return open && !strstr(open, GRADE_THINK_CLOSE);
}

int grade_think_closes(const char *response_prefix) {
    return response_prefix && strstr(response_prefix, GRADE_THINK_CLOSE) && !grade_think_opens(response_prefix);
}

// The answer of response[start..] (start: where the think block closed, 0 without one); answer_at as in
// grade_answer, used when it lies in that part.
static int answer_from(const char *response, size_t start, long answer_at, char **out) {
    *out = NULL;
    if (answer_at < 0 || (size_t)answer_at < start)
        return grade_extract(response + start, out);
    size_t n = strlen(response), at = (size_t)answer_at;
    if (at > n)
        return ER_OK; // the forced suffix itself was cut (a stop string inside it)
    // The suffix's last line and what the model wrote after it: to the end of that line, or the next
    // non-empty line when the rest of it is blank.
    size_t ls = at;
    while (ls > start && response[ls - 1] != '\n')
        ls--;
    size_t le = at + strcspn(response + at, "\n"), ts = at, te = le;
    int blank = 1;
    for (size_t i = at; i < le; i++)
        blank &= isspace((unsigned char)response[i]) != 0;
    if (blank && le < n) {
        ts = le + 1;
        while (ts < n && isspace((unsigned char)response[ts]))
            ts++;
        te = ts + strcspn(response + ts, "\n");
    }
    size_t hl = at - ls, tl = te > ts ? te - ts : 0;
    char *line = er_alloc(hl + tl + 2);
    if (!line)
        return er_error(ER_ENOMEM, "grade: out of memory extracting an answer");
    size_t k = hl;
    memcpy(line, response + ls, hl);
    if (ts != at)
        line[k++] = '\n';
    memcpy(line + k, response + ts, tl);
    line[k + tl] = 0;
    // A \boxed{}, "####" or "answer:" there ("Final answer: 36, ..."); else all the model wrote.
    int rc = ER_OK;
    ER_CHECK(grade_extract(line, out));
    if (!*out)
        rc = line_answer(rest_of_line(line + hl, 0, 1, out), out);
done:
    er_free(line);
    return rc;
}

int grade_answer(const char *response, long answer_at, int think_open, char **out) {
    *out = NULL;
    const char *open = strstr(response, GRADE_THINK_OPEN);
    if (!think_open && !open)
        return answer_from(response, 0, answer_at, out);
    // Inside a think block: only what follows its first close is the answer.
    const char *close = strstr(think_open ? response : open + strlen(GRADE_THINK_OPEN), GRADE_THINK_CLOSE);
    if (!close)
        return ER_OK;
    return answer_from(response, (size_t)(close - response) + strlen(GRADE_THINK_CLOSE), answer_at, out);
}

int grade_answer_correct(const char *answer, const char *gold) {
    if (!answer || !gold)
        return 0;
    // The gold answer read by the same rule: its \boxed{} or "#### X", and the leading number.
    char *g = NULL;
    int rc = ER_OK;
    if (strstr(gold, "\\boxed") || strstr(gold, "\\fbox") || strstr(gold, "####"))
        ER_CHECK(grade_extract(gold, &g));
    if (!g) {
        if (!(g = er_strdup(gold))) {
            rc = er_error(ER_ENOMEM, "grade: out of memory");
            goto done;
        }
        ER_CHECK(leading_number(&g));
    }
    rc = grade_equal(answer, g);
done:
    er_free(g);
    return rc;
}

int grade_response(const char *response, long answer_at, int think_open, const char *gold, int *unformatted) {
    char *ans;
    ER_TRY(grade_answer(response, answer_at, think_open, &ans));
    if (unformatted)
        *unformatted = ans == NULL;
    int eq = grade_answer_correct(ans, gold);
    er_free(ans);
    return eq;
}
