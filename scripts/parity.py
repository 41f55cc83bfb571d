#!/usr/bin/env python3
"""Logit parity between mererun and llama.cpp on the same GGUF (docs/parity.md).

For every prompt of a JSONL file and every position of its llama.cpp tokenization, compares the
next-token distribution of mererun (`mererun logits`, raw float32 logits over the vocabulary)
with llama.cpp's (tools/llamacpp/logits_ref.mjs through node-llama-cpp, top-K log-probabilities
plus the tail mass), and reports per model:

  top1   fraction of positions where llama.cpp's argmax is also mererun's argmax
  KL     KL(llama.cpp || mererun) in nats, mean and max over positions, computed on llama.cpp's
         top-K support plus one bucket holding every other token (see docs/parity.md)

Verdict: PASS when top1 >= 0.98, mean KL <= 0.01 and every logit is finite.

  python3 scripts/parity.py --model NAME_OR_PATH [--model ...] [--prompts FILE] [--limit N]

--vs-exact also runs `mererun logits --ref` (FP32 activations against the file's weights, the
exact arithmetic) and measures llama.cpp and mererun as run (fast path, MERERUN_ACTS as set) each
against it with one metric: KL(side || exact) on the side's top-K plus a tail bucket, and top-1
agreement with the exact argmax. The native-kernels issue's bar: mererun's fast path no worse than
llama.cpp on both. --exact FILE reuses a `logits --ref` output.

Either side can be precomputed: --ref-dir DIR reuses DIR/{tokens.json,ref.bin,meta.json} when they
match the model and prompts (else regenerates them there), --ours FILE takes an existing MRLG file.
Pure Python (no numpy): a few ms per position.
"""

from __future__ import annotations

import argparse
import array
import concurrent.futures
import hashlib
import heapq
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_PROMPTS = REPO / "tests" / "fixtures" / "parity" / "prompts.jsonl"
LOGITS_REF = REPO / "tools" / "llamacpp" / "logits_ref.mjs"
# The same reference computed natively against node-llama-cpp's own libllama (logits_ref.cpp, built
# by tools/llamacpp/build_logits_ref.sh from scripts/setup.sh): byte-identical outputs without
# handing every distribution to JavaScript (~10x faster on a 150k vocabulary). Used when built,
# unless MERERUN_PARITY_NODE=1.
LOGITS_REF_NATIVE = REPO / "tools" / "llamacpp" / "build" / "logits_ref"
CATALOG = REPO / "models" / "catalog.json"

TOP1_MIN = 0.98
MEAN_KL_MAX = 0.01


class ParityError(Exception):
    """An expected failure with a message for the user (bad input, a side that failed)."""


# --------------------------------------------------------------------------------------------
# Model resolution: a path, or a catalog name/alias looked up in the same directories as mererun
# (src/model/test_models.h): $MERERUN_HOME/models, ${XDG_CACHE_HOME:-~/.cache}/mererun/models,
# /tmp/dl/models. In a directory, the catalog file name wins; a .gguf of exactly the catalog size
# is accepted too (development copies under other names, e.g. /tmp/dl/models/qwen05.gguf).


def model_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("MERERUN_HOME"):
        dirs.append(Path(os.environ["MERERUN_HOME"]) / "models")
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    dirs.append(Path(cache) / "mererun" / "models")
    dirs.append(Path("/tmp/dl/models"))
    return dirs


def load_catalog() -> list[dict]:
    if not CATALOG.is_file():
        return []
    return json.loads(CATALOG.read_text(encoding="utf-8")).get("models", [])


