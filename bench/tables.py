#!/usr/bin/env python3
"""Markdown tables from `mererun bench --json` / `mererun qualify likelihood --json` records
(the tables of docs/performance.md).

    python3 bench/tables.py RESULT.json [RESULT.json ...]
"""
import json
import sys


def bench_tables(j):
    out = []
    c = j["cpu"]
    out.append(f"Run {j['date']}, commit {(j['git']['commit'] or '?')[:10]}{' (dirty)' if j['git']['dirty'] else ''}, "
               f"{c['model']} ({', '.join(c['flags'])}), {c['logical_cpus']} CPUs, load average "
               f"{j['load_average_start']:.1f} → {j['load_average_end']:.1f}, {j['options']['reps']} repetition(s).\n")
    m = j["machine"]
    out.append("| threads | read GB/s median (wall) | best (wall) | median by thread CPU time |")
    out.append("|---|---|---|---|")
    for b in m["mem_bandwidth"]:
        cpu = f"{b['gbps_cpu_median']:.1f}" if "gbps_cpu_median" in b else "not recorded"
        out.append(f"| {b['threads']} | {b['gbps_median']:.1f} | {b['gbps_max']:.1f} | {cpu} |")
    out.append("")
    out.append(f"Q8/g64 matmul ({m['matmul']['cpu_variant']}), weight GB/s wall"
               + (" / by thread CPU time" if "gbps_cpu" in m["matmul"]["points"][0] else "") + ":\n")
    out.append("| shape | threads | 1 row | 2 rows | 4 rows | 8 rows |")
    out.append("|---|---|---|---|---|---|")
    pts = m["matmul"]["points"]
    for i in range(0, len(pts), 4):
        cells = []
        for p in pts[i:i + 4]:
            cells.append(f"{p['gbps']:.1f}" + (f" / {p['gbps_cpu']:.1f}" if "gbps_cpu" in p else ""))
        out.append(f"| {pts[i]['rows']}x{pts[i]['cols']} | {pts[i]['threads']} | " + " | ".join(cells) + " |")
    out.append("")
    if not j["models"]:
        return "\n".join(out)
    out.append("| model | engine | threads | prefill tok/s | decode tok/s | % roofline | v2/v1 | v4/v1 | v8/v1 |")
    out.append("|---|---|---|---|---|---|---|---|---|")

    def row(name, engine, r):
        v = r["verify_ratio_vs_1"]
        out.append(f"| {name} | {engine} | {r['threads']} | {r['prefill_tok_s']:.1f} | {r['decode_tok_s']:.2f} | "
                   f"{r.get('roofline_pct', 0):.0f}% | {v.get('2', 0):.2f} | {v.get('4', 0):.2f} | {v.get('8', 0):.2f} |")

    ratios = []
    for mod in j["models"]:
        for r in mod["mererun"]:
            row(mod["name"], "mererun (Q8/g64)", r)
        lc = mod.get("llamacpp")
        if isinstance(lc, dict):
            for label in ("gguf", "q8_0"):
                if label in lc:
                    for r in lc[label]["by_threads"]:
                        row(mod["name"], f"llama.cpp {label}", r)
            for r in lc.get("mererun_over_llamacpp", []):
                ratios.append((mod["name"], r))
    if ratios:
        out.append("")
        out.append("mererun / llama.cpp (> 1: mererun faster):\n")
        out.append("| model | threads | prefill vs GGUF | decode vs GGUF | prefill vs Q8_0 | decode vs Q8_0 |")
        out.append("|---|---|---|---|---|---|")
        for name, r in ratios:
            out.append(f"| {name} | {r['threads']} | {r.get('prefill_vs_gguf', 0):.2f} | {r.get('decode_vs_gguf', 0):.2f} | "
                       f"{r.get('prefill_vs_q8_0', 0):.2f} | {r.get('decode_vs_q8_0', 0):.2f} |")
    return "\n".join(out)


def qualify_row(j):
    lo, hi = j["ppl_ratio_ci95"]
    return (f"| {j['model']['name']} | {j['reference']['config']} | {j['candidate']['config']} | "
            f"{j['windows']} x {j['positions_per_window']} | {j['ppl_reference']:.4f} | {j['ppl_candidate']:.4f} | "
            f"{j['ppl_ratio']:.5f} | {j['ppl_ratio_upper95']:.5f} ({lo:.4f}–{hi:.4f}) | {j['top1_agreement']:.4f} | "
            f"{j['mean_kl']:.2e} | {j['verdict']} |")


def main():
    qual = []
    for path in sys.argv[1:]:
        j = json.load(open(path))
        if j["schema"].startswith("mererun-bench"):
            print(bench_tables(j) + "\n")
        else:
            qual.append(j)
    if qual:
        print("| model | reference | candidate | windows x positions | ppl ref | ppl cand | ratio | "
              "upper 95% (interval) | top-1 agree | mean KL | verdict (bar 1.001) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for j in qual:
            print(qualify_row(j))


if __name__ == "__main__":
    main()
