// erinfer serve through the official OpenAI Node client (npm `openai`, pinned by scripts/serve_check.sh):
//   node scripts/serve_check.mjs OPENAI_PREFIX BASE_URL API_KEY [TOOL_BASE_URL|none] [MEMORY_BASE_URL|none]
// Chat completion, streaming (joined deltas equal the non-streamed text for the same seed), n > 1,
// stop strings, seed reproducibility, /v1/completions, /v1/models, prefix reuse across a conversation's
// turns (usage.prompt_tokens_details.cached_tokens), logprobs (chat, streamed and not; completions), a
// tool round trip (tools offered, an assistant tool call and its role "tool" result fed back; tool_choice
// "required" forced), the extensions (route, reasoning_budget) and errors for bad requests (the client's
// typed errors with the right status). With TOOL_BASE_URL (a server on the
// tool-calling test model of tests/infer/test_server.c): the model's call comes back as tool_calls, streamed
// as a tool_calls delta, and the call with its result is sent back. With MEMORY_BASE_URL (a server with --memory on
// the model of tests/infer/test_server.c that always calls memory_search): the server runs the call itself and the
// response carries it with its results. Exits non-zero on any failure.
import { createRequire } from "node:module";
import path from "node:path";

const [prefix, baseURL, apiKey, toolArg, memoryArg] = process.argv.slice(2);
const toolURL = toolArg === "none" ? undefined : toolArg, memoryURL = memoryArg === "none" ? undefined : memoryArg;
const require = createRequire(path.join(path.resolve(prefix), "package.json"));
const { OpenAI } = require("openai");
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });

let failed = 0;
function check(cond, what) {
  if (!cond) {
    failed++;
    console.error(`serve_check: FAILED: ${what}`);
  }
}
// A guess-and-check problem with a budget stated: the tiny base opens its thinking and tries candidates from a
// random start, so samples of other seeds differ (a one-step problem it answers the same way at any seed).
const msgs = [{ role: "system", content: "Think for at most 64 tokens." },
              { role: "user", content: "Find x from 1 to 12 such that x * 3 + 4 = 25." }];

async function streamed(body) {
  const s = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  const texts = [], finish = [];
  let usage = null, chunks = 0;
  for await (const c of s) {
    chunks++;
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      texts[ch.index] = (texts[ch.index] ?? "") + (ch.delta?.content ?? "");
      if (ch.finish_reason) finish[ch.index] = ch.finish_reason;
    }
  }
  return { texts, finish, usage, chunks };
}

