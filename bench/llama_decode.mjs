// llama.cpp's decode speed (node-llama-cpp's prebuilt CPU binaries) for bench/run_llama.sh:
//   node bench/llama_decode.mjs MODEL.gguf THREADS PROMPT_TOKENS NEW_TOKENS N [N ...]
// For each N: N sequences in one context sharing one synthetic prompt (fixed pseudo-random ids below the
// special tokens, prefilled once) and each decoding NEW_TOKENS greedy tokens (EOS does not stop them), all N
// at once so llama.cpp batches them into one decode per step. Prints one JSON object:
//   {"llama_cpp": release, "rows": [{"n", "ttft_ms", "step_ms", "tokens_per_s_seq", "tokens_per_s_all"}]}
// ttft: start to the last sequence's first token (the prefill); step: the time from there to the last
// token divided by the NEW_TOKENS - 1 steps. KV cache f32 and flash attention off, like erinfer's f32 KV.
import {readFileSync} from "node:fs";
import {fileURLToPath} from "node:url";
import path from "node:path";

const here = path.dirname(fileURLToPath(import.meta.url));
const nlc = path.join(here, "..", "build", "node_modules", "node-llama-cpp");
const {getLlama} = await import(path.join(nlc, "dist", "index.js"));
const info = JSON.parse(readFileSync(path.join(nlc, "llama", "binariesGithubRelease.json"), "utf8"));

const [modelPath, threadsArg, promptArg, newArg, ...nsArg] = process.argv.slice(2);
const threads = Number(threadsArg), P = Number(promptArg), T = Number(newArg), Ns = nsArg.map(Number);
if (!modelPath || !(threads > 0) || !(P > 0) || !(T > 1) || Ns.length === 0 || Ns.some(n => !(n > 0))) {
    console.error("usage: node bench/llama_decode.mjs MODEL.gguf THREADS PROMPT_TOKENS NEW_TOKENS N [N ...]");
    process.exit(2);
}

const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath});
// 32-bit LCG: the same prompt on every run, ids below 151643 (Qwen's first special token).
let s = 12345;
const prompt = Array.from({length: P}, () => (s = (Math.imul(s, 1664525) + 1013904223) >>> 0) % 151643);

async function decodeRow(N, prompt, T) {
    const ctx = await model.createContext({
        contextSize: prompt.length + T, batchSize: 512, threads, sequences: N, flashAttention: false,
        experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
    });
    const seqs = Array.from({length: N}, () => ctx.getSequence());
    // One prefill, its KV copied to the other sequences (llama_memory_seq_cp through node-llama-cpp's
    // internal _copyStateFromOtherSequence), as erinfer shares the prompt among its N samples.
    const t0 = performance.now();
    await seqs[0].evaluateWithoutGeneratingNewTokens(prompt.slice(0, -1));
    for (const seq of seqs.slice(1))
        if (!await seq._copyStateFromOtherSequence(seqs[0], prompt.length - 1))
            throw new Error(`llama_decode: copying the prompt's KV to sequence ${seq.sequenceId} failed`);
    // Greedy: llama.cpp's cheapest sampler (an argmax; erinfer bench samples at temperature 1).
    const times = await Promise.all(seqs.map(async seq => {
        const t = [];
        for await (const _ of seq.evaluate(prompt.slice(-1), {temperature: 0, yieldEogToken: true})) {
            t.push(performance.now());
            if (t.length === T)
                break;
        }
        return t;
    }));
    await ctx.dispose();
    const first = Math.max(...times.map(t => t[0])), last = Math.max(...times.map(t => t[T - 1]));
    const step = (last - first) / (T - 1);
    return {n: N, ttft_ms: first - t0, step_ms: step, tokens_per_s_seq: 1e3 / step, tokens_per_s_all: 1e3 * N / step};
}

const rows = [];
await decodeRow(1, prompt.slice(0, 8), 2); // warm-up: pages the mapped weights in
for (const N of Ns)
    rows.push(await decodeRow(N, prompt, T));
console.log(JSON.stringify({llama_cpp: info.release, rows}));
await model.dispose();
await llama.dispose();
