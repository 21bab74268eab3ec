#include "core/args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#define HELP_WIDTH 120 // --help and the command lists fit a terminal of this many columns

// Prints text (several lines when it holds '\n'), starting at column col, cut at spaces so no line is longer
// than HELP_WIDTH; a line it cuts goes on after `indent` spaces. A word longer than a line is cut where it must.
static void print_wrapped(FILE *out, const char *text, int col, int indent) {
    const char *p = text;
    while (*p) {
        if (*p == '\n') {
            fputc('\n', out);
            p++;
            col = 0;
            continue;
        }
        const char *w = p; // the next word and the spaces before it
        while (*p == ' ')
            p++;
        const char *word = p;
        while (*p && *p != ' ' && *p != '\n')
            p++;
        int spaces = (int)(word - w), len = (int)(p - word);
        if (len == 0)
            continue;
        if (col > indent && col + spaces + len > HELP_WIDTH) {
            fprintf(out, "\n%*s", indent, "");
            col = indent, spaces = 0;
        }
        fprintf(out, "%*s", spaces, "");
        col += spaces;
        while (len > 0) {
            int room = HELP_WIDTH - col, n = len < room ? len : room;
            if (n <= 0) {
                fprintf(out, "\n%*s", indent, "");
                col = indent;
                continue;
            }
            fwrite(word, 1, (size_t)n, out);
            word += n, len -= n, col += n;
        }
    }
    fputc('\n', out);
}

// A default text value as it would be typed: newlines and tabs escaped.
static void append_escaped(char *buf, size_t cap, const char *t) {
    size_t k = strlen(buf);
    for (; *t && k + 3 < cap; t++)
        if (*t == '\n' || *t == '\t' || *t == '\r' || *t == '\\') {
            buf[k++] = '\\';
            buf[k++] = *t == '\n' ? 'n' : *t == '\t' ? 't' : *t == '\r' ? 'r' : '\\';
        } else {
            buf[k++] = *t;
        }
    buf[k] = 0;
}

// One flag's line: the flag, its help and its default (or "(required)"), wrapped under the help column.
static void print_flag(const ArgSpec *s) {
    const char *meta = s->type == ARG_STR ? " S" : s->type == ARG_TEXT ? " TEXT" : s->type == ARG_INT ? " N"
                       : s->type == ARG_FLOAT ? " X" : "";
    char lhs[64], line[4096];
    snprintf(lhs, sizeof lhs, "--%s%s", s->name, meta);
    int k = snprintf(line, sizeof line, "  %-24s %s", lhs, s->help);
    size_t at = k < 0 ? 0 : (size_t)k < sizeof line ? (size_t)k : sizeof line - 1;
    char *rest = line + at;
    size_t cap = sizeof line - at;
    if (s->required) {
        snprintf(rest, cap, " (required)");
    } else if (s->type == ARG_TEXT && *(const char **)s->dst) {
        snprintf(rest, cap, " [");
        append_escaped(line, sizeof line - 1, *(const char **)s->dst);
        strcat(line, "]");
    } else if (s->type == ARG_STR && *(const char **)s->dst)
        snprintf(rest, cap, " [%s]", *(const char **)s->dst);
    else if (s->type == ARG_INT)
        snprintf(rest, cap, " [%d]", *(int *)s->dst);
    else if (s->type == ARG_FLOAT)
        snprintf(rest, cap, " [%g]", *(double *)s->dst);
    print_wrapped(stdout, line, 0, 27);
}

static void print_help(const ArgSpec *specs, int nspecs, const char *usage) {
    fputs("usage: ", stdout);
    print_wrapped(stdout, usage, 7, 4);
    putchar('\n');
    for (int i = 0; i < nspecs; i++)
        print_flag(&specs[i]);
    printf("  %-24s %s\n", "--help", "show this help");
    for (int i = 0; i < nspecs; i++)
        if (specs[i].type == ARG_TEXT) {
            printf("\nTEXT values: \\n, \\t, \\r and \\\\ stand for a newline, a tab, a carriage return and a "
                   "backslash.\n");
            break;
        }
}

// \n \t \r \\ -> the characters, in place (the text only shrinks); other backslashes stay.
static void unescape(char *s) {
    char *o = s;
    for (; *s; s++) {
        if (s[0] == '\\' && (s[1] == 'n' || s[1] == 't' || s[1] == 'r' || s[1] == '\\')) {
            *o++ = s[1] == 'n' ? '\n' : s[1] == 't' ? '\t' : s[1] == 'r' ? '\r' : '\\';
            s++;
        } else {
            *o++ = *s;
        }
    }
    *o = 0;
}

