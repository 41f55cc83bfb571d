#!/usr/bin/env node
// llama.cpp's side of `mererun bench` (through node-llama-cpp, pinned in package.json): one
// repetition of the model figures for every thread count, as JSON on stdout.
//
//   node tools/llamacpp/bench.mjs --model MODEL.gguf --tokens PROMPT.json
//        [--threads 1,2] [--decode 128] [--verify 1,2,4,8] [--verify-iters 5]
//
// PROMPT.json: a JSON array of token ids (mererun writes it with the model's tokenizer, which
// gives the same ids as llama.cpp), evaluated as one prompt batch (prefill).
// Per thread count, on one context sequence (contextSize prompt + decode + max verify):
//   prefill_tok_s  prompt tokens / time of evaluateWithoutGeneratingNewTokens(prompt)
//   decode_tok_s   tokens / time of `decode` greedy steps of sequence.evaluate() (batch 1)
//   verify_ms[n]   time of controlledEvaluate() of n tokens in one batch, each asking for the
//                  next token (so llama.cpp computes logits for all n rows, as mererun's
//                  verify step does), at the context reached after decode; the n tokens are
//                  erased again after each step. Row counts are interleaved, verify-iters times.
// Output: {"meta": {...}, "runs": [{"threads", "prefill_tok_s", "decode_tok_s",
//          "verify_ms": {"1": [ms, ...], ...}}, ...]}

import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const kUsage = "usage: node bench.mjs --model MODEL.gguf --tokens PROMPT.json [--threads 1,2] " +
               "[--decode N] [--verify 1,2,4,8] [--verify-iters N]";

function Fail(message) {
  process.stderr.write(`[llamacpp bench] ${message}\n`);
  process.exit(2);
}

function IntList(s, what) {
  const v = String(s).split(",").filter((x) => x !== "").map(Number);
  if (v.length === 0 || !v.every((x) => Number.isInteger(x) && x >= 1)) Fail(`${what} wants a comma list of positive integers: got '${s}'`);
  return v;
}

function ParseArgs(argv) {
  const a = { model: "", tokens: "", threads: [1, 2], decode: 128, verify: [1, 2, 4, 8], verifyIters: 5 };
  for (let i = 2; i < argv.length; i++) {
    const k = argv[i];
    const v = argv[i + 1];
    if (k === "-h" || k === "--help") { process.stdout.write(kUsage + "\n"); process.exit(0); }
    if (v === undefined) Fail(`${k} needs a value\n${kUsage}`);
    i++;
    if (k === "--model") a.model = v;
    else if (k === "--tokens") a.tokens = v;
    else if (k === "--threads") a.threads = IntList(v, k);
    else if (k === "--verify") a.verify = IntList(v, k);
    else if (k === "--decode") a.decode = IntList(v, k)[0];
    else if (k === "--verify-iters") a.verifyIters = IntList(v, k)[0];
    else Fail(`unknown option ${k}\n${kUsage}`);
  }
  if (!a.model || !a.tokens) Fail(kUsage);
  if (!fs.existsSync(a.model)) Fail(`model file not found: ${a.model}`);
  return a;
}

function NodeLlamaCppVersion() {
  try {
    const require = createRequire(import.meta.url);
    const pkgPath = path.join(path.dirname(require.resolve("node-llama-cpp")), "..", "package.json");
    return JSON.parse(fs.readFileSync(pkgPath, "utf8")).version;
  } catch {
    return null;
  }
}

async function RunThreads(model, prompt, a, threads) {
  const maxVerify = Math.max(...a.verify);
  const contextSize = prompt.length + a.decode + maxVerify + 16;
  const context = await model.createContext({
    contextSize, threads, batchSize: Math.max(prompt.length, maxVerify), sequences: 1, flashAttention: false,
  });
  try {
    const seq = context.getSequence();
    let t0 = performance.now();
    await seq.evaluateWithoutGeneratingNewTokens(prompt);
    const prefill_s = (performance.now() - t0) / 1000;

    // Greedy decode: the generator evaluates the given token, then each yielded token on the
    // next iteration; `decode` evaluations of one token each.
    let n = 0;
    const last = prompt[prompt.length - 1];
    await seq.eraseContextTokenRanges([{ start: prompt.length - 1, end: prompt.length }]);
    t0 = performance.now();
    for await (const token of seq.evaluate([last], { temperature: 0 })) {
      void token;
      if (++n >= a.decode) break;
    }
    const decode_s = (performance.now() - t0) / 1000;
    // The loop evaluated `last` plus n-1 generated tokens (the n-th is sampled, not yet evaluated).

    const base = seq.nextTokenIndex;
    const draft = prompt.slice(0, maxVerify);
    const verify_ms = {};
    for (const r of a.verify) verify_ms[String(r)] = [];
    for (let it = 0; it < a.verifyIters; it++) {
      for (const r of a.verify) {
        const input = draft.slice(0, r).map((t) => [t, { generateNext: { token: true, options: { temperature: 0 } } }]);
        t0 = performance.now();
        await seq.controlledEvaluate(input);
        verify_ms[String(r)].push(performance.now() - t0);
        await seq.eraseContextTokenRanges([{ start: base, end: base + r }]);
      }
    }
    return { threads, prefill_tok_s: prompt.length / prefill_s, decode_tok_s: n / decode_s, decode_tokens: n,
             verify_context: base, verify_ms };
  } finally {
    await context.dispose();
  }
}

async function Main() {
  const a = ParseArgs(process.argv);
  const prompt = JSON.parse(fs.readFileSync(a.tokens, "utf8"));
  if (!Array.isArray(prompt) || prompt.length < Math.max(...a.verify) || !prompt.every(Number.isInteger)) {
    Fail(`${a.tokens}: expected a JSON array of at least ${Math.max(...a.verify)} token ids`);
  }
  let cpu_backend = null;
  const llama = await getLlama({
    gpu: false,
    build: "never",
    logLevel: LlamaLogLevel.log,
    logger(level, message) {
      const m = /loaded CPU backend from (\S+)/.exec(message);
      if (m) cpu_backend = m[1];
      if (level === LlamaLogLevel.error || level === LlamaLogLevel.fatal) {
        process.stderr.write(`[llama.cpp ${level}] ${message.trimEnd()}\n`);
      }
    },
  });
  const model = await llama.loadModel({ modelPath: a.model, gpuLayers: 0 });
  const runs = [];
  for (const t of a.threads) runs.push(await RunThreads(model, prompt, a, t));
  const meta = {
    generator: "tools/llamacpp/bench.mjs",
    node_llama_cpp: NodeLlamaCppVersion(),
    llama_cpp_release: llama.llamaCppRelease,
    cpu_backend,
    system_info: llama.systemInfo,
    model_path: path.resolve(a.model),
    model_size_bytes: model.size,
    prompt_tokens: prompt.length,
    flash_attention: false,
  };
  process.stdout.write(JSON.stringify({ meta, runs }) + "\n");
  await model.dispose();
  await llama.dispose();
}

Main().catch((e) => {
  process.stderr.write(`[llamacpp bench] ${e.stack ?? e}\n`);
  process.exit(1);
});
