"""`mererun qualify report`: one self-contained HTML page from qualify results, rendered in
headless Chromium (Debian's package); the screenshot must show the plots, not a blank page."""
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
INPUTS = ["2026-12-04-tasks-0.5b.json", "spec-http-smollm2.json", "2026-12-04-qual-smollm2-4x512.json",
          "2026-12-04-claude-code-1.5b.json",
          "2026-12-04-deploy.json"]
CANDIDATE_RGB = (0xDD, 0x84, 0x52)  # the report's candidate colour


def png_pixels(data: bytes):
    """(width, height, rows of RGB(A) bytes) of an 8-bit RGB/RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and ctype in (2, 6), (depth, ctype)
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


def test_report_renders_in_a_real_browser(run_mererun, tmp_path):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("chromium is missing; scripts/setup.sh installs it (apt-get install chromium)")
    out = tmp_path / "report.html"
    r = run_mererun("qualify", "report", *[RESULTS / f for f in INPUTS], tmp_path / "nonsense.json", "-o", out)
    assert r.returncode != 0 and "nonsense.json" in r.stderr  # a missing input is an error, not a skip
    (tmp_path / "other.json").write_text('{"schema": "something-else/1"}')
    r = run_mererun("qualify", "report", *[RESULTS / f for f in INPUTS], tmp_path / "other.json", "-o", out)
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert page.count("<svg") >= 6 and "Not a qualify result this report knows" in page
    for title in ("Tasks: qwen2.5-coder-0.5b-instruct", "Speed: smollm2-135m-instruct", "Likelihood:",
                  "Replicas behind HAProxy", "Claude Code sessions: qwen2.5-coder-1.5b-instruct"):
        assert title in page, title
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1000,1400", f"--screenshot={shot}", out.as_uri()],
                   capture_output=True, timeout=120)
    assert shot.exists(), "chromium wrote no screenshot"
    w, h, bpp, rows = png_pixels(shot.read_bytes())
    assert (w, h) == (1000, 1400)
    px = [row[i:i + 3] for row in rows[::4] for i in range(0, len(row), bpp * 4)]
    non_white = sum(1 for p in px if p != b"\xff\xff\xff")
    orange = sum(1 for p in px if all(abs(p[k] - CANDIDATE_RGB[k]) <= 12 for k in range(3)))
    assert non_white > 0.02 * len(px), f"the page looks blank: {non_white} of {len(px)} sampled pixels not white"
    assert orange > 20, "no candidate-coloured plot marks on the first screen"