static int set_value(const ArgSpec *s, char *v) {
    char *end;
    if (s->type == ARG_STR || s->type == ARG_TEXT) {
        if (s->type == ARG_TEXT)
            unescape(v);
        *(const char **)s->dst = v;
        return ER_OK;
    }
    errno = 0;
    double d = strtod(v, &end);
    if (end == v || *end || errno == ERANGE || !isfinite(d))
        return er_error(ER_EINVAL, "--%s: expected a number, got \"%s\"", s->name, v);
    if (s->type == ARG_INT && (d != floor(d) || fabs(d) > 2147483647.0))
        return er_error(ER_EINVAL, "--%s: expected an integer, got \"%s\"", s->name, v);
    if (s->min < s->max && (d < s->min || d > s->max))
        return er_error(ER_ERANGE, "--%s: %s is out of range [%g, %g]", s->name, v, s->min, s->max);
    if (s->type == ARG_INT)
        *(int *)s->dst = (int)d;
    else
        *(double *)s->dst = d;
    return ER_OK;
}

int args_parse(int argc, char **argv, const ArgSpec *specs, int nspecs, const char *usage) {
    int seen[128] = {0};
    if (nspecs > 128)
        return er_error(ER_EINVAL, "too many flags");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            print_help(specs, nspecs, usage);
            return ARGS_HELP;
        }
        if (strncmp(a, "--", 2) != 0)
            return er_error(ER_EINVAL, "unexpected argument \"%s\" (see --help)", a);
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        int k = -1;
        for (int j = 0; j < nspecs; j++)
            if (strlen(specs[j].name) == nlen && strncmp(specs[j].name, name, nlen) == 0)
                k = j;
        if (k < 0)
            return er_error(ER_EINVAL, "unknown flag \"--%.*s\" (see --help)", (int)nlen, name);
        const ArgSpec *s = &specs[k];
        if (s->type == ARG_FLAG) {
            if (eq)
                return er_error(ER_EINVAL, "--%s takes no value", s->name);
            *(int *)s->dst = 1;
        } else {
            char *v = eq ? argv[i] + (eq - a) + 1 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v)
                return er_error(ER_EINVAL, "--%s needs a value", s->name);
            ER_TRY(set_value(s, v));
        }
        seen[k] = 1;
    }
    for (int j = 0; j < nspecs; j++)
        if (specs[j].required && !seen[j])
            return er_error(ER_EINVAL, "missing required flag --%s (see --help)", specs[j].name);
    return ER_OK;
}

const char *args_error_text(const char *cmd, const char *msg) {
    const char *last = strrchr(cmd, ' ');
    last = last ? last + 1 : cmd;
    size_t n = strlen(last);
    if (strncmp(msg, last, n) == 0 && msg[n] == ':' && msg[n + 1] == ' ')
        return msg + n + 2;
    return msg;
}

int args_check_stdout(const char *prog, const char *cmd, int status) {
    errno = 0;
    int bad = fflush(stdout) != 0, e = errno;
    bad |= ferror(stdout);
    if (!bad || status != 0) // a failed command has said what went wrong already
        return status;
    fprintf(stderr, "%s %s: stdout: write failed: %s\n", prog, cmd, e ? strerror(e) : "output error");
    return 1;
}

static void list_commands(FILE *out, const char *prog, const ArgCommand *cmds, int n) {
    fprintf(out, "usage: %s <command> [flags]   (%s <command> --help for its flags)\n\ncommands:\n", prog, prog);
    for (int i = 0; i < n; i++) {
        char line[1024];
        snprintf(line, sizeof line, "  %-12s %s", cmds[i].name, cmds[i].help);
        print_wrapped(out, line, 0, 15);
    }
}

int args_dispatch(const char *prog, const ArgCommand *cmds, int n, int argc, char **argv) {
    if (argc < 2) {
        list_commands(stderr, prog, cmds, n);
        return 1;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        list_commands(stdout, prog, cmds, n);
        return 0;
    }
    for (int i = 0; i < n; i++)
        if (strcmp(argv[1], cmds[i].name) == 0)
            return args_check_stdout(prog, cmds[i].name, cmds[i].run(argc - 1, argv + 1));
    fflush(stdout);
    fprintf(stderr, "%s: unknown command \"%s\"\n", prog, argv[1]);
    list_commands(stderr, prog, cmds, n);
    return 1;
}
