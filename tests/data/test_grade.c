// Answer extraction and grading on GSM8K- and MATH-style solutions: every gold answer grades correct
// against its own solution, every perturbed answer grades wrong.
#include <criterion/criterion.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/grade.h"

#include <cjson/cJSON.h>
#include <stdio.h>

typedef struct {
    const char *solution, *gold, *wrong;
} Case;

static const Case cases[] = {
    // GSM8K reference solutions (calculator annotations and "#### N").
    {"Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in April "
     "and May.\n#### 72",
     "72", "Natalia sold 48+25 = 73 clips.\n#### 73"},
    {"Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = $<<0.2*50=10>>10.\n"
     "#### 10",
     "10", "#### 10.5"},
    {"In the beginning, Betty has only 100 / 2 = $<<100/2=50>>50.\nBetty's grandparents gave her 15 * 2 = "
     "$<<15*2=30>>30.\nThis means, Betty needs 100 - 50 - 30 - 15 = $<<100-50-30-15=5>>5 more.\n#### 5",
     "5", "#### 50"},
    {"Maila read 12 x 2 = <<12*2=24>>24 pages today.\nSo she was able to read a total of 12 + 24 = <<12+24=36>>36 pages "
     "since yesterday.\nThere are 120 - 36 = <<120-36=84>>84 pages left to be read.\nSince she wants to read half of "
     "the remaining pages tomorrow, then she should read 84/2 = <<84/2=42>>42 pages.\n#### 42",
     "42", "#### 84"},
    {"He writes each friend 3*2=<<3*2=6>>6 pages a week\nSo he writes 6*2=<<6*2=12>>12 pages every week\nThat means "
     "he writes 12*52=<<12*52=624>>624 pages a year\n#### 624",
     "624", "#### 642"},
    {"Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day at the "
     "farmer\xe2\x80\x99s market.\n#### 18",
     "18", "#### -18"},
    {"It takes 2/2=<<2/2=1>>1 bolt of white fiber\nSo the total amount of fabric is 2+1=<<2+1=3>>3 bolts of fabric\n"
     "#### 3",
     "3", "#### 3/2"},
    {"The cost of the house and repairs came out to 80,000+50,000=$<<80000+50000=130000>>130,000\nHe increased the "
     "value of the house by 80,000*1.5=<<80000*1.5=120000>>120,000\nSo the new value of the house is "
     "120,000+80,000=$<<120000+80000=200000>>200,000\nSo he made a profit of 200,000-130,000=$<<200000-130000=70000>>"
     "70,000\n#### 70000",
     "70000", "#### 7000"},
    {"He sprints 3*3=<<3*3=9>>9 times\nSo he runs 9*60=<<9*60=540>>540 meters\n#### 540", "540", "#### 54"},
    {"Each box holds 25 * 48 = 1,200 pencils in total.\n#### 1,200", "1200", "#### 1,020"},
    // GSM8K-style model outputs.
    {"She makes 9 * 2 = 18 dollars a day.\nFinal answer: $18", "18", "Final answer: $81"},
    {"He writes 624 pages a year.\n\n**Answer:** 624", "624", "**Answer:** 625"},
    {"Half of 84 is 42.\nAnswer:\n42.", "42", "Answer:\n24."},
    {"First 12 + 5 = 17. ANSWER: 17 apples", "17 apples", "ANSWER: 71 apples"},
    // MATH reference solutions (final answer in \boxed{}).
    {"We have that $r = \\sqrt{0^2 + 3^2} = 3.$  Also, if we draw the line connecting the origin and $(0,3),$ this line "
     "makes an angle of $\\frac{\\pi}{2}$ with the positive $x$-axis.\n\nTherefore, the polar coordinates are "
     "$\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$",
     "\\left( 3, \\frac{\\pi}{2} \\right)", "$\\boxed{\\left( \\frac{\\pi}{2}, 3 \\right)}$"},
    {"We count the number of times $\\frac{1}{n^3}$ appears in the sum ... so the sum is equal to $\\boxed{p - q}.$",
     "p - q", "$\\boxed{q - p}$"},
    {"$f(-2) +f(-1)+f(0)=\\frac{3(-2)-2}{-2-2}+\\frac{3(-1)-2}{-1-2}+\\frac{3(0)-2}{0-2}=\\frac{-8}{-4}+\\frac{-5}{-3}+"
     "\\frac{-2}{-2}=2+\\frac{5}{3}+1=\\boxed{\\frac{14}{3}}$",
     "\\frac{14}{3}", "$\\boxed{\\frac{13}{3}}$"},
    {"First prime factorize $196=2^2\\cdot7^2$.  The prime factorization of any divisor of 196 cannot include any primes "
     "other than 2 and 7.  ... there are $(2+1)(2+1)=\\boxed{9}$ factors of 196.",
     "9", "the count is $\\boxed{6}$"},
    {"Evelyn covered more distance in less time than Briana, Debra and Angela, so her average speed is greater than any "
     "of their average speeds. ... so the answer is $\\boxed{\\text{Evelyn}}.$",
     "\\text{Evelyn}", "so the answer is $\\boxed{\\text{Carla}}.$"},
    {"The side length of the hexagon is equal to the side length of one of the equilateral triangles. Since the "
     "hexagon has six sides, the perimeter is $6 \\cdot 7 = \\boxed{42}$ inches.",
     "42", "$\\boxed{21}$ inches"},
    {"The sum of three consecutive integers takes the form $(k-1)+(k)+(k+1)=3k$ ... The smallest positive perfect "
     "cube that is a multiple of 3 is $3^3=\\boxed{27}$.",
     "27", "$\\boxed{8}$"},
    {"The angles of a triangle sum to $180^\\circ$, so the remaining angle is $\\boxed{90^\\circ}$.", "90^\\circ",
     "$\\boxed{45^\\circ}$"},
    {"Hence the probability is $\\boxed{\\dfrac{1}{3}}$.", "\\frac13", "$\\boxed{\\dfrac{3}{1}}$"},
    {"The price went up by $\\boxed{10\\%}$.", "10", "$\\boxed{1\\%}$"},
    {"Solving gives $\\boxed{x = 5}$.", "5", "$\\boxed{x = -5}$"},
    {"After ten years she has $\\$32,\\!348$ in the account, i.e. $\\boxed{\\$32,\\!348}$.", "\\$32,348",
     "$\\boxed{\\$32,\\!384}$"},
    {"The inequality holds exactly for $x \\in \\boxed{(-\\infty, 2) \\cup (3, \\infty)}$.",
     "(-\\infty,2)\\cup(3,\\infty)", "$\\boxed{(-\\infty, 2] \\cup [3, \\infty)}$"},
    {"So the distance is $\\boxed{\\sqrt{2}}$.", "\\sqrt2", "$\\boxed{\\sqrt{3}}$"},
    {"Thus $AB = \\boxed{3\\sqrt{13}}$.", "3\\sqrt{13}", "$\\boxed{3\\sqrt{31}}$"},
    {"The projection is $\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}.$", "\\begin{pmatrix}1\\\\2\\end{pmatrix}",
     "$\\boxed{\\begin{pmatrix} 2 \\\\ 1 \\end{pmatrix}}$"},
    {"Only choice (C) works, so the answer is $\\boxed{\\text{(C)}}$.", "\\text{(C)}", "$\\boxed{\\text{(D)}}$"},
    {"The ratio is $\\boxed{0.5}$.", "\\frac{1}{2}", "$\\boxed{0.55}$"},
    {"The final answer is $\\boxed{2.50}$", "2.5", "The final answer is $\\boxed{2.05}$"},
    {"Therefore $m = \\boxed{-\\frac{2}{3}}$.", "-2/3", "$\\boxed{\\frac{2}{3}}$"},
    {"so $\\cos 30^\\circ = \\boxed{\\frac{\\sqrt{3}}{2}}$", "\\frac{\\sqrt3}{2}", "$\\boxed{\\frac{\\sqrt{2}}{2}}$"},
    {"We first try $\\boxed{4}$, which fails. Checking again, the answer is $\\boxed{12}$.", "12", "$\\boxed{4}$"},
};

