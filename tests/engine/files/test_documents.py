"""Attached documents: text out of every kind of file, and a clear refusal of bad ones.

The PDFs are written here by hand (a page with a text stream) and with pypdf (encryption);
the DOCX with python-docx; the bombs with zlib and zipfile. Each bad file gets one line that
says what is wrong, and its parsing process is gone afterwards.
"""

from __future__ import annotations

import io
import multiprocessing
import zipfile
import zlib
from pathlib import Path

import docx
import pypdf
import pytest

from engine.core.attachments import DocumentKind
from engine.files.documents import (
    DocumentError,
    decode_text,
    document_from_bytes,
    read_document,
)

pytestmark = pytest.mark.engine_process  # HTML, PDF and DOCX are read in a process of their own


def _pdf(*pages: str, extra: bytes = b"") -> bytes:
    """A PDF with one page per text, each in Helvetica (objects written by hand)."""
    objects: list[bytes] = []
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(len(pages)))
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode())
    font = 3 + 2 * len(pages)
    for i, text in enumerate(pages):
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents "
                       f"{4 + 2 * i} 0 R /Resources << /Font << /F1 {font} 0 R >> >> >>"
                       .encode())
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    out.write(extra)
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n"
              % (len(objects) + 1, xref))
    return out.getvalue()


@pytest.fixture(autouse=True)
def _no_reader_left() -> object:
    yield
    assert not [p for p in multiprocessing.active_children() if p.name == "arbor-document"]


def test_text_files_in_every_encoding_a_desktop_has() -> None:
    text = "Grüße, 日本語 — «text»\n"
    for data in (text.encode("utf-8"), b"\xef\xbb\xbf" + text.encode("utf-8"),
                 text.encode("utf-16"), text.encode("utf-32")):
        assert decode_text("a.txt", data) == text
    assert decode_text("a.txt", "café \u2013 naïve".encode("cp1252")) == "café \u2013 naïve"
    with pytest.raises(DocumentError, match="binary"):
        decode_text("a.bin", b"\x7fELF\x02\x01\x00\x00")
    with pytest.raises(DocumentError, match="cannot tell"):
        decode_text("a.txt", bytes([0x81, 0x8D, 0x8F, 0x90, 0x9D]) * 10)
    with pytest.raises(DocumentError, match="says it is UTF-16"):
        decode_text("a.txt", b"\xff\xfe" + b"\x00\xd8")  # a lone surrogate