async function main() {
  const models = await client.models.list();
  check(models.data.length === 1 && typeof models.data[0].id === "string", "models.list has the model");

  const body = { model: "m", messages: msgs, max_tokens: 24, temperature: 0.9, top_p: 0.95, seed: 5 };
  const a = await client.chat.completions.create(body);
  const b = await client.chat.completions.create(body);
  check(a.object === "chat.completion" && a.choices.length === 1, "chat completion has one choice");
  check(typeof a.choices[0].message.content === "string" && a.choices[0].message.role === "assistant",
        "the choice is an assistant message");
  check(a.choices[0].message.content === b.choices[0].message.content, "the same seed gives the same text");
  check(a.usage.completion_tokens > 0 && a.usage.total_tokens === a.usage.prompt_tokens + a.usage.completion_tokens,
        "usage counts add up");
  const others = await Promise.all([6, 7, 8, 9, 10].map((seed) => client.chat.completions.create({ ...body, seed })));
  check(others.some((c) => c.choices[0].message.content !== a.choices[0].message.content),
        "other seeds give other texts");

  const s = await streamed(body);
  check(s.chunks > 2, "the stream has several chunks");
  check(s.texts[0] === a.choices[0].message.content, "streamed deltas joined equal the non-streamed text");
  check(s.finish[0] === a.choices[0].finish_reason, "the stream's finish reason equals the non-streamed one");
  check(s.usage && s.usage.completion_tokens === a.usage.completion_tokens, "the stream's usage chunk");

  const n3 = await client.chat.completions.create({ ...body, n: 3 });
  check(n3.choices.length === 3 && n3.choices.every((ch, i) => ch.index === i), "n = 3 gives three choices");
  check(n3.choices[0].message.content === a.choices[0].message.content, "sample 0 of n = 3 is the n = 1 sample");
  const s3 = await streamed({ ...body, n: 3 });
  check(s3.texts.length === 3 && s3.texts.every((t, i) => t === n3.choices[i].message.content),
        "n = 3 streamed equals n = 3 non-streamed");

  // A stop string taken from the text itself (letters: the random model's invalid UTF-8 bytes come back
  // as U+FFFD, which is not what the stop matcher sees): the output ends right before it.
  const full = a.choices[0].message.content;
  const m = /[A-Za-z]{3}/.exec(full);
  check(m, "the sample has a run of three letters to stop at");
  if (m) {
    const st = await client.chat.completions.create({ ...body, stop: ["zzzz", m[0]] });
    check(st.choices[0].message.content === full.slice(0, m.index) && st.choices[0].finish_reason === "stop",
          `a stop string cuts the text (${JSON.stringify(m[0])})`);
  }

  // The conversation's next turn reuses the cached K/V of the earlier ones.
  const turn2 = [...msgs, { role: "assistant", content: full }, { role: "user", content: "And doubled?" }];
  const t2 = await client.chat.completions.create({ ...body, messages: turn2, temperature: 0 });
  check(t2.usage.prompt_tokens_details?.cached_tokens > 0, "a conversation's next turn reuses its cached prefix");

  // Two conversations interleaved: each next turn is prefilled from the cached prompt that holds its
  // conversation (a new conversation replaces another cached prompt instead of evicting it).
  const conv = (sys) => [{ role: "system", content: sys }, { role: "user", content: "Start with 3. Add 4." }];
  const greedy = { model: "m", max_tokens: 8, temperature: 0 };
  const a1 = await client.chat.completions.create({ ...greedy, messages: conv("You are brief.") });
  const b1 = await client.chat.completions.create({ ...greedy, messages: conv("Show every step.") });
  const next = (c, r) => [...c, { role: "assistant", content: r.choices[0].message.content }, { role: "user", content: "Again?" }];
  const a2 = await client.chat.completions.create({ ...greedy, messages: next(conv("You are brief."), a1) });
  const b2 = await client.chat.completions.create({ ...greedy, messages: next(conv("Show every step."), b1) });
  check(a2.usage.prompt_tokens_details.cached_tokens >= a1.usage.prompt_tokens - 2 &&
        b2.usage.prompt_tokens_details.cached_tokens >= b1.usage.prompt_tokens - 2,
        `interleaved conversations keep their caches (cached ${a2.usage.prompt_tokens_details.cached_tokens} of ` +
        `${a1.usage.prompt_tokens}, ${b2.usage.prompt_tokens_details.cached_tokens} of ${b1.usage.prompt_tokens})`);

  // Embeddings: the client asks for base64 by default and decodes it; the same vectors as floats, unit length.
  const texts = ["Start with 4. Add 5.", "Multiply by 3."];
  const emb = await client.embeddings.create({ model: "m", input: texts });
  const embf = await client.embeddings.create({ model: "m", input: texts, encoding_format: "float" });
  check(emb.object === "list" && emb.data.length === 2 && emb.data.every((d, i) => d.index === i &&
    d.object === "embedding"), "embeddings: one per input, in order");
  const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
  check(emb.data.every((d, i) => d.embedding.length === embf.data[i].embedding.length &&
    d.embedding.every((x, k) => x === Math.fround(embf.data[i].embedding[k]))),
    "embeddings: base64 decodes to the float values (the float32 the decimals name)");
  check(emb.data.every((d) => Math.abs(norm(d.embedding) - 1) < 1e-5), "embeddings are unit vectors");
  check(emb.usage.prompt_tokens > 2 && emb.usage.total_tokens === emb.usage.prompt_tokens, "embeddings usage");
  const short = await client.embeddings.create({ model: "m", input: texts[0], dimensions: 16 });
  check(short.data.length === 1 && short.data[0].embedding.length === 16, "embeddings: dimensions");
  const cmpl = await client.completions.create({ model: "m", prompt: "Start with 4.", max_tokens: 8, temperature: 0 });
  check(cmpl.object === "text_completion" && typeof cmpl.choices[0].text === "string", "completions");

  // logprobs in OpenAI's shapes, as the client types them: chat content entries, streamed and not, and the
  // legacy completions arrays.
  const lpBody = { ...body, logprobs: true, top_logprobs: 3 };
  const lp = await client.chat.completions.create(lpBody);
  const entries = lp.choices[0].logprobs?.content ?? [];
  check(entries.length > 0 && entries.every((t) => typeof t.token === "string" && t.logprob <= 0 &&
        Array.isArray(t.bytes) && t.top_logprobs.length === 3 && t.top_logprobs[0].logprob >= t.logprob),
        "chat logprobs: token, logprob, bytes and three top_logprobs for every token");
  check(Buffer.from(entries.flatMap((t) => t.bytes)).toString("utf8") === lp.choices[0].message.content,
        "the chat logprobs' bytes make the content");
  const lpEntries = [];
  for await (const c of await client.chat.completions.create({ ...lpBody, stream: true }))
    for (const ch of c.choices) lpEntries.push(...(ch.logprobs?.content ?? []));
  check(JSON.stringify(lpEntries) === JSON.stringify(entries), "streamed chat logprobs joined equal the non-streamed");
  const cl = await client.completions.create({ model: "m", prompt: "Start with 4.", max_tokens: 8, temperature: 0,
                                              logprobs: 2 });
  const L = cl.choices[0].logprobs;
  check(L && L.tokens.length > 0 && L.token_logprobs.length === L.tokens.length &&
        L.top_logprobs.length === L.tokens.length && L.text_offset.length === L.tokens.length &&
        L.tokens.join("") === cl.choices[0].text && L.text_offset[0] === 0 &&
        L.text_offset.every((o, i) => i === 0 || o === L.text_offset[i - 1] + L.tokens[i - 1].length),
        `completions logprobs: tokens, token_logprobs, top_logprobs, text_offset (${JSON.stringify(L)})`);

  // Tools: offered through the template, a call and its result fed back.
  const tools = [{ type: "function", function: { name: "add", description: "Adds two numbers",
    parameters: { type: "object", properties: { a: { type: "number" }, b: { type: "number" } }, required: ["a", "b"] } } }];
  const call = { id: "call_1", type: "function", function: { name: "add", arguments: "{\"a\": 4, \"b\": 9}" } };
  const round = [...msgs, { role: "assistant", content: null, tool_calls: [call] },
                 { role: "tool", tool_call_id: "call_1", content: "13" }];
  const plain = await client.chat.completions.create({ ...body, messages: round, temperature: 0 });
  const tr = await client.chat.completions.create({ ...body, messages: round, tools, tool_choice: "auto", temperature: 0 });
  check(tr.usage.prompt_tokens > plain.usage.prompt_tokens, "the tools are rendered into the prompt");
  const none = await client.chat.completions.create({ ...body, messages: round, tools, tool_choice: "none", temperature: 0 });
  check(none.usage.prompt_tokens === plain.usage.prompt_tokens, "tool_choice none leaves the tools out");
  const trs = await streamed({ ...body, messages: round, tools, temperature: 0 });
  const trText = tr.choices[0].message.content ?? "";
  check(trs.texts[0] === trText, "with tools, the streamed content equals the non-streamed content");
  // tool_choice "required" forces "<tool_call>\n": the tiny base's own continuation is then a call (parsed)
  // or not (the text, flagged invalid_tool_call), the same streamed and not; a name not in tools is a 400.
  const req = { ...body, messages: round, tools, tool_choice: "required", seed: 7 };
  const rq = await client.chat.completions.create(req), rc = rq.choices[0];
  const rqs = await streamed(req);
  check(rc.finish_reason === "tool_calls" ? rc.message.tool_calls.length > 0
        : rc.invalid_tool_call === true && rc.message.content.startsWith("<tool_call>\n"),
        `tool_choice required forces a call's start (${JSON.stringify(rc)})`);
  check(rqs.finish[0] === rc.finish_reason && rqs.texts[0] === (rc.message.content ?? ""),
        "tool_choice required: the streamed choice equals the non-streamed one");

  // The extensions: a direct route without heads is the plain generation; a bad route is refused.
  const routed = await client.chat.completions.create({ ...body, route: "auto", reasoning_budget: 16 });
  check(routed.choices.length === 1, "route and reasoning_budget are accepted");

  // Errors: the client's typed errors with the status and an OpenAI error body.
  async function status(p) {
    try {
      await p;
      return 200;
    } catch (e) {
      return e.status ?? -1;
    }
  }
  check(await status(client.chat.completions.create({ ...body, temperature: "hot" })) === 400, "a wrong type is 400");
  check(await status(client.chat.completions.create({ ...body, messages: [] })) === 400, "no messages is 400");
  check(await status(client.chat.completions.create({ ...body, route: "sideways" })) === 400, "a bad route is 400");
  check(await status(client.chat.completions.create({ ...body, n: 1000 })) === 400, "n over the limit is 400");
  check(await status(client.chat.completions.create({ ...body, frobnicate: 1 })) === 400, "an unknown field is 400");
  check(await status(client.chat.completions.create({ ...body, tools, tool_choice: { type: "function",
    function: { name: "mul" } } })) === 400, "a tool_choice naming a function not in tools is 400");
  if (apiKey !== "none") {
    const wrong = new OpenAI({ baseURL, apiKey: "wrong", maxRetries: 0 });
    check(await status(wrong.chat.completions.create(body)) === 401, "a wrong API key is 401");
  }
  try {
    await client.chat.completions.create({ ...body, temperature: "hot" });
  } catch (e) {
    check(e.error && typeof e.error.message === "string" && e.error.param === "temperature",
          "the error body names the parameter");
  }
  if (toolURL) await toolRoundTrip(tools);
  if (memoryURL) await memorySearch();
  if (failed) process.exit(1);
  console.log("serve_check: openai client: all checks passed");
}

