#!/usr/bin/env node
// Generates the tokenizer fixtures in tests/fixtures/tokenizer/ from llama.cpp itself, through
// node-llama-cpp (pinned in package.json; install with `npm ci` in this folder).
//
//   node tools/llamacpp/tokenize_fixture.mjs [--models-dir DIR] [--out DIR] [--only NAME]
//
// For every model group below whose file is found, the model is loaded with vocabOnly (no
// weights, CPU build) and every test string is tokenized. mererun's own tokenizer
// (src/model/tokenizer*.cpp) must reproduce these ids exactly (src/model/tokenizer_test.cpp).
//
// How node-llama-cpp maps onto llama.cpp (checked in node-llama-cpp 3.21.1):
//  - model.tokenize(text, specialTokens) calls the addon's AddonModel::Tokenize, which is
//    common_tokenize(vocab, text, /*add_special=*/false, /*parse_special=*/specialTokens), i.e.
//    llama_tokenize(..., add_special=false, parse_special=specialTokens). So BOS/EOS are never
//    added here; add_special=true is covered by mererun's unit tests from the metadata flags.
//    An empty text returns [] without calling llama.cpp (llama.cpp also returns [] for it).
//  - model.detokenize(ids, specialTokens) calls
//    llama_detokenize(..., remove_special=false, unparse_special=specialTokens).
//
// The strings are generated deterministically (fixed hand-written cases plus a seeded PRNG), so
// re-running the script with the same node-llama-cpp version reproduces the same files.
//
// Output (one file per tokenizer; models with an identical tokenizer share one file, and the
// script checks that every model of a group gives the same ids):
//   { generator, node_llama_cpp, llama_cpp_release, tokenizer: {model, pre, n_vocab},
//     model_files: [{name, aliases, sha256}],
//     vocab: {bos, eos, eot, add_bos, add_eos, eog_ids, attrs: [[id, llama_token_attr mask]]},
//     cases: [{text, parse_special, ids, detok?}] }
// `attrs` lists every token whose attribute mask is not plain "normal" (4).
// `detok` is llama_detokenize(ids, remove_special=false, unparse_special=parse_special) and is
// present only where it differs from `text`.

import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

import { getLlama } from "node-llama-cpp";

const here = path.dirname(fileURLToPath(import.meta.url));
const repoRoot = path.resolve(here, "..", "..");

