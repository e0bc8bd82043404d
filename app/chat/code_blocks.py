"""Fenced code blocks in a message's document: where they are, their exact code, their colours.

Qt's Markdown importer turns a fenced block into one `QTextBlock` per line, each marked with
`BlockCodeFence` (and `BlockCodeLanguage` when the fence names one). It also drops the
block's leading empty lines, expands leading tabs and gives two adjacent blocks the same
marks, so the document alone cannot say where one block ends or what exactly was written.
`find_code_blocks` pairs the document's runs of code lines with the fences of the Markdown
source (`fences`, a small scanner) to get both; where the two disagree (a container the
scanner does not know) a run falls back to its shown text.

`make_room` gives every block a strip above its first line (the delegate paints the language
and a copy button there) and `highlight` colours a block's tokens with Pygments: lexed once
per code text (`lexed_spans` is cached), coloured with a style's colours moved, where needed,
just far enough in lightness to be readable on the bubble (`TokenFormats`).
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass

# Pygments ships no type information (types-Pygments is a separate package): where it is not
# installed these imports are Any; where it is, the ignores are harmless.
from pygments.lexer import Lexer  # type: ignore[import-untyped, unused-ignore]
from pygments.lexers import get_lexer_by_name  # type: ignore[import-untyped, unused-ignore]
from pygments.styles import get_style_by_name  # type: ignore[import-untyped, unused-ignore]
from pygments.token import _TokenType  # type: ignore[import-untyped, unused-ignore]
from pygments.util import ClassNotFound  # type: ignore[import-untyped, unused-ignore]
from PySide6.QtCore import QRectF
from PySide6.QtGui import (
    QColor,
    QFont,
    QTextBlock,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
)

from app.look.theme import MIN_TEXT_CONTRAST, contrast_ratio

log = logging.getLogger(__name__)

# Longer code is shown plain: colouring is for reading, and a huge paste must not stall a
# paint (Pygments lexes about 1,000 lines of Python in 60 ms here, colouring them takes 30).
MAX_HIGHLIGHT_CHARS = 20_000

_KEEP_ANCHOR = QTextCursor.MoveMode.KeepAnchor  # looked up once: enum access is slow per token

_FENCE_OPEN = re.compile(r"^(?P<quote>(?:[ ]{0,3}>[ ]?)*)(?P<indent>[ ]*)(?P<fence>`{3,}|~{3,})"
                         r"(?P<info>.*)$")
_QUOTE = re.compile(r"^(?:[ ]{0,3}>[ ]?)")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class Fence:
    """A fenced code block of a Markdown source, as written."""

    language: str  # the first word of the info string, or ""
    code: str  # the lines between the fences, joined by "\n" (no final newline)


@dataclass(frozen=True)
class CodeBlock:
    """One code block of a document: its lines (block numbers) and its exact code."""

    first: int  # the block number of its first line
    last: int  # the block number of its last line
    language: str  # as Qt's importer read it ("" when the fence names none)
    code: str  # what the copy button puts on the clipboard


def fences(source: str) -> list[Fence]:
    """The fenced code blocks of Markdown `source`, in order, with their code as written.

    Handles fences at the top level, indented (in list items) and in block quotes; an
    unclosed fence runs to the end (a reply cut short). Not a full CommonMark parser:
    `find_code_blocks` checks its result against the document.
    """
    found: list[Fence] = []
    lines = _LINE_BREAK.split(source)
    i = 0
    while i < len(lines):
        opener = _FENCE_OPEN.match(lines[i])
        i += 1
        if opener is None:
            continue
        fence, info = opener["fence"], opener["info"]
        if fence[0] == "`" and "`" in info:
            continue  # inline code, not a fence
        quotes = opener["quote"].count(">")
        indent = len(opener["indent"])
        closing = re.compile(rf"^[ ]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        body: list[str] = []
        while i < len(lines):
            line = lines[i]
            for _ in range(quotes):
                line = _QUOTE.sub("", line, count=1)
            i += 1
            if closing.match(line):
                break
            spaces = len(line) - len(line.lstrip(" "))
            body.append(line[min(spaces, indent):])
        else:
            if body and body[-1] == "":  # the source's final newline, not a code line
                body.pop()
        words = info.split()
        found.append(Fence(words[0] if words else "", "\n".join(body)))
    return found


def _is_code(block: QTextBlock) -> bool:
    return block.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence)


def _language(block: QTextBlock) -> str:
    return block.blockFormat().stringProperty(QTextFormat.Property.BlockCodeLanguage)


def _shown_lines(code: str) -> list[list[str]]:
    """The lines Qt's importer may show for `code`: all of them, or (at the start of a
    document) those after its leading empty lines."""
    lines = code.split("\n")
    trimmed = list(lines)
    while trimmed and trimmed[0] == "":
        trimmed.pop(0)
    return [lines, trimmed] if trimmed != lines else [lines]


def _same_line(shown: str, written: str) -> bool:
    return shown.expandtabs(4) == written.expandtabs(4)


def _match(run: list[QTextBlock], candidates: list[list[str]]) -> list[QTextBlock]:
    """The first lines of `run` that show one of the `candidates`, or []."""
    for lines in candidates:
        piece = run[:len(lines)]
        if lines and len(piece) == len(lines) and all(
            _same_line(block.text(), line) for block, line in zip(piece, lines, strict=True)
        ):
            return piece
    return []


def find_code_blocks(doc: QTextDocument, source: str | None) -> tuple[CodeBlock, ...]:
    """The code blocks of a document made from Markdown `source` (None: use the shown text).

    Runs of consecutive code lines are matched, in order, with the source's fences; a run
    that holds two adjacent fences becomes two blocks. From the first disagreement on, each
    remaining run is one block with its shown text as its code.
    """
    runs: list[list[QTextBlock]] = []
    block = doc.begin()
    previous = -2
    while block.isValid():
        if _is_code(block):
            number = block.blockNumber()
            if number == previous + 1 and runs:
                runs[-1].append(block)
            else:
                runs.append([block])
            previous = number
        block = block.next()
    if not runs:
        return ()
    pending = fences(source) if source is not None else []
    matched = source is not None
    out: list[CodeBlock] = []
    for run in runs:
        start = 0
        while start < len(run):
            fence = pending.pop(0) if matched and pending else None
            if fence is not None:
                if fence.code == "":
                    continue  # an empty fence shows no code line
                piece = _match(run[start:], _shown_lines(fence.code))
                if piece:
                    out.append(CodeBlock(piece[0].blockNumber(), piece[-1].blockNumber(),
                                         _language(piece[0]), fence.code))
                    start += len(piece)
                    continue
                log.debug("code block %d: the source's fences and the document disagree",
                          len(out))
            matched = False
            rest = run[start:]
            out.append(CodeBlock(rest[0].blockNumber(), rest[-1].blockNumber(),
                                 _language(rest[0]), "\n".join(b.text() for b in rest)))
            break
    return tuple(out)


def make_room(doc: QTextDocument, blocks: tuple[CodeBlock, ...], height: float) -> None:
    """A strip `height` pixels tall above each block's first line (for its label and button).
    Qt's layout ignores the top margin of a document's first block, so a message that opens
    with code gets the room in its root frame's top margin as well."""
    cursor = QTextCursor(doc)
    for code in blocks:
        first = doc.findBlockByNumber(code.first)
        fmt = first.blockFormat()
        fmt.setTopMargin(height)
        cursor.setPosition(first.position())
        cursor.setBlockFormat(fmt)
        if code.first == 0:
            frame = doc.rootFrame()
            frame_format = frame.frameFormat()
            frame_format.setTopMargin(frame_format.topMargin() + height)
            frame.setFrameFormat(frame_format)


