// Answer extraction and grading for GSM8K / MATH style problems and the synthetic tasks. One rule,
// used alike by erinfer eval, the pipeline's vote, GRPO's reward and the heads' labels:
// - The answer, not the thinking, is graded. A response that begins inside a think block (the forced
//   response prefix opened one: grade_think_opens), or whose text contains "<think>", is read only
//   after the first "</think>" (after that "<think>"); one whose block never closes, or with no answer
//   after the close, has no answer (wrong, unformatted). A \boxed{} inside the thinking counts for
//   nothing, nor does a truncated "so the answer: 7. Wait...". The rules below apply to that part.
// - After a forced answer suffix (the hard budget forced "...Final answer: "), the answer is read
//   from the suffix's last line and what the model wrote after it up to the end of that line (the
//   next non-empty line when the rest of it is blank): a \boxed{}, "#### X" or "answer: X" there as
//   below, else all the model wrote there. Whatever follows that line is ignored: a model that runs
//   on ("Final answer: 36\nFinal answer: 41") is graded on what it answered when asked.
// - Otherwise, in this order of preference: the last \boxed{...} (nested braces; also \fbox and
//   "\boxed 5"), the last "#### X", the last "Answer: X" / "Final answer: X" (case-insensitive; the
//   rest of that line, or the next non-empty line when it is empty).
// - The leading-number rule, on every answer but a \boxed{} one: a number followed by other text
//   ("36, 36 + 5 = 43, 43 + 5 =", "18 apples", "7. Because ...") is that number, as lm-eval's strict
//   GSM8K regex reads "#### 36 ..."; an answer that is a number as a whole ("1,000", "x = 5", "3/4")
//   or does not start with one ("\frac{1}{2}", "(1, 2)", "2\sqrt{3}") stays whole. A list answer
//   "1, 2" therefore reads as 1.
// Normalisation (Hendrycks-MATH style, extended): surrounding $ and whitespace, trailing '.',
// \left / \right, units written "5\text{ cm}" (dropped), \dfrac / \tfrac -> \frac,
// \frac12 -> \frac{1}{2}, \sqrt2 -> \sqrt{2}, \text{} / \textbf{} / \mathrm{} / \mbox{} unwrapped,
// ^\circ and degree signs, \% and %, \$ and $, LaTeX spacing, all whitespace, thousands separators
// in plain numbers ("1,000", "1{,}000"), "x = 5" -> "5", integer "a/b" -> \frac{a}{b}, ".5" -> "0.5",
// trailing zeros after a decimal point ("17.0" -> "17").
// Two answers are equal when their normal forms are equal, or when both are numbers (decimal,
// a/b, \frac{a}{b}, with sign) that agree within a relative tolerance of 1e-6 (two integers must be
// equal exactly). Not recognised: scientific notation, mixed numbers, units outside \text{}.
#ifndef DATA_GRADE_H
#define DATA_GRADE_H

#define GRADE_THINK_OPEN "<think>"
#define GRADE_THINK_CLOSE "</think>"

// The think length L, the one length the hard budget bounds (GenConfig.budget: L <= B), GRPO's
// soft-barrier reward and erinfer eval's mean report: the tokens the model generates from after the
// forced response prefix through the token that completes the first GRADE_THINK_CLOSE of its output
// (forced budget-suffix tokens count as generated); a response that never closes it: all its generated
// tokens, a final EOS excluded. The engine computes it (GenSample.think_len).

// 1 when the response prefix leaves a think block open: it holds "<think>" with no "</think>" after it.
int grade_think_opens(const char *response_prefix);
// 1 when the response prefix closes a think block and opens none after it (a hybrid model's thinking-off
// prefix, "<think>\n\n</think>\n\n"): the response starts past the thinking, its think length is 0.
int grade_think_closes(const char *response_prefix);

// The final answer in text (no forced suffix) as a new string (free with er_free); *out = NULL when the
// text has none. Returns ER_OK or ER_ENOMEM.
int grade_extract(const char *text, char **out);

// The normal form of an answer as a new string (free with er_free). Returns ER_OK or ER_ENOMEM.
int grade_normalize(const char *answer, char **out);

// 1 when the two answers are equivalent, 0 when not, negative on ER_ENOMEM.
int grade_equal(const char *a, const char *b);

// The final answer of a generated response (free with er_free; NULL when none). answer_at >= 0: the
// byte offset in response where a forced answer suffix ended (GenSample.answer_at; used when it lies
// after the think block's close); < 0: none was forced. think_open: the response began inside a think
// block (grade_think_opens of its prefix). Returns ER_OK or ER_ENOMEM.
int grade_answer(const char *response, long answer_at, int think_open, char **out);

// 1 when an extracted answer equals the gold answer, read by the same rule (its \boxed{} or "#### X"
// when it holds one, and the leading-number rule), 0 when not or answer is NULL, < 0 on ER_ENOMEM.
int grade_answer_correct(const char *answer, const char *gold);

// Grades a model response (answer_at, think_open as in grade_answer) against a gold answer: 1 correct,
// 0 wrong or no answer found, negative on ER_ENOMEM (grade_answer, then grade_answer_correct).
// *unformatted (may be NULL) = 1 when no answer could be read (a think block never closed, nothing
// after its close, or no answer in the text), else 0.
int grade_response(const char *response, long answer_at, int think_open, const char *gold, int *unformatted);

// Parses a normalised numeric answer (decimal, a/b, \frac{a}{b}, optional sign); 1 on success.
int grade_parse_number(const char *normalized, double *out);

#endif