Test(grade, real_solutions_grade_correct_and_perturbations_wrong) {
    int n = (int)(sizeof cases / sizeof cases[0]);
    cr_assert_geq(n, 30);
    for (int i = 0; i < n; i++) {
        int ok = grade_response(cases[i].solution, -1, 0, cases[i].gold, NULL);
        char *got = NULL;
        grade_extract(cases[i].solution, &got);
        cr_assert_eq(ok, 1, "case %d: gold \"%s\" vs extracted \"%s\"", i, cases[i].gold, got ? got : "(none)");
        er_free(got);
        cr_assert_eq(grade_response(cases[i].wrong, -1, 0, cases[i].gold, NULL), 0,
                     "case %d: perturbed \"%s\" graded correct", i,
                     cases[i].wrong);
        // The gold answer against the other cases' answers: nothing is equal by accident.
        int j = (i + 1) % n;
        if (strcmp(cases[i].gold, cases[j].gold) != 0)
            cr_assert_eq(grade_equal(cases[i].gold, cases[j].gold), 0, "case %d vs %d", i, j);
    }
}

static void expect_extract(const char *text, const char *want) {
    char *got;
    cr_assert_eq(grade_extract(text, &got), ER_OK);
    if (!want) {
        cr_assert_null(got, "extracted \"%s\" from \"%s\"", got, text);
        return;
    }
    cr_assert_not_null(got, "nothing extracted from \"%s\"", text);
    cr_assert_str_eq(got, want, "from \"%s\"", text);
    er_free(got);
}

