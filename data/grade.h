// Answer extraction and grading for GSM8K / MATH style problems and the synthetic tasks.
// Extraction takes, in this order of preference, the last \boxed{...} (nested braces; also \fbox and
// "\boxed 5"), the last "#### X", the last "Answer: X" / "Final answer: X" (case-insensitive; the rest
// of that line, or the next non-empty line when it is empty).
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

// The final answer in text as a new string (free with er_free); *out = NULL when the text has none.
// Returns ER_OK or ER_ENOMEM.
int grade_extract(const char *text, char **out);

// The normal form of an answer as a new string (free with er_free). Returns ER_OK or ER_ENOMEM.
int grade_normalize(const char *answer, char **out);

// 1 when the two answers are equivalent, 0 when not, negative on ER_ENOMEM.
int grade_equal(const char *a, const char *b);

// Grades a model response against a gold answer: 1 correct, 0 wrong or no answer found, negative
// on ER_ENOMEM. A gold string that itself holds a \boxed{} or "#### X" is reduced to that first.
int grade_response(const char *response, const char *gold);

// Parses a normalised numeric answer (decimal, a/b, \frac{a}{b}, optional sign); 1 on success.
int grade_parse_number(const char *normalized, double *out);

#endif