def resolve_model(name_or_path: str) -> tuple[str, Path]:
    """Returns (display name, GGUF path); raises ParityError naming what was tried."""
    p = Path(name_or_path)
    if p.is_file():
        return p.stem, p.resolve()
    entries = load_catalog()
    for e in entries:
        names = [e.get("name", "")] + list(e.get("aliases", []))
        file = e.get("file", "")
        if name_or_path not in names and name_or_path not in (file, Path(file).stem):
            continue
        for d in model_dirs():
            if (d / file).is_file():
                return e["name"], (d / file).resolve()
        for d in model_dirs():
            if d.is_dir():
                for cand in sorted(d.glob("*.gguf")):
                    if cand.stat().st_size == e.get("size_bytes"):
                        return e["name"], cand.resolve()
        raise ParityError(f"model '{name_or_path}' ({file}) is not downloaded: run "
                          f"`mererun pull {e['name']}` (looked in "
                          f"{', '.join(str(d) for d in model_dirs())})")
    for d in model_dirs():
        for cand in (d / name_or_path, d / f"{name_or_path}.gguf"):
            if cand.is_file():
                return cand.stem, cand.resolve()
    known = ", ".join(e.get("name", "?") for e in entries) or "(no catalog)"
    raise ParityError(f"model '{name_or_path}': not a file and not a catalog name ({known})")


def find_mererun(explicit: str | None) -> Path:
    cands = [explicit] if explicit else []
    if os.environ.get("MERERUN_BIN"):
        cands.append(os.environ["MERERUN_BIN"])
    cands += [str(REPO / "build" / "bin" / "mererun"), shutil.which("mererun") or ""]
    for c in cands:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return Path(c)
    raise ParityError("mererun binary not found: build it (cmake --preset release && cmake --build "
                      "build --target mererun) or pass --mererun PATH / set MERERUN_BIN")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# File formats.

@dataclass
class RefRecord:
    ids: array.array  # int32, highest probability first
    logprobs: array.array  # float32, ln p over the full vocabulary
    tail: float  # probability of every token not in ids


def _u32(f, n: int = 1) -> tuple[int, ...]:
    data = f.read(4 * n)
    if len(data) != 4 * n:
        raise ParityError(f"{f.name}: truncated header")
    return struct.unpack(f"<{n}I", data)


def read_header(f, magic: bytes) -> tuple[int, list[int]]:
    got = f.read(4)
    if got != magic:
        raise ParityError(f"{f.name}: bad magic {got!r}, expected {magic!r}")
    version, n_vocab, n_prompts = _u32(f, 3)
    if version != 1:
        raise ParityError(f"{f.name}: unsupported version {version}, expected 1")
    return n_vocab, list(_u32(f, n_prompts)) if n_prompts else []


def read_ref_record(f) -> RefRecord:
    head = f.read(12)
    if len(head) != 12:
        raise ParityError(f"{f.name}: truncated record")
    k, tail = struct.unpack("<Id", head)
    ids = array.array("i")
    lps = array.array("f")
    ids.frombytes(f.read(4 * k))
    lps.frombytes(f.read(4 * k))
    if len(ids) != k or len(lps) != k:
        raise ParityError(f"{f.name}: truncated record")
    if sys.byteorder != "little":
        ids.byteswap()
        lps.byteswap()
    return RefRecord(ids, lps, tail)


def read_logits_row(f, n_vocab: int) -> array.array:
    row = array.array("f")
    try:
        row.fromfile(f, n_vocab)
    except EOFError as e:
        raise ParityError(f"{f.name}: truncated logits") from e
    if sys.byteorder != "little":
        row.byteswap()
    return row


# --------------------------------------------------------------------------------------------
# Comparison.

@dataclass
class PositionResult:
    kl: float
    top1: bool
    finite: bool