// ---------------------------------------------------------------------------------------------
// Model groups. `name` is the catalog file name, `aliases` development names for the same file.
const kGroups = [
  {
    fixture: "SmolLM2-135M-Instruct.Q4_1",
    files: [{ name: "SmolLM2-135M-Instruct.Q4_1.gguf", aliases: [] }],
  },
  {
    fixture: "gemma-3-270m-q4_k_m",
    files: [{ name: "gemma-3-270m-q4_k_m.gguf", aliases: [] }],
  },
  {
    fixture: "qwen2.5-coder",
    files: [
      { name: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", aliases: ["qwen05.gguf"] },
      { name: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", aliases: ["qwen15.gguf"] },
    ],
  },
  // Vocabulary-only files written by scripts/hf_tokenizer_gguf.py from the npm tokenizer
  // packages (Llama 3.x / SmolLM3, Qwen3, gpt-oss), the families whose weights the registries
  // lack.
  {
    fixture: "llama3",
    files: [{ name: "generated/tokenizer-llama3.gguf", aliases: [] }],
  },
  {
    fixture: "qwen3",
    files: [{ name: "generated/tokenizer-qwen3.gguf", aliases: [] }],
  },
  {
    fixture: "gptoss",
    files: [{ name: "generated/tokenizer-gptoss.gguf", aliases: [] }],
  },
  // llama.cpp's own vocabulary-only files of SentencePiece tokenizers (scripts/llamacpp_vocab.py,
  // from the llama-cpp-python sdist): Phi-3's and Llama 2's, with their piece scores.
  {
    fixture: "phi3",
    files: [{ name: "generated/tokenizer-phi3.gguf", aliases: [] }],
  },
  {
    fixture: "llama-spm",
    files: [{ name: "generated/tokenizer-llama-spm.gguf", aliases: [] }],
  },
];

function parseArgs(argv) {
  const args = { modelsDirs: [], out: path.join(repoRoot, "tests", "fixtures", "tokenizer"), only: null };
  for (let i = 2; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--models-dir") args.modelsDirs.push(argv[++i]);
    else if (a === "--out") args.out = argv[++i];
    else if (a === "--only") args.only = argv[++i];
    else throw new Error(`unknown argument ${a}`);
  }
  // Same search order as src/model/test_models.h.
  if (process.env.MERERUN_HOME) args.modelsDirs.push(path.join(process.env.MERERUN_HOME, "models"));
  const cache = process.env.XDG_CACHE_HOME || path.join(os.homedir(), ".cache");
  args.modelsDirs.push(path.join(cache, "mererun", "models"));
  args.modelsDirs.push("/tmp/dl/models");
  return args;
}

function findModel(dirs, file) {
  for (const dir of dirs) {
    for (const n of [file.name, ...file.aliases]) {
      const p = path.join(dir, n);
      if (fs.existsSync(p)) return p;
    }
  }
  return null;
}

function sha256File(p) {
  const h = crypto.createHash("sha256");
  const fd = fs.openSync(p, "r");
  const buf = Buffer.alloc(1 << 22);
  for (;;) {
    const n = fs.readSync(fd, buf, 0, buf.length, null);
    if (n <= 0) break;
    h.update(buf.subarray(0, n));
  }
  fs.closeSync(fd);
  return h.digest("hex");
}

// ---------------------------------------------------------------------------------------------
// Test strings.

// mulberry32: small, well-known 32-bit PRNG; deterministic across platforms.
function makeRng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    next,
    int: (n) => Math.floor(next() * n),
    pick: (arr) => arr[Math.floor(next() * arr.length)],
  };
}

const kScripts = [
  "Hello, world!",
  "The quick brown fox jumps over the lazy dog.",
  "Café déjà vu — naïve façade, coöperate, résumé.",
  "Größe, Straße, Übermaß, ÄÖÜäöüß",
  "¿Qué tal? ¡Olé! Señor Muñoz.",
  "Ærøskøbing, Łódź, Škoda, Țară, Ğüçlü",
  "İstanbul ıIiİ — Türkçe",
  "Tiếng Việt có dấu: Hà Nội, Thành phố Hồ Chí Minh.",
  "Καλημέρα κόσμε, τι κάνεις; ΑΒΓΔ αβγδ ς ΐ",
  "Привет, мир! Съешь же ещё этих мягких французских булок, да выпей чаю.",
  "Українська мова: їжак, ґанок, Є.",
  "مرحبا بالعالم! كيف حالك؟ ١٢٣٤٥٦٧٨٩٠",
  "اللغة العربية جميلة، أليس كذلك؟",
  "שלום עולם, מה שלומך? עִבְרִית",
  "नमस्ते दुनिया। हिन्दी में लिखा गया पाठ, १२३४",
  "संस्कृतम् क्षत्रिय ज्ञान",
  "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ",
  "你好，世界！我爱自然语言处理。",
  "漢字と仮名の混じった文章です。東京都に住んでいます。",
  "繁體中文測試：臺灣、香港。",
  "안녕하세요 세계! 한국어 텍스트입니다.",
  "ひらがな カタカナ ｶﾀｶﾅ ー・「」『』",
  "한글 (conjoining jamo)",
  "Ελληνικά και English mixed with русский и 中文",
  "ქართული ენა, Հայերեն, አማርኛ, ᏣᎳᎩ",
  "தமிழ், తెలుగు, ಕನ್ನಡ, മലയാളം, বাংলা, ગુજરાતી, ਪੰਜਾਬੀ",
  "ພາສາລາວ, ភាសាខ្មែរ, မြန်မာစာ, བོད་ཡིག",
  "Монгол бичиг ᠮᠣᠩᠭᠣᠯ, ꦧꦱꦗꦮ",
];

