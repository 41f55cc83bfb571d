"""PDF and text `document` blocks through the official Anthropic SDK: a two-page PDF built here
(each page holds a code word) becomes text per page in page order with page labels, whether the
pages come in original or reversed file order; documents inside tool_result; cache write/read
counts on a repeated document; damaged, encrypted-looking, non-PDF, URL and citation requests get
actionable 400s."""
import base64

import anthropic
import pytest

from mererun_server import ServerProcess


def make_pdf(page_texts, reverse_objects=False, labels=None):
    """A minimal valid PDF: one Helvetica text line per page, correct xref offsets. With
    reverse_objects the page objects are written in reverse order in the file (the page tree
    still lists them in reading order). labels: optional /PageLabels prefix letters."""
    n = len(page_texts)
    objs = {}
    # 1 catalog, 2 pages, 3 font, then page i: 4+2i, content: 5+2i
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(n))
    catalog = "<< /Type /Catalog /Pages 2 0 R"
    if labels:
        catalog += f" /PageLabels << /Nums [0 << /S /r >>] >>"
    objs[1] = catalog + " >>"
    objs[2] = f"<< /Type /Pages /Kids [{kids}] /Count {n} >>"
    objs[3] = "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"
    for i, text in enumerate(page_texts):
        stream = f"BT /F1 18 Tf 72 720 Td ({text}) Tj ET"
        objs[4 + 2 * i] = (f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
                           f"/Resources << /Font << /F1 3 0 R >> >> /Contents {5 + 2 * i} 0 R >>")
        objs[5 + 2 * i] = f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream"
    order = sorted(objs)
    if reverse_objects:
        order = order[:3] + list(reversed(order[3:]))
    out = b"%PDF-1.4\n"
    offsets = {}
    for k in order:
        offsets[k] = len(out)
        out += f"{k} 0 obj\n{objs[k]}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n".encode()
    for k in range(1, len(objs) + 1):
        out += f"{offsets[k]:010d} 00000 n \n".encode()
    out += f"trailer\n<< /Size {len(objs) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out


def pdf_block(pdf, **extra):
    return {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                           "data": base64.b64encode(pdf).decode()}, **extra}


@pytest.fixture(scope="module")
def server(mererun_bin, model_path):
    model_path("qwen2.5-coder-0.5b-instruct")
    s = ServerProcess(mererun_bin, "qwen2.5-coder-0.5b-instruct", "-c", "4096", env={"MERERUN_LOG": "debug"})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)


QUESTION = "List the code words of the document's pages, in page order, separated by commas."


@pytest.mark.parametrize("reverse", [False, True], ids=["original", "reversed"])
def test_two_page_pdf_codes_in_page_order(client, server, reverse):
    pdf = make_pdf(["Code word: ALPHA-7", "Code word: BRAVO-9"], reverse_objects=reverse)
    msgs = [{"role": "user", "content": [pdf_block(pdf, title="codes"), {"type": "text", "text": QUESTION}]}]
    r = client.messages.create(model="m", max_tokens=30, messages=msgs, extra_body={"temperature": 0})
    text = "".join(b.text for b in r.content if b.type == "text")
    assert "ALPHA-7" in text and "BRAVO-9" in text and text.index("ALPHA-7") < text.index("BRAVO-9"), text
    # The prompt holds the pages in order with their labels (the server's debug log shows it).
    log = server.log()
    p1, p2 = log.rfind("--- Page 1 ---\nCode word: ALPHA-7"), log.rfind("--- Page 2 ---\nCode word: BRAVO-9")
    assert 0 <= p1 < p2, log[-2000:]
    # The same document again with a cache breakpoint after it: written once, then read.
    cached = [{"role": "user", "content": [pdf_block(pdf, title="codes", cache_control={"type": "ephemeral"}),
                                           {"type": "text", "text": QUESTION}]}]
    first = client.messages.create(model="m", max_tokens=1, messages=cached)
    again = client.messages.create(model="m", max_tokens=1, messages=cached)
    assert first.usage.cache_creation_input_tokens + first.usage.cache_read_input_tokens > 0
    assert again.usage.cache_read_input_tokens >= first.usage.cache_creation_input_tokens + first.usage.cache_read_input_tokens - 16


def test_page_labels_and_documents_in_tool_results(client, server):
    # Roman page labels (/PageLabels) head the pages instead of their indices.
    client.messages.create(model="m", max_tokens=1, messages=[{"role": "user", "content": [
        pdf_block(make_pdf(["first page", "second page"], labels=True))]}])
    log = server.log()
    assert 0 <= log.rfind("--- Page i ---\nfirst page") < log.rfind("--- Page ii ---\nsecond page"), log[-1500:]
    # A plain-text document and a PDF inside a tool_result.
    tool = {"name": "fetch", "description": "Fetch a file.", "input_schema": {"type": "object", "properties": {}}}
    msgs = [{"role": "user", "content": "Fetch the report."},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "fetch", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                pdf_block(make_pdf(["Total revenue: 4242 dollars"])),
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "Note: audited."}}]}]}]
    r = client.messages.create(model="m", max_tokens=30, tools=[tool], messages=msgs + [
        {"role": "assistant", "content": "The total revenue is"}], extra_body={"temperature": 0})
    text = "".join(b.text for b in r.content if b.type == "text")
    assert "4242" in text, text


def test_bad_documents_are_actionable_400s(client):
    good = make_pdf(["x"])
    cases = [
        (pdf_block(b"hello, not a pdf"), "not a PDF"),
        (pdf_block(good[:40]), "could not be read"),
        (pdf_block(good.replace(b"/Root 1 0 R", b"/Root 1 0 R /Encrypt << /Filter /Standard /V 1 /R 2 /O (x) /U (y) /P -4 >>")), "encrypted"),
        ({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "@@@@"}}, "base64"),
        ({"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}, "no network"),
        ({"type": "document", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}, "application/pdf"),
        (pdf_block(good, citations={"enabled": True}), "citations"),
    ]
    for block, text in cases:
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": [block]}])
        assert text in str(e.value), (text, str(e.value))
    # The server is still serving.
    assert client.messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": "hi"}]).content is not None