def compare_position(ref: RefRecord, row: array.array) -> PositionResult:
    """KL(ref || ours) on ref's top-K support plus one tail bucket, and top-1 agreement.

    With S = ref's listed tokens, r = ref's tail mass and q_rest = ours' mass outside S:
      KL = sum_{i in S} p_i (ln p_i - ln q_i) + r ln(r / q_rest)
    This is the exact KL between the two distributions coarsened to S + {everything else}; by the
    data-processing inequality it never exceeds the full KL, and the gap is r times the KL of the
    two tail distributions (renormalised), i.e. it vanishes as r -> 0.
    """
    m = max(row)
    if m > 700.0 or m < -700.0:  # keep exp() in range; logits are normally |x| < 100
        shifted = True
        s = sum(map(math.exp, map(m.__rsub__, row)))
    else:
        shifted = False
        s = sum(map(math.exp, row))
    if not (math.isfinite(s) and s > 0.0 and math.isfinite(m)):
        return PositionResult(math.inf, False, False)
    log_z = math.log(s) + (m if shifted else 0.0)

    kl = 0.0
    q_head = 0.0
    for i, lp in zip(ref.ids, ref.logprobs):
        lq = row[i] - log_z
        kl += math.exp(lp) * (lp - lq)
        q_head += math.exp(lq)
    if ref.tail > 0.0:
        q_rest = 1.0 - q_head
        if q_rest < 1e-9:
            # 1 - q_head has lost q_rest's digits (a peaked row: its head holds all but ~1e-16 of
            # the mass); sum the tail itself. Rare, so the extra pass over the row costs little.
            rest = array.array("f", row)
            for i in ref.ids:
                rest[i] = -math.inf
            q_rest = sum(map(math.exp, map((-log_z).__add__, rest)))
        kl = kl + ref.tail * math.log(ref.tail / q_rest) if q_rest > 0.0 else math.inf
    kl = max(kl, 0.0)  # Gibbs: >= 0; float32 log-probs leave ~1e-7 of noise around 0

    # Agreement: llama.cpp's argmax is an argmax of ours, or ours is one of llama.cpp's tied
    # argmaxes (exact ties are resolved differently by the two sorts).
    ref_top = ref.ids[0]
    top1 = row[ref_top] == m
    if not top1:
        ours_top = row.index(m)
        j = 0
        while j < len(ref.ids) and ref.logprobs[j] == ref.logprobs[0]:
            if ref.ids[j] == ours_top:
                top1 = True
                break
            j += 1
    return PositionResult(kl, top1, True)


@dataclass
class Summary:
    model: str
    n_prompts: int = 0
    n_positions: int = 0
    n_top1: int = 0
    kl_sum: float = 0.0
    kl_max: float = 0.0
    kl_max_at: str = ""
    n_nonfinite: int = 0
    tail_sum: float = 0.0
    kls: list = field(default_factory=list)
    per_prompt: list = field(default_factory=list)

    def to_json(self) -> dict:
        n = max(1, self.n_positions)
        kls = sorted(self.kls)
        top1 = self.n_top1 / n
        mean_kl = self.kl_sum / n
        ok = top1 >= TOP1_MIN and mean_kl <= MEAN_KL_MAX and self.n_nonfinite == 0
        return {
            "model": self.model,
            "n_prompts": self.n_prompts,
            "n_positions": self.n_positions,
            "top1_agreement": top1,
            "mean_kl": mean_kl,
            "max_kl": self.kl_max,
            "max_kl_at": self.kl_max_at,
            "p99_kl": kls[min(len(kls) - 1, int(0.99 * len(kls)))] if kls else 0.0,
            "n_nonfinite": self.n_nonfinite,
            "ref_tail_mass_mean": self.tail_sum / n,
            "bars": {"top1_min": TOP1_MIN, "mean_kl_max": MEAN_KL_MAX},
            "verdict": "PASS" if ok else "FAIL",
            "per_prompt": self.per_prompt,
        }


def _ref_record_offsets(fr, n_positions: list[int]) -> tuple[list[int], int]:
    """The byte offset of each prompt's first record in an open ref.bin (positioned at its first
    record), and the offset after the last record counted."""
    offsets = []
    pos = fr.tell()
    for n_pos in n_positions:
        offsets.append(pos)
        for _ in range(n_pos):
            fr.seek(pos)
            head = fr.read(12)
            if len(head) != 12:
                raise ParityError(f"{fr.name}: truncated record")
            (k,) = struct.unpack("<I", head[:4])
            pos += 12 + 8 * k
    return offsets, pos


def _compare_prompt(job) -> list[tuple[float, bool, bool, float]]:
    """One prompt's positions (a worker process's unit): (kl, top1, finite, ref tail) each."""
    ref_bin, ref_off, ours_bin, ours_off, n_vocab, n_pos = job
    out = []
    with open(ref_bin, "rb") as fr, open(ours_bin, "rb") as fo:
        fr.seek(ref_off)
        fo.seek(ours_off)
        for _ in range(n_pos):
            ref = read_ref_record(fr)
            res = compare_position(ref, read_logits_row(fo, n_vocab))
            out.append((res.kl, res.top1, res.finite, ref.tail))
    return out


