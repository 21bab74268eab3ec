// Runs real llama.cpp (node-llama-cpp's prebuilt binaries, CPU) on a job for the GGUF comparison tests:
//   node scripts/llama_cpp.mjs JOB.json OUT.json
// JOB: {"model": FILE.gguf, "lora": FILE.gguf | null, "lora_scale": 1, "threads": 1,
//       "generate": [{"prompt": [ids], "n": 32}, ...],   greedy continuation (temperature 0)
//       "score": [[ids], ...],                           p(ids[i+1] | ids[..i]) for every i, from llama.cpp's
//                                                        logits and its sum of exp over the vocabulary
//       "tokenize": ["text", ...]}                       llama.cpp's tokenizer, special tokens parsed
// OUT: {"generate": [{"tokens": [...], "probs": [...]}] (probs: llama.cpp's confidence in each pick),
//       "score": [[p, ...]], "tokenize": [[ids]],
//       "llama_cpp": release tag}
// The KV cache is f32 (llama.cpp's default f16 would round keys and values) and flash attention is off,
// so an f32 model runs in f32 throughout.
import {readFileSync, writeFileSync} from "node:fs";
import {createRequire} from "node:module";
import {fileURLToPath} from "node:url";
import path from "node:path";

const here = path.dirname(fileURLToPath(import.meta.url));
const nlc = path.join(here, "..", "build", "node_modules", "node-llama-cpp");
const {getLlama} = await import(path.join(nlc, "dist", "index.js"));
const info = JSON.parse(readFileSync(path.join(nlc, "llama", "binariesGithubRelease.json"), "utf8"));

const job = JSON.parse(readFileSync(process.argv[2], "utf8"));
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath: job.model});
const ctxOptions = {
    contextSize: 512, batchSize: 512, threads: job.threads || 1, sequences: 1, flashAttention: false,
    experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
};
if (job.lora)
    ctxOptions.lora = {adapters: [{filePath: job.lora, scale: job.lora_scale ?? 1}]};
const ctx = await model.createContext(ctxOptions);
const seq = ctx.getSequence(); // one sequence, its history cleared before each item

async function generate(prompt, n) {
    await seq.clearHistory();
    const tokens = [], probs = [];
    for await (const r of seq.evaluateWithMetadata(prompt, {confidence: true}, {temperature: 0})) {
        tokens.push(r.token);
        probs.push(r.confidence);
        if (tokens.length === n)
            break;
    }
    return {tokens, probs};
}

// p(next) = exp(logit(next) - max logit) / sum exp(logit - max logit), from llama.cpp's raw logits and its
// sum over the whole vocabulary (totalLogitWeight): the full distribution never crosses into JavaScript.
async function score(ids) {
    await seq.clearHistory();
    const input = ids.slice(0, -1).map((t, i) => [t, {generateNext: {
        logits: {filter: {tokens: [ids[i + 1]], includeTop: 1}}, totalLogitWeight: true}}]);
    const res = await seq.controlledEvaluate(input);
    return res.map((r, i) => {
        const l = r.next.logits, max = Math.max(...l.values());
        return Math.exp(l.get(ids[i + 1]) - max) / r.next.totalLogitWeight;
    });
}

const out = {llama_cpp: info.release, generate: [], score: [], tokenize: []};
for (const g of job.generate || [])
    out.generate.push(await generate(g.prompt, g.n));
for (const s of job.score || [])
    out.score.push(await score(s));
for (const t of job.tokenize || [])
    out.tokenize.push(Array.from(model.tokenize(t, true)));
writeFileSync(process.argv[3], JSON.stringify(out));
await ctx.dispose();
await model.dispose();
await llama.dispose();