// The model calls add(4, 9): parsed, streamed, and answered with a role "tool" message.
async function toolRoundTrip(tools) {
  const tc = new OpenAI({ baseURL: toolURL, apiKey: "none", maxRetries: 0 });
  const req = { model: "m", messages: msgs, tools, max_tokens: 16 };
  const r1 = await tc.chat.completions.create(req);
  const m1 = r1.choices[0].message, call = m1.tool_calls?.[0];
  check(r1.choices[0].finish_reason === "tool_calls" && m1.content === null, "the model's call ends the turn");
  check(call && call.type === "function" && call.function.name === "add" &&
        JSON.stringify(JSON.parse(call.function.arguments)) === JSON.stringify({ a: 4, b: 9 }), "the call is parsed");
  const calls = [];
  let content = "", finish = null;
  for await (const c of await tc.chat.completions.create({ ...req, stream: true })) {
    const ch = c.choices[0];
    if (!ch) continue;
    content += ch.delta?.content ?? "";
    for (const d of ch.delta?.tool_calls ?? []) {
      calls[d.index] ??= { name: "", arguments: "" };
      calls[d.index].name += d.function?.name ?? "";
      calls[d.index].arguments += d.function?.arguments ?? "";
    }
    finish = ch.finish_reason ?? finish;
  }
  check(content === "" && finish === "tool_calls" && calls.length === 1 && calls[0].name === "add" &&
        calls[0].arguments === call?.function.arguments, "the streamed call equals the non-streamed one");
  const back = [...msgs, m1, { role: "tool", tool_call_id: call?.id, content: "13" }];
  const r2 = await tc.chat.completions.create({ ...req, messages: back });
  check(r2.usage.prompt_tokens > r1.usage.prompt_tokens + 5, "the call and its result are fed back");
  console.log("serve_check: openai client: tool call round trip passed");
}