def compare_files(model: str, ref_bin: Path, ours_bin: Path, prompt_ids: list[str],
                  max_prompts: int = 0, workers: int = 0) -> dict:
    """Compares the two files position by position; max_prompts > 0 uses only the first
    max_prompts prompts of ref_bin (a reference computed for more prompts than mererun's run).
    The prompts are compared in `workers` processes (0: up to the CPU count, at most 4); the
    results are summed in position order, so the report does not depend on the worker count."""
    s = Summary(model)
    with open(ref_bin, "rb") as fr, open(ours_bin, "rb") as fo:
        v_ref, n_ref = read_header(fr, b"LCRF")
        v_ours, n_ours = read_header(fo, b"MRLG")
        ref_is_longer = 0 < max_prompts < len(n_ref)
        if ref_is_longer:
            n_ref = n_ref[:max_prompts]
        if v_ref != v_ours:
            raise ParityError(f"n_vocab differs: llama.cpp {v_ref}, mererun {v_ours}")
        if n_ref != n_ours:
            raise ParityError(f"prompt/position counts differ: llama.cpp {len(n_ref)} prompts "
                              f"{sum(n_ref)} positions, mererun {len(n_ours)} prompts "
                              f"{sum(n_ours)} positions")
        ref_offsets, ref_end = _ref_record_offsets(fr, n_ref)
        ours_start = fo.tell()
        row_bytes = 4 * v_ours
        ours_end = ours_start + row_bytes * sum(n_ours)
        if (not ref_is_longer and os.fstat(fr.fileno()).st_size > ref_end) or \
                os.fstat(fo.fileno()).st_size > ours_end:
            raise ParityError("trailing data after the last position (file/count mismatch)")
        if os.fstat(fo.fileno()).st_size < ours_end:
            raise ParityError(f"{fo.name}: truncated logits")
    jobs = []
    ours_off = ours_start
    for pi, n_pos in enumerate(n_ref):
        jobs.append((str(ref_bin), ref_offsets[pi], str(ours_bin), ours_off, v_ours, n_pos))
        ours_off += row_bytes * n_pos
    n_workers = workers or min(4, os.cpu_count() or 1)
    if n_workers > 1 and len(jobs) > 1:
        with concurrent.futures.ProcessPoolExecutor(max_workers=n_workers) as pool:
            per_prompt = list(pool.map(_compare_prompt, jobs))
    else:
        per_prompt = [_compare_prompt(j) for j in jobs]
    for pi, (n_pos, results) in enumerate(zip(n_ref, per_prompt)):
        pid = prompt_ids[pi] if pi < len(prompt_ids) else f"#{pi}"
        p_top1 = 0
        p_kl = 0.0
        for pos, (kl, top1, finite, tail) in enumerate(results):
            s.n_positions += 1
            s.tail_sum += tail
            s.kls.append(kl)
            if not finite:
                s.n_nonfinite += 1
            if top1:
                s.n_top1 += 1
                p_top1 += 1
            s.kl_sum += kl
            p_kl += kl
            if kl > s.kl_max or not s.kl_max_at:
                s.kl_max, s.kl_max_at = kl, f"{pid}@{pos}"
        s.n_prompts += 1
        s.per_prompt.append({"id": pid, "n_positions": n_pos,
                             "top1_agreement": p_top1 / max(1, n_pos),
                             "mean_kl": p_kl / max(1, n_pos)})
    return s.to_json()


def record_from_row(row: array.array, k: int) -> RefRecord:
    """The top-k tokens of a full logits row with their log-probabilities and the tail mass: the
    form llama.cpp's side is recorded in, so both sides can be measured against the exact one
    with the same coarsened KL."""
    m = max(row)
    log_z = m + math.log(sum(math.exp(x - m) for x in row))
    top = heapq.nlargest(k, range(len(row)), key=row.__getitem__)
    ids = array.array("i", top)
    lps = array.array("f", [row[i] - log_z for i in top])
    tail = max(0.0, 1.0 - sum(math.exp(row[i] - log_z) for i in top))
    return RefRecord(ids, lps, tail)