def strip_rect(doc: QTextDocument, code: CodeBlock, height: float, width: float) -> QRectF:
    """The strip above `code`'s first line, in document coordinates, `width` wide."""
    top = doc.documentLayout().blockBoundingRect(doc.findBlockByNumber(code.first)).top()
    return QRectF(0.0, top - height, width, height)


def code_rect(doc: QTextDocument, code: CodeBlock, width: float) -> QRectF:
    """The lines of `code` (its strip excluded), in document coordinates, `width` wide."""
    layout = doc.documentLayout()
    top = layout.blockBoundingRect(doc.findBlockByNumber(code.first)).top()
    bottom = layout.blockBoundingRect(doc.findBlockByNumber(code.last)).bottom()
    return QRectF(0.0, top, width, bottom - top)


def label_font(font: QFont) -> QFont:
    """The strip's font: the message font a little smaller."""
    small = QFont(font)
    if small.pointSizeF() > 0:
        small.setPointSizeF(max(6.0, small.pointSizeF() * 0.85))
    elif small.pixelSize() > 0:
        small.setPixelSize(max(8, round(small.pixelSize() * 0.85)))
    return small


# --- colours -----------------------------------------------------------------------------


def readable(colour: QColor, background: QColor, minimum: float = MIN_TEXT_CONTRAST) -> QColor:
    """`colour` with its hue and saturation, its lightness moved just far enough (towards
    black on a light background, towards white on a dark one) to reach `minimum` contrast."""
    colour = QColor(colour)
    colour.setAlpha(255)
    if contrast_ratio(colour, background) >= minimum:
        return colour
    white, black = QColor(255, 255, 255), QColor(0, 0, 0)
    darker = contrast_ratio(black, background) > contrast_ratio(white, background)
    hue, saturation = colour.hslHueF(), colour.hslSaturationF()
    hue = max(hue, 0.0)  # -1 for greys
    near, far = colour.lightnessF(), (0.0 if darker else 1.0)
    for _ in range(24):  # bisect: the lightness closest to the original that is readable
        middle = (near + far) / 2
        if contrast_ratio(QColor.fromHslF(hue, saturation, middle), background) >= minimum:
            far = middle
        else:
            near = middle
    return QColor.fromHslF(hue, saturation, far)


