"""Text out of a file a user attaches: plain text, Markdown, source code, HTML, PDF, DOCX.

A document is read as a foreign file (`open_regular`, never more than `MAX_FILE_BYTES`). Text
files are decoded here: UTF-8 (with or without a BOM), UTF-16 or UTF-32 with a BOM, else
Windows-1252 when the bytes are text in it; a file with NUL bytes and no BOM is refused as
binary. HTML, PDF and DOCX are parsed in a process of their own (`pypdf`, `python-docx` and
the standard library's HTML parser), under a memory limit and a time limit, and the caller can
cancel it: a pathological PDF (deep nesting, huge streams) or a zip bomb costs that process,
never the window or the engine. A DOCX is checked before it is opened: the sizes its zip
declares, their sum and their ratio to the file. Every failure is a `DocumentError` with one
line for the user; nothing is half-read.
"""

from __future__ import annotations

import codecs
import hashlib
import html.parser
import io
import multiprocessing
import multiprocessing.connection
import re
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from engine.core.attachments import Document, DocumentKind
from engine.core.errors import ArborError
from engine.files.regular import NotRegularFileError, open_regular

MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_TEXT_CHARS = 4_000_000  # about a million tokens: far past any context
MAX_UNZIPPED_BYTES = 256 * 1024 * 1024  # what a DOCX may declare, all parts together
MAX_ZIP_RATIO = 200  # declared size over compressed size, per part (a bomb is 1000s)
MAX_ZIP_PARTS = 10_000
EXTRACT_SECONDS = 60.0
EXTRACT_MEMORY = 1536 * 1024 * 1024  # the parsing process's address space
_POLL = 0.05


class DocumentError(ArborError):
    """A document that cannot be attached; the message says why in one line."""


_CODE = {".py", ".js", ".ts", ".tsx", ".jsx", ".c", ".h", ".cc", ".cpp", ".hpp", ".rs",
         ".go", ".java", ".kt", ".swift", ".rb", ".php", ".cs", ".sh", ".bash", ".zsh",
         ".sql", ".json", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".xml", ".css", ".scss",
         ".lua", ".r", ".m", ".pl", ".hs", ".scala", ".dart", ".vue", ".svelte", ".cmake",
         ".gradle", ".proto", ".tex", ".jinja", ".j2", ".csv", ".tsv", ".log", ".diff",
         ".patch", ".mk"}
_MARKDOWN = {".md", ".markdown", ".mdx", ".rst"}
_HTML = {".html", ".htm", ".xhtml"}
SUFFIXES = frozenset({".txt", ".text", *_CODE, *_MARKDOWN, *_HTML, ".pdf", ".docx"})


CancelFn = Callable[[], bool]


def kind_of(name: str, head: bytes) -> DocumentKind:
    """What a file is, from its name and first bytes (a PDF or a zip says so itself)."""
    suffix = Path(name).suffix.lower()
    if head.startswith(b"%PDF-") or suffix == ".pdf":
        return DocumentKind.PDF
    if suffix == ".docx":
        return DocumentKind.DOCX
    if suffix in _HTML:
        return DocumentKind.HTML
    if suffix in _MARKDOWN:
        return DocumentKind.MARKDOWN
    if suffix in _CODE:
        return DocumentKind.CODE
    return DocumentKind.TEXT


def read_document(path: Path, *, cancel: CancelFn | None = None,
                  seconds: float = EXTRACT_SECONDS, memory: int = EXTRACT_MEMORY) -> Document:
    """The text of the file at `path`. Blocks: run it off the GUI thread. `cancel` is asked
    while a PDF, DOCX or HTML file is parsed; once it says so, the parsing process is killed
    and `DocumentError` says the attachment was cancelled."""
    try:
        with open_regular(path) as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except NotRegularFileError:
        raise DocumentError(f"{path.name} is not a regular file") from None
    except OSError as exc:
        raise DocumentError(f"{path.name} cannot be read: {exc.strerror or exc}") from None
    return document_from_bytes(path.name, data, cancel=cancel, seconds=seconds, memory=memory)