const kEmoji = [
  "😀😃😄😁",
  "👍🏽 👍🏿 👋🏻",
  "👩‍💻 👨‍👩‍👧‍👦 🧑‍🤝‍🧑",
  "🏳️‍🌈 🏴‍☠️",
  "🇺🇸🇯🇵🇩🇪🇫🇷🇧🇷",
  "❤️ ✔︎ ☺️ ☀",
  "🫠🫶🪿",
  "1️⃣ #️⃣ *️⃣",
  "I ❤ Unicode 🎉🎉🎉",
  "😀",
];

const kCombining = [
  "e\u0301 a\u0308 n\u0303 o\u0302",
  "Z\u0351\u0352\u0353\u0354a\u0300\u0301\u0302l\u0327g\u0328o\u0335",
  "q\u0307\u0323 \u0041\u030a vs \u00c5 vs \u212b",
  "ﬁ ﬂ ℌ ℕ Ω Å K",
  "∑∫√∞≠≤≥ ±×÷ ℝ ∀x∈ℕ: x²≥0",
  "ＡＢＣ１２３ ｈｅｌｌｏ",
  "x² y³ ½ ¼ Ⅻ ⅷ ① ⑩ ³⁄₄",
  "$100 €50 £30 ¥1000 ₹500 ₿0.1 ¢",
  "soft\u00adhyphen zero\u200bwidth joiner\u200dhere bom\ufeffhere",
  "\u202eright-to-left override\u202c and \u200fmark",
  "tags \u{e0041}\u{e0042} and private \ue000\uf8ff",
  "unassigned \u0378 \u2fe0 \u{1fbff} \ufff0",
  "𝐀𝐁𝐂 𝔸𝔹ℂ 𝒜ℬ𝒞 𝟘𝟙𝟚",
  "𐌰𐌱𐌲 𐎀𐎁 𒀀𒀁",
  "𠀀𠀁𪜀 (CJK ext B)",
  "\ufffd replacement char",
  "SentencePiece marker \u2581 and \u2581\u2581 twice, \u2581lead",
];

const kWhitespace = [
  " ", "  ", "   ", "    ", "        ",
  "\t", "\t\t", " \t ", "\n", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n", "\r", " \n", "\n ",
  "a  b   c    d", " leading", "  two leading", "trailing ", "trailing two  ",
  "line1\r\nline2\r\n", "tab\tseparated\tvalues\n1\t2\t3\n",
  "\u00a0nbsp\u00a0", "\u2003em space\u2002en", "\u3000ideographic\u3000space",
  "\u2028line sep\u2029para sep", "next\u0085line", "\v vertical \f formfeed",
  " \n \n \n", "\n\t\n\t", "   \n\n   x", "x   \n", "word\n\n\n\nword",
];

const kCode = [
  "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
  "import numpy as np\nx = np.arange(10)  # comment\nprint(f\"{x.sum():.2f}\")\n",
  "class Foo(Base):\n    def __init__(self, *args, **kwargs):\n        super().__init__()\n\n",
  "#include <vector>\n\nint main() {\n  std::vector<int> v{1, 2, 3};\n  for (auto& x : v) x *= 2;\n  return 0;\n}\n",
  "template <typename T>\nconstexpr T Max(const T& a, const T& b) { return a < b ? b : a; }",
  "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
  "impl<'a> Iterator for Foo<'a> { type Item = &'a str; }",
  "const f = async (x) => { await fetch(`/api/${x}`); return x ?? null; };\n",
  "function add(a, b) {\n\treturn a + b;\n}\nconsole.log(add(1, 2)); // 3\n",
  "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\" | wc -c; done\n",
  "ls -la | grep '^d' && cd ~/src && make -j$(nproc) 2>&1 | tee build.log",
  "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
  "{\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}",
  "<html><body><div class=\"x\">Hi &amp; bye</div></body></html>",
  "x += 1; y -= 2; z *= 3; w /= 4; a <<= 1; b >>= 2; c ||= d; e &&= f;",
  "if (a != b && c == d || !e) { return -1; } else { return 0; }",
  "    indented four\n        indented eight\n\tindented tab\n",
  "// C++ comment\n/* block\n * comment */\n",
  "```python\nprint('hi')\n```\n",
  "path/to/file.txt C:\\Windows\\System32 https://example.com/a?b=c&d=e#f",
  "user@example.com +1-555-0100 192.168.0.1 ::1 fe80::1%eth0",
];

