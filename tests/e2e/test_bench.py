"""`mererun bench` smoke run: the program runs end to end on the smallest model and its JSON
record has the documented fields with positive figures. Performance itself is never asserted
(benchmarks are programs; docs/performance.md holds real runs)."""
import json


def test_bench_quick_json(run_mererun, model_path, tmp_path):
    model_path("smollm2-135m-instruct")  # skips when not pulled
    out = tmp_path / "bench.json"
    r = run_mererun("bench", "--quick", "--no-llamacpp", "-m", "smollm2-135m-instruct", "--json", out, timeout=300)
    assert r.returncode == 0, r.stderr
    j = json.loads(out.read_text())
    assert j["schema"] == "mererun-bench/1"
    assert j["git"]["commit"] is None or len(j["git"]["commit"]) == 40
    assert j["cpu"]["model"] and isinstance(j["cpu"]["flags"], list)
    assert j["options"]["threads"] == [1, 2] and j["options"]["quick"] is True
    bws = j["machine"]["mem_bandwidth"]
    assert [b["threads"] for b in bws] == [1, 2]
    assert all(b["gbps_median"] > 0 and b["gbps_max"] >= b["gbps_median"] for b in bws)
    assert all(b["gbps_cpu_median"] > 0 and b["gbps_roofline"] >= b["gbps_max"] for b in bws)
    pts = j["machine"]["matmul"]["points"]
    assert {(p["rows"], p["cols"]) for p in pts} == {(8960, 1536), (1536, 8960)}
    assert sorted({p["act_rows"] for p in pts}) == [1, 2, 4, 8, 64]
    assert all(p["gbps"] > 0 and p["gbps_cpu"] > 0 and p["ms"] > 0 and p["gops"] > 0 for p in pts)
    assert j["machine"]["matmul"]["cpu_variant"] in ("scalar", "avx2", "avx512", "avx512bf16", "amx")
    [m] = j["models"]
    assert m["name"] == "smollm2-135m-instruct" and len(m["sha256"]) == 64
    assert m["weight_bytes"] > 0 and m["llamacpp"] is None
    assert [r["threads"] for r in m["mererun"]] == [1, 2]
    for row in m["mererun"]:
        assert row["prefill_tok_s"] > 0 and row["decode_tok_s"] > 0
        assert set(row["verify_ms"]) == {"1", "2", "4", "8"}
        assert all(v > 0 for v in row["verify_ms"].values())
        assert row["verify_ratio_vs_1"]["1"] == 1.0
        assert row["roofline_tok_s"] > 0 and row["roofline_pct"] > 0
    assert "roofline" in r.stdout and "mererun" in r.stdout  # the human table


def test_bench_bad_threads(run_mererun):
    r = run_mererun("bench", "--threads", "0,x", "--no-llamacpp")
    assert r.returncode == 2
    assert "--threads" in r.stderr