Test(grade, extraction_rules) {
    expect_extract("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}");
    expect_extract("a \\boxed{1} then \\boxed{2} end", "2");
    expect_extract("set $\\boxed{\\{1, 2\\}}$", "\\{1, 2\\}");
    expect_extract("so \\boxed 7$ ok", "7");
    expect_extract("\\fbox{3}", "3");
    expect_extract("\\boxed{5} earlier, then unbalanced \\boxed{12 end", "5");
    expect_extract("Answer: 3\n#### 4", "4");                 // #### outranks Answer:
    expect_extract("#### 4\nAnswer: 3\n\\boxed{5}", "5");     // \boxed outranks both
    expect_extract("answer: 1\nFinal Answer: 2\n", "2");      // last occurrence, any case
    expect_extract("The answer: 1\nfinal answer:   \n\n 9 \n", "9");
    expect_extract("#### 12,345 \n", "12,345");
    expect_extract("no final answer here", NULL);
    expect_extract("Answer:", NULL);
    expect_extract("", NULL);
}

typedef struct {
    const char *a, *b;
    int eq;
} Pair;

Test(grade, normalisation_and_numeric_equality) {
    static const Pair pairs[] = {
        {"\\dfrac{1}{2}", "\\frac12", 1},   {"\\tfrac{1}{2}", "1/2", 1},         {"0.5", "\\frac{1}{2}", 1},
        {"1,000", "1000", 1},               {"1{,}000", "1000", 1},              {"1,234,567.50", "1234567.5", 1},
        {"$18", "18", 1},                   {"\\$18.00", "18", 1},               {"10\\%", "10", 1},
        {"10%", "10", 1},                   {"90^\\circ", "90", 1},              {"90^{\\circ}", "90", 1},
        {"\\text{(C)}", "(C)", 1},          {"\\textbf{yes}", "yes", 1},         {"17.0", "17", 1},
        {"17.000", "17", 1},                {".5", "0.5", 1},                    {"-.5", "-1/2", 1},
        {"x = 5", "5", 1},                  {"  42.  ", "42", 1},                {"\\left( 1, 2 \\right)", "(1,2)", 1},
        {"\xe2\x88\x92 3", "-3", 1},        {"+7", "7", 1},                      {"0.333333333333", "1/3", 1},
        {"007", "7", 1},                    {"5\\text{ cm}", "5", 1},          {"\\text{ cm}", "cm", 1},
        {"1,2", "12", 0},                   {"(1,2)", "(2,1)", 0},
        {"3", "-3", 0},                     {"100", "1000", 0},                  {"\\frac{1}{3}", "0.33", 0},
        {"1,23", "123", 0},                 {"x+1", "x-1", 0},                   {"", "", 0},
        {"2", "", 0},                       {"\\sqrt{2}", "2", 0},               {"1/0", "0", 0},
        {"\\rightarrow", "arrow", 0},       {"12345.6", "12345.7", 0},           {"1000000", "1000001", 0},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
        cr_assert_eq(grade_equal(pairs[i].a, pairs[i].b), pairs[i].eq, "\"%s\" vs \"%s\" should be %s", pairs[i].a,
                     pairs[i].b, pairs[i].eq ? "equal" : "different");
    char *s;
    cr_assert_eq(grade_normalize(" \\left( 3, \\dfrac{\\pi}{2} \\right). ", &s), ER_OK);
    cr_assert_str_eq(s, "(3,\\frac{\\pi}{2})");
    er_free(s);
    double x;
    cr_assert(grade_parse_number("-\\frac{3}{4}", &x));
    cr_assert_float_eq(x, -0.75, 1e-12);
    cr_assert(!grade_parse_number("\\frac{3}{0}", &x));
    cr_assert(!grade_parse_number("nan", &x));
    cr_assert(!grade_parse_number("0x10", &x));
}

// Malformed LaTeX and random bytes must never crash or loop (run under ASan in `make SAN=1`).
Test(grade, garbage_never_crashes) {
    static const char *odd[] = {"\\boxed{", "\\boxed{}}", "}}}{{{", "\\frac", "\\frac{", "\\frac{1}{", "\\sqrt",
                                "\\text{", "\\left", "####", "#### ", "Answer:**", "$$$", "\\", "x==5", "=5",
                                "1,", ",000", "-", "+", ".", "\\frac{1}{2}{3}", "\\boxed\\boxed{1}"};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        char *s;
        cr_assert_eq(grade_normalize(odd[i], &s), ER_OK);
        er_free(s);
        cr_assert_geq(grade_response(odd[i], -1, 0, odd[i], NULL), 0);
        cr_assert_geq(grade_equal(odd[i], "1"), 0);
    }
    ErRng rng;
    rng_seed(&rng, 7);
    static const char alphabet[] = "\\{}$#0123456789.,/-+ :abfrcxtedAnswer%^\n";
    char buf[64];
    for (int t = 0; t < 3000; t++) {
        int n = (int)rng_below(&rng, 63);
        for (int i = 0; i < n; i++)
            buf[i] = alphabet[rng_below(&rng, sizeof alphabet - 1)];
        buf[n] = 0;
        int r = grade_response(buf, -1, 0, buf, NULL);
        cr_assert(r == 0 || r == 1, "\"%s\" -> %d", buf, r);
    }
}