const kNumbers = [
  "1234567890", "12345678901234567890123456789012345678901234567890",
  "3.14159265358979", "1,000,000", "1.000.000,50", "0.000001", "-42", "+7", "1e-10", "6.02e23",
  "12:30:45", "2024-01-15T08:30:00Z", "v1.2.3", "0x1F3A 0b1010 0o17", "100%", "50/50", "3/4",
  "١٢٣ ٤٥٦", "१२३ ४५६", "๑๒๓", "٣.١٤", "7️⃣ 8 9", "10k 2M 3B", "1st 2nd 3rd 4th",
  "a1b2c3", "x86_64", "ipv4 127.0.0.1", "$1,234.56", "(555) 123-4567",
];

const kContractions = [
  "I'm, you're, he's, she'd, we'll, they've, it's, don't, can't, won't",
  "I'M YOU'RE HE'S SHE'D WE'LL THEY'VE DON'T CAN'T",
  "'s 't 're 've 'm 'll 'd",
  "'S 'T 'RE 'VE 'M 'LL 'D",
  "'Re 'rE 'Ve 'Ll 'lL",
  "rock 'n' roll, '90s, 'tis",
  "O'Neil's cat's toy's owner's",
  "It’s curly ‘quotes’ and “double”",
  "''' '' ' '''s",
  "don't!don't?don't.",
  "x's y'S z'T",
  "l'homme d'état aujourd'hui",
];

const kSpecialLike = [
  "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
  "<|im_start|>system\nYou are helpful.<|im_end|>\n",
  "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
  "<start_of_turn>user\nWhat is 2+2?<end_of_turn>",
  "<|im_st", "<|im_start", "|im_start|>", "<|im_end", "im_end|>",
  "<<|im_end|>>", "<|endoftext|><|endoftext|>", "foo<|endoftext|>bar",
  "<eos>", "<bos>", "<pad>", "<unk>", "<mask>", "<unused0>", "<unused99>", "<unused6241>",
  "[multimodal]", "<start_of_image>", "<end_of_image>",
  "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
  "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
  "<repo_name>x<file_sep>y<filename>z", "<|repo_name|>r<|file_sep|>f",
  "< |im_start| >", "<|IM_START|>", "<s></s>", "<|end_of_text|>", "<|eot_id|>",
  "<start_of_turn", "start_of_turn>", "<end_of_turn>\n<end_of_turn>",
  "<|im_start|><|im_start|><|im_end|>", "text<|im_end|>", "<|im_end|>text",
  "<bos>hello<eos>", " <bos> spaced <eos> ", "<|endoftext|>\n\n<|im_start|>",
  "<jupyter_code>print(1)<jupyter_output>1", "<gh_stars>100", "<empty_output>",
  "<|box_start|>(1,2)<|box_end|>", "<|vision_start|><|image_pad|><|vision_end|>",
  "[PAD151665]", "<table><tr><td>x</td></tr></table>", "\n\n\n\n<start_of_turn>",
  "\t\t\t<end_of_turn>   ", "<unused1><unused2>", "<|im_start|>\n\n\n",
];

function longCases() {
  return [
    "9".repeat(500),
    " ".repeat(200) + "x",
    "a".repeat(300),
    "\n".repeat(64),
    "\t".repeat(40) + "end",
    "😀".repeat(50),
    "ab ".repeat(200),
    kCode.join("\n"),
    kScripts.join(" "),
    "word ".repeat(100) + "12345 ".repeat(50),
    "<|im_start|>".repeat(20) + "<start_of_turn>".repeat(20),
  ];
}

