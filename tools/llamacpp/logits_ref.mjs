#!/usr/bin/env node
// Reference next-token distributions from llama.cpp (through node-llama-cpp, pinned in
// package.json; install with `npm ci` in this folder), for mererun's logit-parity check
// (scripts/parity.py, docs/parity.md).
//
//   node tools/llamacpp/logits_ref.mjs MODEL.gguf PROMPTS.jsonl OUT_DIR
//        [--limit N] [--threads 2] [--parallel 2] [--context-size N] [--mass 0.999999]
//        [--min-k 32] [--max-k 4096]
//
// PROMPTS.jsonl: one JSON object per line with a "text" field (and optionally "id", "kind").
// Each text is tokenized by llama.cpp with special-token parsing on; BOS (EOS) is added when the
// model's metadata asks llama.cpp to add it (tokenizer.ggml.add_bos_token / add_eos_token), which
// is what llama_tokenize(add_special=true) does. Every position of the sequence is evaluated,
// including the last one, and the full-vocabulary next-token distribution at that position
// (predicting token position+1) is reduced to its top-K.
//
// Outputs in OUT_DIR:
//   tokens.json  [[id, ...], ...]  one array per prompt (the input for `mererun logits --tokens`)
//   ref.bin      binary, little endian ("LCRF" v1):
//                  char[4] "LCRF", u32 version = 1, u32 n_vocab, u32 n_prompts,
//                  u32 n_positions[n_prompts],
//                  then for every prompt, for every position:
//                    u32 k, f64 tail_mass, i32 ids[k], f32 logprobs[k]
//                ids are sorted by probability, highest first (ids[0] is llama.cpp's argmax);
//                logprobs are natural-log probabilities over the FULL vocabulary; tail_mass is
//                the probability of every token not listed (summed, not 1 - covered).
//   meta.json    provenance: model file and sha256, prompts sha256, node-llama-cpp version,
//                llama.cpp release, CPU backend variant loaded, settings, timings.
//
// How the distribution is obtained (checked in node-llama-cpp 3.21.1; details in docs/parity.md):
// LlamaContextSequence.controlledEvaluate() with generateNext.probabilities at every token and
// temperature 0. With temperature 0 the addon's sampler chain is only a greedy sampler (no
// top-k/top-p/min-p/temperature stage; no repeat penalty, DRY, XTC, token bias or grammar unless
// given, and none is given), so the candidate list is the full vocabulary with the raw logits of
// llama_get_logits_ith(). The addon then sorts it by logit and applies a float32 softmax; we
// renormalise those probabilities in float64 (the float32 sum is off by ~1e-4 relative), which
// leaves ratios, hence the distribution, exactly as llama.cpp computed them.

import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const kUsage =
  "usage: node logits_ref.mjs MODEL.gguf PROMPTS.jsonl OUT_DIR [--limit N] [--threads N] " +
  "[--parallel N] [--context-size N] [--mass F] [--min-k N] [--max-k N]";

function Fail(message) {
  process.stderr.write(`[logits_ref] ${message}\n`);
  process.exit(2);
}

function ParseArgs(argv) {
  const args = { positional: [], limit: 0, threads: 2, parallel: 2, contextSize: 0, mass: 0.999999,
                 minK: 32, maxK: 4096 };
  const numeric = { "--limit": "limit", "--threads": "threads", "--parallel": "parallel",
                    "--context-size": "contextSize", "--mass": "mass", "--min-k": "minK",
                    "--max-k": "maxK" };
  for (let i = 2; i < argv.length; i++) {
    const a = argv[i];
    if (a === "-h" || a === "--help") {
      process.stdout.write(kUsage + "\n");
      process.exit(0);
    } else if (a in numeric) {
      const v = Number(argv[++i]);
      if (!Number.isFinite(v)) Fail(`${a} needs a number: got '${argv[i]}'`);
      args[numeric[a]] = v;
    } else if (a.startsWith("--")) {
      Fail(`unknown option ${a}\n${kUsage}`);
    } else {
      args.positional.push(a);
    }
  }
  if (args.positional.length !== 3) Fail(kUsage);
  if (!(args.mass > 0 && args.mass <= 1)) Fail(`--mass must be in (0, 1]: got ${args.mass}`);
  if (args.minK < 1 || args.maxK < args.minK) Fail(`need 1 <= --min-k <= --max-k`);
  return args;
}