def compare_vs_exact(model: str, ref_bin: Path, ours_bin: Path, exact_bin: Path, max_prompts: int) -> dict:
    """llama.cpp and mererun's fast path, each against mererun's exact FP32 path (`logits --ref`)
    with one metric: KL(side || exact) on the side's top-K tokens plus a tail bucket (K = llama.cpp's
    K at that position), and top-1 agreement with the exact argmax. The fast path is "as faithful
    as llama.cpp" when its mean KL is no higher and its top-1 no lower (native-kernels issue)."""
    sides = {"llamacpp": Summary(model), "mererun": Summary(model)}
    with open(ref_bin, "rb") as fr, open(ours_bin, "rb") as fo, open(exact_bin, "rb") as fe:
        v_ref, n_ref = read_header(fr, b"LCRF")
        v_ours, n_ours = read_header(fo, b"MRLG")
        v_ex, n_ex = read_header(fe, b"MRLG")
        n_ref = n_ref[:max_prompts] if 0 < max_prompts < len(n_ref) else n_ref
        if not (v_ref == v_ours == v_ex and n_ref == n_ours == n_ex):
            raise ParityError("the llama.cpp, fast and exact files cover different prompts or vocabularies")
        for pi, n_pos in enumerate(n_ref):
            for pos in range(n_pos):
                llama = read_ref_record(fr)
                ours = record_from_row(read_logits_row(fo, v_ours), len(llama.ids))
                exact = read_logits_row(fe, v_ex)
                for name, rec in (("llamacpp", llama), ("mererun", ours)):
                    res = compare_position(rec, exact)
                    s = sides[name]
                    s.n_positions += 1
                    s.kls.append(res.kl)
                    s.kl_sum += res.kl
                    s.n_top1 += res.top1
                    s.n_nonfinite += not res.finite
                    if res.kl > s.kl_max or not s.kl_max_at:
                        s.kl_max, s.kl_max_at = res.kl, f"#{pi}@{pos}"
            for s in sides.values():
                s.n_prompts += 1
    out = {}
    for name, s in sides.items():
        j = s.to_json()
        out[name] = {k: j[k] for k in ("n_positions", "top1_agreement", "mean_kl", "p99_kl", "max_kl")}
    out["as_faithful"] = (out["mererun"]["mean_kl"] <= out["llamacpp"]["mean_kl"]
                          and out["mererun"]["top1_agreement"] >= out["llamacpp"]["top1_agreement"])
    return out


# --------------------------------------------------------------------------------------------
# Running the two sides.

def prompt_ids(prompts: Path, limit: int) -> list[str]:
    ids = []
    for n, line in enumerate(prompts.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            ids.append(json.loads(line).get("id", f"line{n}"))
    return ids[:limit] if limit > 0 else ids


def usable_ref_prompts(ref_dir: Path, model_path: Path, prompts: Path, limit: int) -> int:
    """How many leading prompts of an existing llama.cpp output in ref_dir can serve this run:
    0 when there is none or it was made from another model file, prompts file or settings; else
    the count (>= the prompts wanted). A reference for all prompts serves any --limit."""
    meta_path = ref_dir / "meta.json"
    if not (meta_path.is_file() and (ref_dir / "ref.bin").is_file()
            and (ref_dir / "tokens.json").is_file()):
        return 0
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    m = meta.get("model", {})
    if m.get("size_bytes") != model_path.stat().st_size:
        return 0
    if meta.get("prompts", {}).get("sha256") != sha256_file(prompts):
        return 0
    have = int(meta.get("n_prompts", 0))
    want = len(prompt_ids(prompts, limit))
    if have < want:
        return 0
    if m.get("path") != str(model_path) and m.get("sha256") != sha256_file(model_path):
        return 0
    return have


def run(cmd: list[str], what: str, log=sys.stderr) -> float:
    print(f"[parity] {what}: {' '.join(cmd)}", file=log, flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    dt = time.monotonic() - t0
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-20:])
        raise ParityError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return dt