// Random codepoints from blocks chosen to cover many categories (letters, marks, numbers,
// punctuation, symbols, separators, format and private-use characters, unassigned ones).
const kBlocks = [
  [0x20, 0x7e], [0x20, 0x7e], [0x20, 0x7e], [0xa0, 0x24f], [0x250, 0x36f], [0x370, 0x3ff],
  [0x400, 0x4ff], [0x530, 0x58f], [0x590, 0x6ff], [0x700, 0x7ff], [0x900, 0x97f], [0x980, 0xdff],
  [0xe00, 0xeff], [0xf00, 0xfff], [0x1000, 0x109f], [0x10a0, 0x10ff], [0x1100, 0x11ff],
  [0x1200, 0x139f], [0x1680, 0x16ff], [0x1780, 0x18af], [0x1e00, 0x1fff], [0x2000, 0x206f],
  [0x2070, 0x20cf], [0x2100, 0x23ff], [0x2460, 0x27bf], [0x2800, 0x28ff], [0x2e80, 0x2fff],
  [0x3000, 0x30ff], [0x3100, 0x31ff], [0x3400, 0x4dbf], [0x4e00, 0x9fff], [0xa000, 0xa4cf],
  [0xa640, 0xabff], [0xac00, 0xd7a3], [0xe000, 0xe0ff], [0xf900, 0xfaff], [0xfb00, 0xfdff],
  [0xfe00, 0xfe6f], [0xff00, 0xffef], [0xfff0, 0xfffd], [0x10000, 0x1034f], [0x10400, 0x1077f],
  [0x11000, 0x1124f], [0x11f00, 0x11f5f], [0x13000, 0x1345f], [0x16a40, 0x16aff],
  [0x1d400, 0x1d7ff], [0x1f000, 0x1f0ff], [0x1f300, 0x1faff], [0x20000, 0x2a6df],
  [0x2ebf0, 0x2ee5f], [0x30000, 0x3134f], [0xe0000, 0xe007f], [0xf0000, 0xf00ff],
];

function randomChars(rng, n) {
  let s = "";
  for (let i = 0; i < n; i++) {
    const [lo, hi] = rng.pick(kBlocks);
    s += String.fromCodePoint(lo + rng.int(hi - lo + 1));
  }
  return s;
}

function randomWhitespace(rng) {
  const ws = [" ", " ", " ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2009", "\v", "\f"];
  let s = "";
  const n = 1 + rng.int(5);
  for (let i = 0; i < n; i++) s += rng.pick(ws);
  return s;
}

function randomDigits(rng) {
  const digits = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "⁰¹²³⁴⁵⁶⁷⁸⁹"];
  const set = rng.int(4) === 0 ? rng.pick(digits) : digits[0];
  let s = "";
  const n = 1 + rng.int(12);
  for (let i = 0; i < n; i++) {
    s += set[rng.int(10)];
    if (rng.int(8) === 0) s += rng.pick([".", ",", " ", "_", "'"]);
  }
  return s;
}

const kWords = [
  "the", "The", "THE", "hello", "world", "token", "izer", "llama", "don't", "it's", "we'll",
  "naïve", "Straße", "мир", "κόσμε", "世界", "東京", "한국어", "ภาษา", "हिन्दी", "عربي", "שלום",
  "foo_bar", "fooBar", "FOO", "x", "I", "a", "😀", "👍🏽", "🇯🇵", "e\u0301", "__init__", "std::",
  "->", "=>", "!=", "==", "...", "—", "–", "«»", "…", "(", ")", "[", "]", "{", "}", "\"", "'",
];

function randomPiece(rng, specialPool) {
  switch (rng.int(12)) {
    case 0: return rng.pick(kScripts);
    case 1: return rng.pick(kEmoji);
    case 2: return rng.pick(kCombining);
    case 3: return rng.pick(kWhitespace);
    case 4: return rng.pick(kCode);
    case 5: return rng.pick(kNumbers);
    case 6: return rng.pick(kContractions);
    case 7: return randomChars(rng, 1 + rng.int(12));
    case 8: return randomWhitespace(rng);
    case 9: return randomDigits(rng);
    case 10: return specialPool ? rng.pick(specialPool) : rng.pick(kWords);
    default: {
      let s = "";
      const n = 1 + rng.int(6);
      for (let i = 0; i < n; i++) s += (i && rng.int(3) ? " " : "") + rng.pick(kWords);
      return s;
    }
  }
}