def test_markdown_and_code_keep_their_text_and_kind(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("# Title\r\n\r\nSome *text*.   \r\n", encoding="utf-8")
    (tmp_path / "main.py").write_text("def f():\n    return 1\n", encoding="utf-8")
    md = read_document(tmp_path / "notes.md")
    assert (md.kind, md.text, md.name) == (DocumentKind.MARKDOWN, "# Title\n\nSome *text*.",
                                           "notes.md")
    code = read_document(tmp_path / "main.py")
    assert code.kind is DocumentKind.CODE and code.text == "def f():\n    return 1"
    assert len(code.sha256) == 64 and code.size == len("def f():\n    return 1\n")


def test_html_gives_the_text_a_browser_shows() -> None:
    page = (b"<html><head><title>t</title><style>p{}</style></head><body><h1>News</h1>"
            b"<script>alert('x')</script><p>Caf&eacute; &amp; bar</p><p>Two</p></body></html>")
    document = document_from_bytes("page.html", page)
    assert document.kind is DocumentKind.HTML
    assert document.text == "News\n\nCafé & bar\n\nTwo"


def test_a_pdf_gives_its_pages_text() -> None:
    document = document_from_bytes("report.pdf", _pdf("Hello page one", "And page two"))
    assert document.kind is DocumentKind.PDF
    assert "[page 1]\nHello page one" in document.text
    assert "[page 2]\nAnd page two" in document.text


def test_an_encrypted_a_malformed_and_an_empty_pdf_are_refused() -> None:
    writer = pypdf.PdfWriter()
    writer.add_blank_page(100, 100)
    writer.encrypt("secret")
    locked = io.BytesIO()
    writer.write(locked)
    with pytest.raises(DocumentError, match="encrypted"):
        document_from_bytes("locked.pdf", locked.getvalue())
    with pytest.raises(DocumentError, match=r"report\.pdf"):
        document_from_bytes("report.pdf", b"%PDF-1.7\n" + b"garbage " * 100)
    blank = pypdf.PdfWriter()
    blank.add_blank_page(100, 100)
    scanned = io.BytesIO()
    blank.write(scanned)
    with pytest.raises(DocumentError, match="no text"):
        document_from_bytes("scan.pdf", scanned.getvalue())


def test_a_pathological_pdf_is_stopped_by_its_limits_not_by_the_window() -> None:
    # A page whose text is in arrays nested a hundred thousand deep.
    nested = b"[" * 100_000 + b"(x)" + b"]" * 100_000 + b" TJ"
    pdf = _pdf("x").replace(b"(x) Tj", nested).replace(
        b"<< /Length 37 >>", b"<< /Length %d >>" % (37 - len(b"(x) Tj") + len(nested)))
    with pytest.raises(DocumentError, match=r"nested\.pdf is nested too deeply"):
        document_from_bytes("nested.pdf", pdf)
    # A page whose content stream inflates to 512 MiB, read under a 384 MiB limit.
    bomb = zlib.compress(b"\0" * (512 * 1024 * 1024), 9)
    stream = b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(bomb) + bomb
    pdf = _pdf("x", extra=b"20 0 obj\n" + stream + b"\nendstream\nendobj\n")
    pdf = pdf.replace(b"/Contents 4 0 R", b"/Contents 20 0 R")
    with pytest.raises(DocumentError, match=r"bomb\.pdf has a stream on page 1 that inflates"):
        document_from_bytes("bomb.pdf", pdf, memory=384 * 1024 * 1024)


def test_reading_can_be_cancelled_and_has_a_time_limit() -> None:
    pdf = _pdf("Hello")
    with pytest.raises(DocumentError, match="cancelled"):
        document_from_bytes("slow.pdf", pdf, cancel=lambda: True)
    with pytest.raises(DocumentError, match="longer than"):
        document_from_bytes("slow.pdf", pdf, seconds=0.0)


def _docx(*paragraphs: str) -> bytes:
    document = docx.Document()
    for text in paragraphs:
        document.add_paragraph(text)
    table = document.add_table(rows=1, cols=2)
    table.rows[0].cells[0].text, table.rows[0].cells[1].text = "a", "b"
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def test_a_docx_gives_its_paragraphs_and_tables() -> None:
    document = document_from_bytes("letter.docx", _docx("Dear reader,", "Thank you."))
    assert document.kind is DocumentKind.DOCX
    assert document.text == "Dear reader,\nThank you.\na | b"


def test_a_zip_bomb_docx_and_a_damaged_one_are_refused_before_parsing() -> None:
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("word/document.xml", b"<" + b" " * (300 * 1024 * 1024))
    with pytest.raises(DocumentError, match="zip bomb"):
        document_from_bytes("bomb.docx", bomb.getvalue())
    with pytest.raises(DocumentError, match="damaged"):
        document_from_bytes("broken.docx", _docx("x")[:200])


def test_names_are_shown_short_and_printable_and_odd_files_are_refused(tmp_path: Path) -> None:
    document = document_from_bytes("../../etc/a\x1b[31mb.txt", b"hi")
    assert document.name == "a?[31mb.txt"
    with pytest.raises(DocumentError, match="empty"):
        document_from_bytes("e.txt", b"")
    with pytest.raises(DocumentError, match="not a regular file"):
        read_document(tmp_path)
    with pytest.raises(DocumentError, match="cannot be read"):
        read_document(tmp_path / "missing.txt")