static void expect_answer(const char *text, long answer_at, const char *want) {
    char *got;
    cr_assert_eq(grade_answer(text, answer_at, 0, &got), ER_OK);
    if (!want) {
        cr_assert_null(got, "read \"%s\" from \"%s\" (at %ld)", got, text, answer_at);
        return;
    }
    cr_assert_not_null(got, "nothing read from \"%s\" (at %ld)", text, answer_at);
    cr_assert_str_eq(got, want, "from \"%s\" (at %ld)", text, answer_at);
    er_free(got);
}

#define FORCED "reasoning 4 + 5 =\n</think>\n\nFinal answer: "

// After a forced suffix the answer is on the suffix's line; a leading number followed by other
// text is that number; answers that are numbers as a whole, or are not numbers, stay whole.
Test(grade, forced_answer_and_leading_number_rules) {
    long at = (long)strlen(FORCED);
    expect_answer(FORCED "36, 36 + 5 = 43, 43 + 5 =", at, "36");
    expect_answer(FORCED "36\nFinal answer: 41", at, "36");         // what it answered when asked
    expect_answer(FORCED "36\nFinal answer: 41", -1, "41");         // no suffix forced: the last one
    expect_answer(FORCED "\n\n  7 apples\nAnswer: 8", at, "7");     // blank rest of line: the next line
    expect_answer(FORCED "\\boxed{12} and more", at, "12");
    expect_answer(FORCED "the result", at, "the result");
    expect_answer(FORCED, at, NULL);
    expect_answer("reasoning \\boxed{12}x", (long)strlen("reasoning \\boxed{12}"), "12"); // suffix holding it
    expect_answer("cut before the suffix ended", 999, NULL);
    // The leading-number rule in the unforced forms too.
    expect_answer("Answer: 18 apples", -1, "18");
    expect_answer("Answer: 7. Because 3 + 4 = 7.", -1, "7");
    expect_answer("#### 1,000 dollars", -1, "1,000");
    expect_answer("Answer: -5 degrees", -1, "-5");
    expect_answer("Answer: $18 in total", -1, "$18");
    expect_answer("Answer: 50% of them", -1, "50%");
    expect_answer("Answer: 1,000", -1, "1,000");
    expect_answer("Answer: x = 5", -1, "x = 5");
    expect_answer("Answer: 3/4", -1, "3/4");
    expect_answer("Answer: 2\\sqrt{3}", -1, "2\\sqrt{3}");
    expect_answer("Answer: (1, 2)", -1, "(1, 2)");
    expect_answer("Answer: 3x + 1", -1, "3x + 1");
    // The gold answer is read by the same rule.
    cr_assert_eq(grade_answer_correct("17", "17 apples"), 1);
    cr_assert_eq(grade_answer_correct("17", "#### 17 apples"), 1);
    cr_assert_eq(grade_response(FORCED "36, 36 + 5 = 41", at, 0, "36", NULL), 1);
    cr_assert_eq(grade_response(FORCED "36, 36 + 5 = 41", at, 0, "41", NULL), 0);
}