function randomString(rng, specialPool) {
  const seps = ["", " ", " ", "\n", "  ", "\t", "\r\n", ""];
  const n = 1 + rng.int(6);
  let s = "";
  for (let i = 0; i < n; i++) {
    if (i) s += rng.pick(seps);
    s += randomPiece(rng, specialPool);
  }
  return s;
}

// Returns [{text, parse_special}]. `specialTexts`: the texts of the model's control and
// user-defined tokens, so the special-parsing cases exercise this model's own tokens.
function buildCases(specialTexts) {
  const plain = [];
  const seen = new Set();
  const add = (t) => {
    if (!seen.has(t)) {
      seen.add(t);
      plain.push(t);
    }
  };
  add("");
  for (const pool of [kScripts, kEmoji, kCombining, kWhitespace, kCode, kNumbers, kContractions,
    kSpecialLike, longCases()]) {
    for (const t of pool) add(t);
  }
  // Every single ASCII character, alone and between letters.
  for (let c = 0; c < 128; c++) {
    const ch = String.fromCharCode(c);
    add(ch);
    add(`a${ch}b`);
  }
  const rng = makeRng(0x6d657265);  // "mere"
  while (plain.length < 1300) add(randomString(rng, null));
  // Dense mixes aimed at the pre-tokenizer rules: apostrophes, spaces, CR/LF, digits and
  // punctuation between random code points of every category.
  const hard = ["'", "'", "'s", "'T", "'Re", "'ll", " ", " ", "  ", "\n", "\r", "\r\n", "\t", "1",
    "42", "٣", "²", ".", ",", "!?", "-", "_", "$", "<", ">", "|", "\u00a0", "\u3000", "\u0301",
    "\u200d", "\ufe0f", "a", "Z", "é", "ß", "λ", "Ж", "中", "😀", "🇯", "\u0378"];
  const hrng = makeRng(0x68617264);  // "hard"
  while (plain.length < 1600) {
    let t = "";
    const n = 2 + hrng.int(24);
    for (let i = 0; i < n; i++) t += hrng.int(3) ? hrng.pick(hard) : randomChars(hrng, 1);
    add(t);
  }

  const specialPool = [...kSpecialLike, ...specialTexts];
  const special = plain.filter((t) => /[<[]/.test(t) || specialTexts.some((s) => t.includes(s)));
  const srng = makeRng(0x72756e21);  // "run!"
  const specialSet = new Set(special);
  while (special.length < 700) {
    const t = randomString(srng, specialPool);
    if (!specialSet.has(t)) {
      specialSet.add(t);
      special.push(t);
    }
  }
  return [
    ...plain.map((text) => ({ text, parse_special: false })),
    ...special.map((text) => ({ text, parse_special: true })),
  ];
}

// ---------------------------------------------------------------------------------------------

async function main() {
  const args = parseArgs(process.argv);
  fs.mkdirSync(args.out, { recursive: true });
  const pkg = JSON.parse(fs.readFileSync(path.join(here, "node_modules", "node-llama-cpp", "package.json"), "utf8"));
  const llama = await getLlama({ gpu: false, logLevel: "error" });

  for (const group of kGroups) {
    if (args.only && group.fixture !== args.only) continue;
    let result = null;
    const modelFiles = [];
    for (const file of group.files) {
      const p = findModel(args.modelsDirs, file);
      if (!p) {
        console.error(`[${group.fixture}] ${file.name}: not found, skipped`);
        continue;
      }
      console.error(`[${group.fixture}] loading ${p}`);
      const model = await llama.loadModel({ modelPath: p, vocabOnly: true, gpuLayers: 0 });
      const specialTexts = [];
      // Control/user-defined token texts, from the GGUF metadata (llama.cpp's token types).
      const meta = model.fileInfo.metadata.tokenizer.ggml;
      for (let id = 0; id < meta.tokens.length; id++) {
        const ty = meta.token_type ? meta.token_type[id] : 1;
        if ((ty === 3 || ty === 4) && !meta.tokens[id].startsWith("<unused")) specialTexts.push(meta.tokens[id]);
      }
      specialTexts.push("<unused0>", "<unused17>");
      const cases = buildCases(specialTexts.filter((t) => t.length <= 40));
      const out = [];
      for (const c of cases) {
        const ids = Array.from(model.tokenize(c.text, c.parse_special));
        const detok = model.detokenize(ids, c.parse_special);
        const rec = { text: c.text, parse_special: c.parse_special, ids };
        if (detok !== c.text) rec.detok = detok;
        out.push(rec);
      }
      const info = {
        name: file.name,
        aliases: file.aliases,
        sha256: sha256File(p),
      };
      modelFiles.push(info);
      const tok = { model: meta.model, pre: meta.pre ?? null, n_vocab: meta.tokens.length };
      // What llama.cpp derived from the metadata: special ids, BOS/EOS policy, the
      // end-of-generation set and every token attribute mask other than plain "normal".
      const kAttrNames = ["unknown", "unused", "normal", "control", "userDefined", "byte",
        "normalized", "lstrip", "rstrip", "singleWord"];
      const eog = [];
      const attrs = [];
      for (let id = 0; id < meta.tokens.length; id++) {
        if (model.isEogToken(id)) eog.push(id);
        const a = model.getTokenAttributes(id);
        let mask = 0;
        kAttrNames.forEach((name, bit) => { if (a[name]) mask |= 1 << bit; });
        if (mask !== 4) attrs.push([id, mask]);
      }
      const vocab = {
        bos: model.tokens.bos, eos: model.tokens.eos, eot: model.tokens.eot,
        add_bos: model.tokens.shouldPrependBosToken, add_eos: model.tokens.shouldAppendEosToken,
        eog_ids: eog, attrs,
      };
      if (result === null) {
        result = { tokenizer: tok, vocab, cases: out };
      } else {
        // Same tokenizer family: the ids must agree, or the group is wrong.
        if (JSON.stringify(result.cases) !== JSON.stringify(out) ||
          JSON.stringify(result.tokenizer) !== JSON.stringify(tok) ||
          JSON.stringify(result.vocab) !== JSON.stringify(vocab)) {
          throw new Error(`[${group.fixture}] ${file.name} tokenizes differently from ${modelFiles[0].name}`);
        }
        console.error(`[${group.fixture}] ${file.name}: identical ids to ${modelFiles[0].name}`);
      }
      await model.dispose();
    }
    if (result === null) continue;
    const fixture = {
      generator: "tools/llamacpp/tokenize_fixture.mjs",
      node_llama_cpp: pkg.version,
      llama_cpp_release: llama.llamaCppRelease?.release ?? null,
      tokenizer: result.tokenizer,
      model_files: modelFiles,
      vocab: result.vocab,
      cases: result.cases,
    };
    const outPath = path.join(args.out, `${group.fixture}.json`);
    // One case per line keeps diffs of regenerated fixtures readable.
    const head = JSON.stringify({ ...fixture, vocab: null, cases: null }, null, 1)
      .replace(/ "vocab": null,\n "cases": null\n}$/, "");
    const body = head + "\"vocab\": " + JSON.stringify(result.vocab) + ",\n\"cases\": [\n" +
      result.cases.map((c) => JSON.stringify(c)).join(",\n") + "\n]}\n";
    JSON.parse(body);  // sanity
    fs.writeFileSync(outPath, body);
    const nSpecial = result.cases.filter((c) => c.parse_special).length;
    console.error(`[${group.fixture}] wrote ${outPath}: ${result.cases.length} cases ` +
      `(${result.cases.length - nSpecial} plain, ${nSpecial} with parse_special)`);
  }
  await llama.dispose();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