@functools.lru_cache(maxsize=64)
def _lexer(language: str) -> Lexer | None:
    try:
        # No newline handling: token offsets must be offsets into the shown text.
        return get_lexer_by_name(language, stripnl=False, stripall=False, ensurenl=False)
    except ClassNotFound:
        return None


@functools.lru_cache(maxsize=256)
def lexed_spans(language: str, text: str) -> tuple[tuple[int, int, _TokenType], ...]:
    """(start, end, token type) of every token of `text` in `language`; () when Pygments
    does not know the language. Cached: a re-layout at another width does not lex again."""
    lexer = _lexer(language.lower())
    if lexer is None:
        return ()
    spans: list[tuple[int, int, _TokenType]] = []
    for start, ttype, value in lexer.get_tokens_unprocessed(text):
        if value:
            spans.append((start, start + len(value), ttype))
    return tuple(spans)


class TokenFormats:
    """The character formats of a Pygments style's tokens on one code background."""

    def __init__(self, style_name: str, background: QColor) -> None:
        self.style_name = style_name
        self.background = QColor(background)
        self._style = get_style_by_name(style_name)
        self._formats: dict[_TokenType, QTextCharFormat | None] = {}

    def format_for(self, ttype: _TokenType) -> QTextCharFormat | None:
        """The format for a token type (None: leave the text as it is)."""
        if ttype in self._formats:
            return self._formats[ttype]
        style = self._style.style_for_token(ttype)
        fmt: QTextCharFormat | None = QTextCharFormat()
        assert fmt is not None
        if style["color"]:
            fmt.setForeground(readable(QColor(f"#{style['color']}"), self.background))
        if style["bold"]:
            fmt.setFontWeight(QFont.Weight.Bold)
        if style["italic"]:
            fmt.setFontItalic(True)
        if style["underline"]:
            fmt.setFontUnderline(True)
        if fmt.isEmpty():
            fmt = None
        self._formats[ttype] = fmt
        return fmt


def highlight(doc: QTextDocument, blocks: tuple[CodeBlock, ...], formats: TokenFormats) -> int:
    """Colour the tokens of every block whose language Pygments knows; how many were.

    Works on the shown text (the document's lines), so token offsets are document offsets
    from the block's first line. Adjacent tokens of one format are merged in one go.
    """
    cursor = QTextCursor(doc)
    cursor.beginEditBlock()  # one relayout at the end, not one per token
    try:
        done = _highlight_blocks(doc, cursor, blocks, formats)
    finally:
        cursor.endEditBlock()
    return done


def _highlight_blocks(
    doc: QTextDocument, cursor: QTextCursor, blocks: tuple[CodeBlock, ...],
    formats: TokenFormats,
) -> int:
    done = 0
    for code in blocks:
        if not code.language:
            continue
        lines: list[str] = []
        block = first = doc.findBlockByNumber(code.first)
        while block.isValid() and block.blockNumber() <= code.last:
            lines.append(block.text())
            block = block.next()
        origin = first.position()
        text = "\n".join(lines)  # one character per block separator, as in the document
        if len(text) > MAX_HIGHLIGHT_CHARS:
            log.debug("code block of %d characters left plain", len(text))
            continue
        spans = lexed_spans(code.language, text)
        if not spans:
            continue
        run_start, run_end, run_format = 0, 0, None
        for start, end, ttype in [*spans, (len(text), len(text), None)]:
            fmt = formats.format_for(ttype) if ttype is not None else None
            if fmt is not None and fmt == run_format and start == run_end:
                run_end = end
                continue
            if run_format is not None:
                cursor.setPosition(origin + run_start)
                cursor.setPosition(origin + run_end, _KEEP_ANCHOR)
                cursor.mergeCharFormat(run_format)
            run_start, run_end, run_format = start, end, fmt
        done += 1
    return done