def run_llamacpp(model_path: Path, prompts: Path, ref_dir: Path, limit: int, threads: int) -> float:
    if LOGITS_REF_NATIVE.is_file() and os.environ.get("MERERUN_PARITY_NODE") != "1":
        cmd = [str(LOGITS_REF_NATIVE), str(model_path), str(prompts), str(ref_dir), "--threads", str(threads)]
        if limit > 0:
            cmd += ["--limit", str(limit)]
        return run(cmd, "llama.cpp reference (native)")
    node = os.environ.get("NODE", "node")
    if shutil.which(node) is None:
        raise ParityError("node not found (node-llama-cpp needs Node.js >= 20)")
    if not (REPO / "tools" / "llamacpp" / "node_modules" / "node-llama-cpp").exists():
        raise ParityError("node-llama-cpp is not installed: run `npm ci` in tools/llamacpp")
    cmd = [node, str(LOGITS_REF), str(model_path), str(prompts), str(ref_dir),
           "--threads", str(threads)]
    if limit > 0:
        cmd += ["--limit", str(limit)]
    return run(cmd, "llama.cpp reference")


def run_mererun(binary: Path, model_path: Path, tokens: Path, out: Path, threads: int,
                extra: list[str]) -> float:
    cmd = [str(binary), "logits", "-m", str(model_path), "--tokens", str(tokens), "--out", str(out),
           "--threads", str(threads)] + extra
    return run(cmd, "mererun logits")


def parity_for_model(name_or_path: str, args) -> dict:
    name, model_path = resolve_model(name_or_path)
    work = Path(args.work_dir) / name
    work.mkdir(parents=True, exist_ok=True)
    prompts = Path(args.prompts).resolve()
    ref_dir = Path(args.ref_dir) if args.ref_dir else work / "ref"
    ids = prompt_ids(prompts, args.limit)
    timings = {}
    have = 0 if args.fresh else usable_ref_prompts(ref_dir, model_path, prompts, args.limit)
    if have:
        print(f"[parity] {name}: reusing llama.cpp reference in {ref_dir} "
              f"({len(ids)} of its {have} prompts)", file=sys.stderr)
        timings["llamacpp_s"] = None
    else:
        if args.ref_dir and not args.fresh and (ref_dir / "ref.bin").exists():
            raise ParityError(f"{ref_dir} holds a llama.cpp reference for another model, prompts "
                              f"file or fewer prompts; pass --fresh to overwrite it, or another "
                              f"--ref-dir")
        timings["llamacpp_s"] = run_llamacpp(model_path, prompts, ref_dir, args.limit, args.threads)
        have = len(ids)
    tokens = ref_dir / "tokens.json"
    if have > len(ids):  # mererun evaluates only the prompts compared
        all_tokens = json.loads(tokens.read_text(encoding="utf-8"))
        tokens = work / "tokens.json"
        tokens.write_text(json.dumps(all_tokens[:len(ids)]) + "\n", encoding="utf-8")
    if args.ours:
        ours = Path(args.ours)
        timings["mererun_s"] = None
    else:
        ours = work / "ours.mrlg"
        timings["mererun_s"] = run_mererun(find_mererun(args.mererun), model_path, tokens, ours,
                                           args.threads, args.mererun_arg)
    t0 = time.monotonic()
    result = compare_files(name, ref_dir / "ref.bin", ours, ids, max_prompts=len(ids))
    timings["compare_s"] = time.monotonic() - t0
    if args.vs_exact:
        exact = Path(args.exact) if args.exact else work / "exact.mrlg"
        timings["mererun_exact_s"] = None if args.exact else run_mererun(find_mererun(args.mererun), model_path, tokens, exact,
                                                 args.threads, [a for a in args.mererun_arg if a != "--ref"] + ["--ref"])
        result["vs_exact"] = compare_vs_exact(name, ref_dir / "ref.bin", ours, exact, len(ids))
    meta = json.loads((ref_dir / "meta.json").read_text(encoding="utf-8"))
    result.update({
        "model_path": str(model_path),
        "llamacpp": {k: meta.get(k) for k in ("node_llama_cpp", "llama_cpp_release", "cpu_backend",
                                              "settings", "k_mean", "tail_mass_max")},
        "timings_s": timings,
    })
    return result