function Sha256File(file) {
  const hash = crypto.createHash("sha256");
  const fd = fs.openSync(file, "r");
  const buf = Buffer.allocUnsafe(1 << 22);
  try {
    for (;;) {
      const n = fs.readSync(fd, buf, 0, buf.length, null);
      if (n === 0) break;
      hash.update(buf.subarray(0, n));
    }
  } finally {
    fs.closeSync(fd);
  }
  return hash.digest("hex");
}

function ReadPrompts(file, limit) {
  const lines = fs.readFileSync(file, "utf8").split("\n");
  const prompts = [];
  lines.forEach((line, i) => {
    if (line.trim() === "") return;
    let obj;
    try {
      obj = JSON.parse(line);
    } catch (e) {
      Fail(`${file}:${i + 1}: not JSON: ${e.message}`);
    }
    if (typeof obj.text !== "string" || obj.text === "") Fail(`${file}:${i + 1}: missing "text"`);
    prompts.push({ id: obj.id ?? `line${i + 1}`, text: obj.text });
  });
  return limit > 0 ? prompts.slice(0, limit) : prompts;
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

// Reduces one full-vocabulary distribution (a Map token -> float32 probability, sorted by logit,
// highest first, as node-llama-cpp returns it) to the top-K record.
// K is the smallest count whose cumulative probability reaches `mass`, clamped to [minK, maxK];
// tokens whose float32 probability underflowed to 0 are never listed (they add 0 to KL(ref||x)).
function TopK(probabilities, n_vocab, args) {
  if (probabilities.size !== n_vocab) {
    throw new Error(`distribution has ${probabilities.size} entries, expected n_vocab=${n_vocab}`);
  }
  let total = 0;
  for (const p of probabilities.values()) total += p;
  if (!(total > 0)) throw new Error(`distribution sums to ${total}`);
  const ids = [];
  const logprobs = [];
  let covered = 0;
  let tail = 0;
  let done = false;
  for (const [id, p32] of probabilities) {
    const p = p32 / total;
    if (!done && p > 0) {
      ids.push(id);
      logprobs.push(Math.log(p));
      covered += p;
      done = (covered >= args.mass && ids.length >= args.minK) || ids.length >= args.maxK;
    } else {
      done = true;
      tail += p;
    }
  }
  return { ids, logprobs, tail };
}

function EncodeRecord(rec) {
  const k = rec.ids.length;
  const buf = Buffer.allocUnsafe(4 + 8 + 8 * k);
  buf.writeUInt32LE(k, 0);
  buf.writeDoubleLE(rec.tail, 4);
  for (let i = 0; i < k; i++) buf.writeInt32LE(rec.ids[i], 12 + 4 * i);
  for (let i = 0; i < k; i++) buf.writeFloatLE(rec.logprobs[i], 12 + 4 * k + 4 * i);
  return buf;
}

async function Main() {
  const args = ParseArgs(process.argv);
  const [modelPath, promptsPath, outDir] = args.positional;
  if (!fs.existsSync(modelPath)) Fail(`model file not found: ${modelPath}`);
  if (!fs.existsSync(promptsPath)) Fail(`prompts file not found: ${promptsPath}`);
  const prompts = ReadPrompts(promptsPath, args.limit);
  if (prompts.length === 0) Fail(`no prompts in ${promptsPath}`);
  fs.mkdirSync(outDir, { recursive: true });
  // meta.json is written last and marks a complete output (scripts/parity.py reuses an output
  // only when it finds one): drop a previous run's before touching the other files.
  fs.rmSync(path.join(outDir, "meta.json"), { force: true });

  const t_start = performance.now();
  // llama.cpp reports the CPU backend variant it loaded (ggml picks the best of the prebuilt
  // libggml-cpu-*.so for this CPU) at the "log" level; keep that line, pass on warnings/errors.
  let cpu_backend = null;
  const llama = await getLlama({
    gpu: false,
    build: "never",
    logLevel: LlamaLogLevel.log,
    logger(level, message) {
      const m = /loaded CPU backend from (\S+)/.exec(message);
      if (m) cpu_backend = m[1];
      if (level === LlamaLogLevel.error || level === LlamaLogLevel.fatal ||
          level === LlamaLogLevel.warn) {
        process.stderr.write(`[llama.cpp ${level}] ${message.trimEnd()}\n`);
      }
    },
  });
  const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
  const add_bos = model.tokens.shouldPrependBosToken && model.tokens.bos != null;
  const add_eos = model.tokens.shouldAppendEosToken && model.tokens.eos != null;

  const tokens = prompts.map((p) => {
    const ids = Array.from(model.tokenize(p.text, true));
    if (add_bos) ids.unshift(model.tokens.bos);
    if (add_eos) ids.push(model.tokens.eos);
    return ids;
  });
  const max_len = Math.max(...tokens.map((t) => t.length));
  const context_size = args.contextSize > 0 ? args.contextSize : Math.max(256, max_len);
  if (max_len > context_size) Fail(`a prompt has ${max_len} tokens > --context-size ${context_size}`);
  // One ubatch per prompt (batchSize >= longest prompt): the whole prompt is one forward pass.
  // --parallel N runs N independent contexts (one sequence each, threads split between them) on
  // interleaved prompts: handing a full distribution to JavaScript is single-threaded work on the
  // main thread, and a second context keeps the other core busy meanwhile. Each prompt is still
  // evaluated alone in its own batch, so the numbers do not depend on --parallel (ggml's CPU ops
  // give each output element to one thread, so they do not depend on the thread count either;
  // docs/parity.md records the check).
  const n_parallel = Math.max(1, Math.min(args.parallel, prompts.length));
  const threads_each = Math.max(1, Math.floor(args.threads / n_parallel));
  const contexts = [];
  for (let c = 0; c < n_parallel; c++) {
    contexts.push(await model.createContext({
      contextSize: context_size, batchSize: context_size, sequences: 1, threads: threads_each,
      flashAttention: false,
    }));
  }
  const t_loaded = performance.now();

  let n_vocab = 0;
  const records = new Array(prompts.length);  // per prompt: array of Buffers
  let n_positions_total = 0;
  let next_prompt = 0;
  let n_done = 0;

  async function EvaluatePrompt(sequence, pi) {
    const ids = tokens[pi];
    await sequence.clearHistory();
    const per_pos = new Array(ids.length);
    let callback_error = null;
    const input = ids.map((t) => [t, { generateNext: { probabilities: true,
                                                        options: { temperature: 0 } } }]);
    const results = await sequence.controlledEvaluate(input, {
      // Reduce each distribution as soon as it arrives and drop the full Map: holding a
      // prompt's worth of 262k-entry Maps would cost gigabytes.
      onTokenResult(index, result) {
        try {
          const probs = result.next.probabilities;
          if (n_vocab === 0) n_vocab = probs.size;
          per_pos[index] = EncodeRecord(TopK(probs, n_vocab, args));
          delete result.next.probabilities;
        } catch (e) {
          callback_error ??= e;
        }
      },
    });
    if (callback_error) throw callback_error;
    for (let i = 0; i < ids.length; i++) {
      if (per_pos[i] == null) {
        // onTokenResult is best effort in node-llama-cpp; fall back on the returned array.
        const probs = results[i]?.next?.probabilities;
        if (probs == null) throw new Error(`prompt ${prompts[pi].id}: no distribution at position ${i}`);
        if (n_vocab === 0) n_vocab = probs.size;
        per_pos[i] = EncodeRecord(TopK(probs, n_vocab, args));
      }
    }
    records[pi] = per_pos;
    n_positions_total += ids.length;
    n_done++;
    process.stderr.write(`[logits_ref] prompt ${n_done}/${prompts.length} (${prompts[pi].id}): ` +
                         `${ids.length} positions\n`);
  }

  await Promise.all(contexts.map(async (context) => {
    const sequence = context.getSequence();
    while (next_prompt < prompts.length) await EvaluatePrompt(sequence, next_prompt++);
  }));
  const t_evaluated = performance.now();

  const header = Buffer.allocUnsafe(16 + 4 * prompts.length);
  header.write("LCRF", 0, "latin1");
  header.writeUInt32LE(1, 4);
  header.writeUInt32LE(n_vocab, 8);
  header.writeUInt32LE(prompts.length, 12);
  tokens.forEach((t, i) => header.writeUInt32LE(t.length, 16 + 4 * i));
  const fd = fs.openSync(path.join(outDir, "ref.bin"), "w");
  fs.writeSync(fd, header);
  for (const per_pos of records) for (const b of per_pos) fs.writeSync(fd, b);
  fs.closeSync(fd);
  fs.writeFileSync(path.join(outDir, "tokens.json"),
                   "[\n" + tokens.map((t) => JSON.stringify(t)).join(",\n") + "\n]\n");

  let k_sum = 0;
  let k_max = 0;
  let tail_max = 0;
  for (const per_pos of records) {
    for (const b of per_pos) {
      const k = b.readUInt32LE(0);
      k_sum += k;
      k_max = Math.max(k_max, k);
      tail_max = Math.max(tail_max, b.readDoubleLE(4));
    }
  }
  const meta = {
    generator: "tools/llamacpp/logits_ref.mjs",
    format: "LCRF v1",
    node_llama_cpp: NodeLlamaCppVersion(),
    llama_cpp_release: llama.llamaCppRelease,
    build_type: llama.buildType,
    cpu_backend,
    system_info: llama.systemInfo,
    model: { path: path.resolve(modelPath), size_bytes: fs.statSync(modelPath).size,
             sha256: Sha256File(modelPath) },
    prompts: { path: path.resolve(promptsPath), sha256: Sha256File(promptsPath), limit: args.limit,
               ids: prompts.map((p) => p.id) },
    n_vocab,
    add_bos,
    add_eos,
    settings: { threads: args.threads, parallel: n_parallel, threads_per_context: threads_each,
                context_size, batch_size: context_size,
                flash_attention: false, temperature: 0, mass: args.mass, min_k: args.minK,
                max_k: args.maxK },
    n_prompts: prompts.length,
    n_positions: n_positions_total,
    k_mean: k_sum / Math.max(1, n_positions_total),
    k_max,
    tail_mass_max: tail_max,
    timings_s: { load: (t_loaded - t_start) / 1000, evaluate: (t_evaluated - t_loaded) / 1000,
                 ms_per_position: (t_evaluated - t_loaded) / Math.max(1, n_positions_total) },
  };
  fs.writeFileSync(path.join(outDir, "meta.json"), JSON.stringify(meta, null, 2) + "\n");
  process.stderr.write(`[logits_ref] ${n_positions_total} positions, n_vocab ${n_vocab}, ` +
                       `mean K ${meta.k_mean.toFixed(1)}, evaluate ${meta.timings_s.evaluate.toFixed(1)} s ` +
                       `(${meta.timings_s.ms_per_position.toFixed(1)} ms/position), backend ${cpu_backend}\n`);
  for (const context of contexts) await context.dispose();
  await model.dispose();
  await llama.dispose();
}

Main().catch((e) => {
  process.stderr.write(`[logits_ref] ${e.stack ?? e}\n`);
  process.exit(1);
});
