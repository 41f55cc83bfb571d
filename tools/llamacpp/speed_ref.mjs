#!/usr/bin/env node
// llama.cpp speed on the same GGUF, for comparison with tools/kbench (not a test):
//   node tools/llamacpp/speed_ref.mjs MODEL.gguf [threads=2] [prefill=512] [gen=64]
// Prefill: one evaluation of `prefill` synthetic token ids (batch size = prefill);
// decode: greedy generation of up to `gen` tokens after it. Prints one JSON line.
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const [modelPath, threadsArg = "2", prefillArg = "512", genArg = "64"] = process.argv.slice(2);
if (!modelPath) {
  process.stderr.write("usage: node speed_ref.mjs MODEL.gguf [threads] [prefill] [gen]\n");
  process.exit(2);
}
const threads = Number(threadsArg), prefill = Number(prefillArg), gen = Number(genArg);
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
const context = await model.createContext({
  contextSize: prefill + gen + 16, batchSize: Math.max(prefill, 1), sequences: 1, threads,
});
const sequence = context.getSequence();
// Same synthetic ids as tools/kbench.
const tokens = Array.from({ length: prefill }, (_, i) => (i * 7919 + 13) % 20000);
let t0 = performance.now();
await sequence.evaluateWithoutGeneratingNewTokens(tokens);
const prefillS = (performance.now() - t0) / 1000;
let n = 0;
t0 = performance.now();
for await (const _ of sequence.evaluate([tokens[tokens.length - 1]], { temperature: 0 })) {
  if (++n >= gen) break;
}
const decodeS = (performance.now() - t0) / 1000;
console.log(JSON.stringify({
  model: modelPath, threads, prefill_tokens: prefill, prefill_tok_s: prefill / prefillS,
  decode_tokens: n, decode_tok_s: n / decodeS,
}));
await context.dispose();
await model.dispose();
await llama.dispose();