def document_from_bytes(name: str, data: bytes, *, cancel: CancelFn | None = None,
                        seconds: float = EXTRACT_SECONDS, memory: int = EXTRACT_MEMORY
                        ) -> Document:
    """The text of a file called `name` whose bytes are `data` (a file the API was sent)."""
    name = _shown_name(name)
    if len(data) > MAX_FILE_BYTES:
        raise DocumentError(f"{name} is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
    if not data:
        raise DocumentError(f"{name} is empty")
    kind = kind_of(name, data[:8])
    if kind is DocumentKind.DOCX:
        _check_zip(name, data)
    if kind in (DocumentKind.PDF, DocumentKind.DOCX, DocumentKind.HTML):
        text = _in_child(kind, name, data, cancel, seconds, memory)
    else:
        text = decode_text(name, data)
    text = _tidy(text)
    if len(text) > MAX_TEXT_CHARS:
        raise DocumentError(f"{name} holds more than {MAX_TEXT_CHARS:,} characters of text")
    if not text.strip():
        raise DocumentError(f"{name} holds no text" + (
            " (a scanned PDF has only images of its pages)" if kind is DocumentKind.PDF else ""))
    return Document(name, kind, text, hashlib.sha256(data).hexdigest(), len(data))


def _shown_name(name: str) -> str:
    """A file name as it is shown and given to the model: its last part, printable, short."""
    base = re.split(r"[\\/]", name)[-1]
    base = "".join(c if c.isprintable() else "?" for c in base).strip() or "document"
    return base if len(base) <= 200 else base[:197] + "..."


_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
         (codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"),
         (codecs.BOM_UTF16_BE, "utf-16"))


def decode_text(name: str, data: bytes) -> str:
    """A text file's characters (see the module's docstring for the encodings tried)."""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            try:
                return data.decode(encoding)
            except UnicodeDecodeError:
                raise DocumentError(f"{name} says it is {encoding.upper()} but is not") from None
    if b"\x00" in data:
        raise DocumentError(f"{name} is not a text file (it holds binary data)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    try:
        text = data.decode("cp1252")
    except UnicodeDecodeError:
        raise DocumentError(f"{name} is in an encoding Arbor cannot tell: save it as UTF-8"
                            ) from None
    controls = sum(1 for c in text if ord(c) < 32 and c not in "\t\n\r\f")
    if controls > len(text) // 100:
        raise DocumentError(f"{name} is in an encoding Arbor cannot tell: save it as UTF-8")
    return text


def _tidy(text: str) -> str:
    """Line ends as \\n, no trailing spaces, at most two blank lines in a row."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    text = re.sub(r"[ \t]+\n", "\n", text)
    return re.sub(r"\n{4,}", "\n\n\n", text).strip("\n")


def _check_zip(name: str, data: bytes) -> None:
    """A DOCX's zip, checked from its directory before any part is inflated."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError, OSError):
        raise DocumentError(f"{name} is not a Word document (its zip is damaged)") from None
    with archive:
        parts = archive.infolist()
        if len(parts) > MAX_ZIP_PARTS:
            raise DocumentError(f"{name} has {len(parts):,} parts: refused")
        total = 0
        for part in parts:
            total += part.file_size
            ratio = part.file_size / max(part.compress_size, 1)
            if part.file_size > 1024 * 1024 and ratio > MAX_ZIP_RATIO:
                raise DocumentError(f"{name} inflates {ratio:,.0f} times its size (a zip bomb):"
                                    " refused")
        if total > MAX_UNZIPPED_BYTES:
            raise DocumentError(f"{name} would inflate to {total / 2**20:,.0f} MiB: refused")
        if "word/document.xml" not in archive.namelist():
            raise DocumentError(f"{name} is not a Word document (no word/document.xml)")


def _in_child(kind: DocumentKind, name: str, data: bytes, cancel: CancelFn | None,
              seconds: float, memory: int) -> str:
    """Parse in a process of its own, bounded in memory and time, killed on `cancel`."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child_main, args=(send, kind.value, data, memory),
                            name="arbor-document", daemon=True)
    child.start()
    send.close()
    deadline = time.monotonic() + seconds
    try:
        while not receive.poll(_POLL):
            if cancel is not None and cancel():
                raise DocumentError(f"attaching {name} was cancelled")
            if time.monotonic() > deadline:
                raise DocumentError(f"{name} took longer than {seconds:.0f} s to read: refused")
            if not child.is_alive() and not receive.poll(0):
                raise DocumentError(f"{name} could not be read: it needs more memory than "
                                    "a document may take, or it crashed the reader")
        try:
            ok, value = receive.recv()
        except (EOFError, OSError):
            raise DocumentError(f"{name} could not be read: the reader stopped") from None
    finally:
        receive.close()
        if child.is_alive():
            child.kill()
        child.join(5)
    if not ok:
        raise DocumentError(f"{name} {value}")
    return str(value)


def _child_main(send: multiprocessing.connection.Connection, kind: str, data: bytes,
                memory: int) -> None:
    """The parsing process: one document, then exit."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    except (ImportError, ValueError, OSError):  # not on Windows; the time limit still holds
        pass
    sys.setrecursionlimit(10_000)
    try:
        text = _PARSERS[DocumentKind(kind)](data)
        send.send((True, text[:MAX_TEXT_CHARS + 1]))
    except DocumentError as exc:
        send.send((False, str(exc)))
    except MemoryError:
        send.send((False, "needs more memory than a document may take"))
    except RecursionError:
        send.send((False, "is nested too deeply to read"))
    except Exception as exc:  # a parser fails in many ways on a damaged file
        send.send((False, f"could not be read ({type(exc).__name__}: {str(exc)[:120]})"))
    finally:
        send.close()


def _pdf_text(data: bytes) -> str:
    import logging

    import pypdf

    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        reader = pypdf.PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted and not reader.decrypt(""):
            raise DocumentError("is encrypted: open it with its password and save a copy "
                                "without one")
    except pypdf.errors.FileNotDecryptedError:
        raise DocumentError("is encrypted: open it with its password and save a copy "
                            "without one") from None
    except pypdf.errors.PdfReadError as exc:
        raise DocumentError(f"is not a readable PDF ({exc})") from None
    pages = []
    total = 0
    for number, page in enumerate(reader.pages, 1):
        try:
            text = page.extract_text() or ""
        except pypdf.errors.LimitReachedError:
            raise DocumentError(f"has a stream on page {number} that inflates past what a "
                                "document may take (a decompression bomb)") from None
        pages.append(f"[page {number}]\n{text.strip()}")
        total += len(text)
        if total > MAX_TEXT_CHARS:
            break
    return "\n\n".join(pages) if total else ""


def _docx_text(data: bytes) -> str:
    import docx

    document = docx.Document(io.BytesIO(data))
    lines = [paragraph.text for paragraph in document.paragraphs]
    for table in document.tables:
        for row in table.rows:
            lines.append(" | ".join(cell.text.strip() for cell in row.cells))
    return "\n".join(lines)


class _HtmlText(html.parser.HTMLParser):
    """The text a browser shows, roughly: no script, style or head; blocks on lines."""

    _SKIP = frozenset({"script", "style", "head", "noscript", "template", "svg"})
    _BLOCK = frozenset({"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6",
                        "section", "article", "header", "footer", "pre", "blockquote",
                        "table", "ul", "ol", "hr", "dt", "dd"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._SKIP:
            self._skipping += 1
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP:
            self._skipping = max(0, self._skipping - 1)
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self.parts.append(data)


def _html_text(data: bytes) -> str:
    head = data[:2048].decode("ascii", errors="replace").lower()
    declared = re.search(r"charset=[\"']?([\w-]+)", head)
    try:
        text = data.decode(declared.group(1) if declared else "utf-8")
    except (LookupError, UnicodeDecodeError):
        text = decode_text("the page", data)
    parser = _HtmlText()
    parser.feed(text)
    parser.close()
    lines = [re.sub(r"[ \t\u00a0]+", " ", line).strip() for line in "".join(parser.parts)
             .split("\n")]
    return "\n".join(lines)


_PARSERS: dict[DocumentKind, Callable[[bytes], str]] = {
    DocumentKind.PDF: _pdf_text, DocumentKind.DOCX: _docx_text, DocumentKind.HTML: _html_text,
}