// Outputs sampled from models/tiny-base with a masked SFT adapter (verbose traces, 150 steps, T = 0.8,
// hard budgets of 16, 24 and 40 tokens; erinfer eval --output, which records answer_at): run-on
// answers after the forced suffix ("Final answer: 9 / 2 = 3, 3 - 2 ="), later restatements, and
// samples that finished on their own. Each reads as the answer recorded beside it.
Test(grade, real_sampled_outputs) {
    FILE *fp = fopen("tests/data/golden/sampled_answers.jsonl", "rb");
    cr_assert(fp, "tests/data/golden/sampled_answers.jsonl is missing");
    char line[8192];
    int n = 0, runon = 0;
    while (fgets(line, sizeof line, fp)) {
        cJSON *j = cJSON_Parse(line);
        cr_assert(j, "line %d is not JSON", n + 1);
        const cJSON *t = cJSON_GetObjectItem(j, "text"), *a = cJSON_GetObjectItem(j, "answer_at");
        const cJSON *want = cJSON_GetObjectItem(j, "answer");
        long at = cJSON_IsNumber(a) ? (long)a->valuedouble : -1;
        char *got;
        cr_assert_eq(grade_answer(t->valuestring, at, 0, &got), ER_OK);
        cr_assert(got && grade_equal(got, want->valuestring) == 1, "line %d: read \"%s\", want \"%s\" from \"%s\"",
                  n + 1, got ? got : "(none)", want->valuestring, t->valuestring);
        runon += at >= 0 && strchr(t->valuestring + at, ',') != NULL;
        er_free(got);
        cJSON_Delete(j);
        n++;
    }
    fclose(fp);
    cr_assert_geq(n, 15);
    cr_assert_gt(runon, 0, "no sample shows a run-on answer");
}

// The answer, not the thinking: inside a think block (opened by the forced prefix, or by the response's
// own "<think>") only what follows the first "</think>" is read. A block that never closes, or nothing
// after its close, gives no answer: wrong and unformatted.
Test(grade, answer_after_the_think_block) {
    int unf = -1;
    const char *cut = "Let me add 3 and 4, so the answer: 7. Wait...";
    cr_assert_eq(grade_response(cut, -1, 1, "7", &unf), 0, "a truncated thought is not an answer");
    cr_assert_eq(unf, 1);
    unf = -1;
    cr_assert_eq(grade_response("<think>\nso the answer: 7. Wait...", -1, 0, "7", &unf), 0);
    cr_assert_eq(unf, 1, "the response's own <think> opens the block");
    char *got;
    cr_assert_eq(grade_answer(cut, -1, 1, &got), ER_OK);
    cr_assert_null(got, "read \"%s\" from an unclosed think block", got);

    const char *late = "First try \\boxed{14}. No, 7 + 8 = 15.\n</think>\n\nFinal answer: 15";
    unf = -1;
    cr_assert_eq(grade_response(late, -1, 1, "15", &unf), 1, "the answer after </think> is graded");
    cr_assert_eq(unf, 0);
    cr_assert_eq(grade_response(late, -1, 1, "14", &unf), 0, "a \\boxed{} in the thinking counts for nothing");
    cr_assert_eq(grade_answer(late, -1, 1, &got), ER_OK);
    cr_assert_str_eq(got, "15");
    er_free(got);

    unf = -1;
    cr_assert_eq(grade_response("<think>\nAnswer: 5\n</think>\n\n", -1, 0, "5", &unf), 0);
    cr_assert_eq(unf, 1, "a closed block with nothing after it is unformatted");
    unf = -1;
    cr_assert_eq(grade_response("the answer: 5 </think>", -1, 1, "5", &unf), 0);
    cr_assert_eq(unf, 1);

    // The forced suffix closes the block: its answer rule applies after the close.
    long at = (long)strlen(FORCED);
    cr_assert_eq(grade_response(FORCED "36, 36 + 5 = 41", at, 1, "36", &unf), 1);
    cr_assert_eq(unf, 0);
    // Without a think block the whole text is read, as before; no answer there is unformatted too.
    cr_assert_eq(grade_response("so the answer: 7. Wait...", -1, 0, "7", &unf), 1);
    cr_assert_eq(unf, 0);
    cr_assert_eq(grade_response("no number here", -1, 0, "7", &unf), 0);
    cr_assert_eq(unf, 1);
    cr_assert_eq(grade_response(late, -1, 1, "15", NULL), 1, "unformatted may be NULL");
}

Test(grade, think_opens) {
    cr_assert_eq(grade_think_opens("<think>\n"), 1);
    cr_assert_eq(grade_think_opens("Sure. <think>"), 1);
    cr_assert_eq(grade_think_opens("<think>\n</think>\n\n"), 0, "an empty think block is closed");
    cr_assert_eq(grade_think_opens("<think></think><think>"), 1);
    cr_assert_eq(grade_think_opens("Answer: "), 0);
    cr_assert_eq(grade_think_opens(""), 0);
    cr_assert_eq(grade_think_opens(NULL), 0);
}