def format_table(results: list[dict]) -> str:
    head = (f"{'model':<30} {'prompts':>7} {'positions':>9} {'top1':>7} {'mean KL':>9} "
            f"{'p99 KL':>9} {'max KL':>9}  {'verdict'}")
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(f"{r['model'][:30]:<30} {r['n_prompts']:>7} {r['n_positions']:>9} "
                     f"{r['top1_agreement']:>7.4f} {r['mean_kl']:>9.5f} {r['p99_kl']:>9.5f} "
                     f"{r['max_kl']:>9.5f}  {r['verdict']}"
                     + (f" ({r['n_nonfinite']} non-finite)" if r["n_nonfinite"] else ""))
    lines.append(f"bars: top1 >= {TOP1_MIN}, mean KL(llama.cpp || mererun) <= {MEAN_KL_MAX} nats")
    for r in results:
        v = r.get("vs_exact")
        if not v:
            continue
        lines.append(f"{r['model'][:30]} against mererun's exact path (KL(side || exact), top-1 of the exact argmax):")
        for side in ("llamacpp", "mererun"):
            e = v[side]
            lines.append(f"  {side:<10} top1 {e['top1_agreement']:.4f}  mean KL {e['mean_kl']:.5f}  "
                         f"p99 KL {e['p99_kl']:.5f}  max KL {e['max_kl']:.5f}")
        lines.append(f"  mererun as faithful as llama.cpp: {'yes' if v['as_faithful'] else 'NO'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", default=[],
                    help="catalog name, alias or GGUF path (repeatable)")
    ap.add_argument("--all", action="store_true", help="every catalog model with status confirmed")
    ap.add_argument("--prompts", default=str(DEFAULT_PROMPTS))
    ap.add_argument("--limit", type=int, default=0, help="first N prompts only (0 = all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mererun", help="mererun binary (default $MERERUN_BIN or build/bin/mererun)")
    ap.add_argument("--mererun-arg", action="append", default=[],
                    help="extra argument for `mererun logits` (repeatable), e.g. --ref")
    ap.add_argument("--work-dir", default=os.environ.get("MERERUN_PARITY_DIR",
                                                         "/tmp/mererun-parity"))
    ap.add_argument("--ref-dir", help="llama.cpp side: reused when made from the same model and "
                                      "prompts (a run over all prompts serves any --limit), else "
                                      "written here if empty (single model only)")
    ap.add_argument("--fresh", action="store_true",
                    help="always rerun llama.cpp (overwriting --ref-dir)")
    ap.add_argument("--ours", help="precomputed `mererun logits` output (single model only)")
    ap.add_argument("--vs-exact", action="store_true",
                    help="also measure llama.cpp and mererun (as run) against mererun's exact FP32 "
                         "path (`logits --ref`) with one metric")
    ap.add_argument("--exact", help="with --vs-exact: a precomputed `mererun logits --ref` output "
                                    "(single model only)")
    ap.add_argument("--json-out", help="write the JSON report here")
    ap.add_argument("--json", action="store_true", help="print the JSON report instead of a table")
    args = ap.parse_args(argv)

    models = list(args.model)
    if args.all:
        models += [e["name"] for e in load_catalog() if e.get("status") == "confirmed"]
    if not models:
        ap.error("give --model NAME_OR_PATH (repeatable) or --all")
    if len(models) > 1 and (args.ref_dir or args.ours or args.exact):
        ap.error("--ref-dir, --ours and --exact apply to a single model")

    results = []
    failed = False
    for m in models:
        try:
            results.append(parity_for_model(m, args))
        except ParityError as e:
            print(f"[parity] {m}: {e}", file=sys.stderr)
            failed = True
    report = {"results": results}
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps(report, indent=2))
    elif results:
        print(format_table(results))
    if failed:
        return 2
    return 0 if all(r["verdict"] == "PASS" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
