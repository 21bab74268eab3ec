#include "core/args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

// A default text value as it would be typed: newlines and tabs escaped.
static void print_escaped(const char *t) {
    for (; *t; t++)
        if (*t == '\n' || *t == '\t' || *t == '\r' || *t == '\\')
            printf("\\%c", *t == '\n' ? 'n' : *t == '\t' ? 't' : *t == '\r' ? 'r' : '\\');
        else
            putchar(*t);
}

static void print_help(const ArgSpec *specs, int nspecs, const char *usage) {
    printf("usage: %s\n\n", usage);
    for (int i = 0; i < nspecs; i++) {
        const ArgSpec *s = &specs[i];
        const char *meta = s->type == ARG_STR ? " S" : s->type == ARG_TEXT ? " TEXT" : s->type == ARG_INT ? " N"
                           : s->type == ARG_FLOAT ? " X" : "";
        char lhs[64];
        snprintf(lhs, sizeof lhs, "--%s%s", s->name, meta);
        printf("  %-24s %s", lhs, s->help);
        if (s->required) {
            printf(" (required)");
        } else if (s->type == ARG_TEXT && *(const char **)s->dst) {
            printf(" [");
            print_escaped(*(const char **)s->dst);
            printf("]");
        } else if (s->type == ARG_STR && *(const char **)s->dst)
            printf(" [%s]", *(const char **)s->dst);
        else if (s->type == ARG_INT)
            printf(" [%d]", *(int *)s->dst);
        else if (s->type == ARG_FLOAT)
            printf(" [%g]", *(double *)s->dst);
        printf("\n");
    }
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

static void list_commands(FILE *out, const char *prog, const ArgCommand *cmds, int n) {
    fprintf(out, "usage: %s <command> [flags]   (%s <command> --help for its flags)\n\ncommands:\n", prog, prog);
    for (int i = 0; i < n; i++)
        fprintf(out, "  %-12s %s\n", cmds[i].name, cmds[i].help);
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
            return cmds[i].run(argc - 1, argv + 1);
    fprintf(stderr, "%s: unknown command \"%s\"\n", prog, argv[1]);
    list_commands(stderr, prog, cmds, n);
    return 1;
}
