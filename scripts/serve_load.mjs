// A bounded load test of erinfer serve on localhost (node's own http, no package):
//   node scripts/serve_load.mjs BASE_URL SERVER_PID [CLIENTS=64] [ROUNDS=20] [API_KEY] [RSS_GROWTH_MIB=8|off]
// CLIENTS concurrent clients each send one request per round, ROUNDS rounds: streaming chat requests,
// and every fifth round of each client a malformed one (bad JSON, a body over the limit, wrong types,
// an unknown field, 10k-deep nesting) that must get a 4xx while the others keep streaming. Every
// stream must be complete (finish chunk, usage, [DONE]); the server's RSS is read after each round and
// must not grow by more than RSS_GROWTH_MIB after the first rounds (no leak; "off" under ASan, whose
// quarantine holds freed memory: there LeakSanitizer at the server's exit is the leak check). Prints p50/p99
// latency, tokens/s and the RSS. With SAVED_IDS=FILE (a server with --memory), every streamed request asks for its
// conversation to be saved ("memory": {"save": true}); the entry ids the final chunks report must be distinct, and
// are written to FILE, one per line, for the caller to find in the store.
import http from "node:http";
import fs from "node:fs";

const [base, pid, clientsArg, roundsArg, apiKey, growthArg] = process.argv.slice(2);
const CLIENTS = Number(clientsArg ?? 64), ROUNDS = Number(roundsArg ?? 20);
const url = new URL(base);
const agent = new http.Agent({ keepAlive: true, maxSockets: CLIENTS });

function post(path, body) {
  return new Promise((resolve, reject) => {
    const headers = { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body) };
    if (apiKey && apiKey !== "none") headers.Authorization = `Bearer ${apiKey}`;
    const req = http.request({ host: url.hostname, port: url.port, path, method: "POST", headers, agent }, (res) => {
      const parts = [];
      res.on("data", (d) => parts.push(d));
      res.on("end", () => resolve({ status: res.statusCode, text: Buffer.concat(parts).toString("utf8") }));
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end(body);
  });
}

const deep = "[".repeat(10000) + "]".repeat(10000);
const malformed = [
  '{"messages": [{"role": "user", "content": "hi"}',                     // bad JSON
  JSON.stringify({ messages: [{ role: "user", content: "x".repeat(2 << 20) }] }), // over the 1 MiB limit
  JSON.stringify({ messages: [{ role: "user", content: "hi" }], max_tokens: "many" }), // wrong type
  JSON.stringify({ messages: [{ role: "user", content: "hi" }], colour: "blue" }),     // unknown field
  `{"messages": [{"role": "user", "content": "hi"}], "x": ${deep}}`,       // 10k-deep nesting
];

function rss() {
  const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) / 1024 : NaN;
}

const savedFile = process.env.SAVED_IDS;
const saved = [];
const latencies = [];
let tokens = 0, failures = 0, bad4xx = 0;
function fail(what) {
  if (failures++ < 10) console.error(`serve_load: FAILED: ${what}`);
}

async function one(client, round) {
  if (round % 5 === 4) {
    const kind = (client + round) % malformed.length;
    const r = await post("/v1/chat/completions", malformed[kind]);
    if (r.status >= 400 && r.status < 500 && JSON.parse(r.text).error) bad4xx++;
    else fail(`malformed request ${kind} got ${r.status}`);
    return;
  }
  const body = JSON.stringify({ messages: [{ role: "system", content: "You are terse." },
                                           { role: "user", content: `Client ${client} asks question ${round}.` }],
                                max_tokens: 16, temperature: 0.8, seed: client * 1000 + round, stream: true,
                                stream_options: { include_usage: true }, ...(savedFile && { memory: { save: true } }) });
  const t0 = performance.now();
  const r = await post("/v1/chat/completions", body);
  const events = r.text.split("\n\n").filter((e) => e.startsWith("data: ")).map((e) => e.slice(6));
  if (r.status !== 200 || events[events.length - 1] !== "[DONE]") return fail(`stream ${client}/${round}: ${r.status}`);
  const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
  const usage = chunks.find((c) => c.usage)?.usage;
  if (!usage || !chunks.some((c) => c.choices.some((ch) => ch.finish_reason)))
    return fail(`stream ${client}/${round} is incomplete`);
  if (savedFile) {
    const id = chunks.find((c) => c.erinfer?.memory)?.erinfer.memory.saved;
    if (!Number.isInteger(id)) return fail(`stream ${client}/${round}: no saved entry id`);
    saved.push(id);
  }
  latencies.push(performance.now() - t0);
  tokens += usage.completion_tokens;
}

const t0 = performance.now();
const rssAfter = [];
for (let round = 0; round < ROUNDS; round++) {
  await Promise.all(Array.from({ length: CLIENTS }, (_, c) => one(c, round).catch((e) => fail(String(e)))));
  rssAfter.push(rss());
}
const wall = (performance.now() - t0) / 1000;
latencies.sort((a, b) => a - b);
const q = (p) => latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))];
const warm = Math.min(4, ROUNDS - 1);
const growth = rssAfter[ROUNDS - 1] - rssAfter[warm];
console.log(`serve_load: ${CLIENTS} clients x ${ROUNDS} rounds: ${latencies.length} streams complete, ${bad4xx} ` +
            `malformed requests refused with 4xx, ${failures} failures`);
console.log(`serve_load: latency p50 ${q(0.5).toFixed(1)} ms, p99 ${q(0.99).toFixed(1)} ms; ` +
            `${(tokens / wall).toFixed(0)} tokens/s (${tokens} tokens in ${wall.toFixed(1)} s)`);
console.log(`serve_load: RSS MiB by round: ${rssAfter.map((x) => x.toFixed(1)).join(" ")}`);
// Allocator arenas settle in the first rounds; after that, a leak would grow with every request.
if (growthArg !== "off" && growth > Number(growthArg ?? 8)) fail(`RSS grew ${growth.toFixed(1)} MiB between round ${warm + 1} and round ${ROUNDS}`);
if (savedFile) {
  if (new Set(saved).size !== saved.length) fail(`${saved.length - new Set(saved).size} saved entry ids repeat`);
  fs.writeFileSync(savedFile, saved.join("\n") + "\n");
  console.log(`serve_load: ${saved.length} conversations saved to the memory store`);
}
const expectStreams = CLIENTS * (ROUNDS - Math.floor(ROUNDS / 5));
if (latencies.length !== expectStreams) fail(`${latencies.length} of ${expectStreams} streams complete`);
agent.destroy();
process.exit(failures ? 1 : 0);