// The model calls memory_search("glassblower", 2): the server runs it on its store and, its one round spent
// (--memory-rounds 1), withdraws the tools; the response's erinfer.memory holds the call and the two notes found,
// streamed and not, and the user's message recalled them into the prompt beforehand.
async function memorySearch() {
  const mc = new OpenAI({ baseURL: memoryURL, apiKey: "none", maxRetries: 0 });
  const req = { model: "m", messages: [{ role: "user", content: "Which glassblower?" }], max_tokens: 16 };
  const r = await mc.chat.completions.create(req);
  const mem = r.erinfer?.memory, round = mem?.tool_rounds?.[0];
  check(mem && mem.recalled.length === 2, `the glassblower notes are recalled (${JSON.stringify(mem)})`);
  check(round?.tool_calls?.[0]?.name === "memory_search" &&
        JSON.parse(round.tool_calls[0].arguments).query === "glassblower", "the memory_search call is in the response");
  const hits = round ? JSON.parse(round.results[0]).results : [];
  check(hits.length === 2 && hits.every((h) => h.text.includes("glassblower")), "memory_search found both notes");
  check(r.choices[0].finish_reason === "stop" && r.choices[0].message.content.includes("memory_search"),
        "after its round the model answers (its call, now text)");
  let last = null, content = "";
  for await (const c of await mc.chat.completions.create({ ...req, stream: true })) {
    content += c.choices[0]?.delta?.content ?? "";
    if (c.erinfer) last = c.erinfer;
  }
  check(content === r.choices[0].message.content, "the streamed answer equals the non-streamed one");
  check(JSON.stringify(last?.memory?.tool_rounds) === JSON.stringify(mem?.tool_rounds),
        "the stream's final chunk carries the same tool rounds");
  console.log("serve_check: openai client: memory_search run by the server passed");
}

main().catch((e) => {
  console.error(`serve_check: FAILED: ${e.stack ?? e}`);
  process.exit(1);
});
