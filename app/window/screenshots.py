"""Render the main window with sample conversations into PNGs for the docs: a branching
conversation in the light and the dark theme (main-window, main-window-dark) and a reply with
highlighted code blocks (code-blocks), a reasoning model's replies, one with its reasoning
folded and one unfolded (reasoning), and a conversation longer than its context, its oldest
messages left out, with the context gauge (context); the model picker's Discover tab with the
recommended models, a repository's quantizations with their fit and the downloads
(discover), and the window while two downloads go on (downloads); a tool loop (tools): a
call of an MCP server's tool, its result unfolded, a retried call on another branch, and the
next call waiting for the user's approval; a PDF attached to a question asked two ways, the
document unfolded, and a DOCX waiting for the next message (documents); the Settings dialog on
its first page (settings).

The Discover shots are made offline: the repository on screen is the bundled SmolLM2 file's
(its real size and header, read locally, as Discover reads a remote one over ranges), and the
downloads are staged at a given point of their progress; tests/app/dialogs/test_discover.py
runs the same widgets against a local hub.

    QT_QPA_PLATFORM=offscreen .venv/bin/python -m app.window.screenshots resources/screenshots
    QT_QPA_PLATFORM=offscreen .venv/bin/python -m app.window.screenshots resources/screenshots
    code-blocks
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.dialogs.model_picker import ModelPicker
    from app.state.hub_jobs import Downloads
    from app.window.main_window import MainWindow
    from engine.core.attachments import Document
    from engine.core.tools import ToolCall
    from engine.storage.store import Store

CONTEXT_SHOT_N_CTX = 512
CONTEXT_SHOT_REPLY = 64  # the longest reply, so the room kept for one

SAMPLE = [
    ("user", "What makes oak trees live so long?"),
    ("assistant", "Oaks grow slowly and build **dense, decay-resistant wood**. They also:\n\n"
                  "- shed damaged limbs instead of rotting from them,\n"
                  "- keep deep roots that reach water in droughts,\n"
                  "- make tannins that deter insects and fungi."),
    ("user", "How deep do the roots go?"),
    ("assistant", "Usually within the top metre, spreading wide; a taproot can reach "
                  "`4-5 m` in young trees."),
]

CODE_SAMPLE = [
    ("user", "How do I read a CSV file into dictionaries in Python?"),
    ("assistant", "Use `csv.DictReader`: each row comes back as a `dict` keyed by the header.\n\n"
                  "```python\nimport csv\nfrom pathlib import Path\n\n\n"
                  "def read_rows(path: Path) -> list[dict[str, str]]:\n"
                  "    \"\"\"Every row of a CSV file, keyed by its header.\"\"\"\n"
                  "    with path.open(newline=\"\", encoding=\"utf-8\") as f:\n"
                  "        return list(csv.DictReader(f))  # the header is the first row\n\n\n"
                  "rows = read_rows(Path(\"trees.csv\"))\n"
                  "print(len(rows), rows[0][\"species\"])\n```\n\n"
                  "To check the file first:\n\n"
                  "```bash\nhead -n 3 trees.csv | column -s, -t\n```"),
]
REASONING_SAMPLE = [
    ("user", "Is 221 a prime number?"),
    ("assistant", "<think>\nI should try the primes up to the square root of 221, which is a "
                  "little under 15: 2, 3, 5, 7, 11 and 13. It is odd, so not 2. Its digits add "
                  "up to 5, so not 3. It does not end in 0 or 5. 7 times 31 is 217, remainder "
                  "4. 11 times 20 is 220, remainder 1. 13 times 17 is 221. So it is not prime."
                  "\n</think>\n\nNo: **221 = 13 \u00d7 17**, so it is not prime."),
    ("user", "And 223?"),
    ("assistant", "<think>\nThe square root of 223 is just under 15, so again the primes up to "
                  "13. 223 is odd; its digits add up to 7, so 3 does not divide it; it does "
                  "not end in 0 or 5. 7 \u00d7 31 = 217, remainder 6. "
                  "11 \u00d7 20 = 220, remainder 3. "
                  "13 \u00d7 17 = 221, remainder 2. No divisor, so 223 is prime.\n</think>\n\n"
                  "Yes, **223 is prime**: none of 2, 3, 5, 7, 11 or 13 divides it, and "
                  "15 \u00d7 15 is already larger."),
]
LONG_SAMPLE = [
    ("user", "Where does the Danube begin, and which countries does it flow through?"),
    ("assistant", "It begins in the **Black Forest** in Germany, where two streams, the Breg "
                  "and the Brigach, meet at Donaueschingen. From there it runs east for about "
                  "2,850 km through ten countries: Germany, Austria, Slovakia, Hungary, "
                  "Croatia, Serbia, Romania, Bulgaria, Moldova and Ukraine, more than any "
                  "other river in the world, before it reaches the Black Sea."),
    ("user", "Which capitals stand on it?"),
    ("assistant", "Four: **Vienna**, **Bratislava**, **Budapest** and **Belgrade**. "
                  "Bratislava and Vienna are the two closest capitals in Europe, about 55 km "
                  "apart, and both grew up around crossings of the river. Budapest was two "
                  "towns, Buda and Pest, on either bank until 1873."),
    ("user", "How do ships get past the Iron Gates?"),
    ("assistant", "Through the locks of two dams, **Iron Gate I** and **Iron Gate II**, built "
                  "by Romania and Yugoslavia in the 1970s and 1980s. Before the dams the gorge "
                  "was one of the most dangerous stretches of river in Europe: rapids, rocks "
                  "and whirlpools, and a canal with a railway that towed ships upstream."),
    ("user", "What lives in the delta?"),
    ("assistant", "More than 300 species of birds, among them the largest colony of **white "
                  "pelicans** in Europe, and about 45 species of freshwater fish. The reed beds "
                  "are among the largest on Earth, and the whole delta is a UNESCO World "
                  "Heritage Site and a biosphere reserve."),
    ("user", "Is the delta growing or shrinking?"),
    ("assistant", "Mostly **shrinking** at its sea front: the dams upstream hold back much of "
                  "the sediment the river used to carry, so the waves now take more of the "
                  "coast than the river brings. Some arms, like the Chilia, still push new "
                  "land into the sea."),
]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The forecast for a city and a day.",
    "parameters": {"type": "object", "required": ["city", "day"], "properties": {
        "city": {"type": "string"}, "day": {"type": "string"},
        "hourly": {"type": "boolean"}}}}}
SHOTS = ("main-window", "code-blocks", "reasoning", "context", "tools", "documents",
         "settings", "discover", "downloads")


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "resources/screenshots")
    shots = argv[1:] or list(SHOTS)
    unknown = sorted(set(shots) - set(SHOTS))
    if unknown:
        raise SystemExit(f"unknown screenshots {unknown}; these exist: {', '.join(SHOTS)}")
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ["ARBOR_HOME"] = tempfile.mkdtemp(prefix="arbor-shots-")
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QAbstractItemView, QApplication

    from app.look.theme import apply_theme
    from app.window.context_gauge import branch_fill
    from app.window.main_window import MainWindow
    from engine.config.overrides import Overrides
    from engine.config.settings import Settings, Theme
    from engine.core.overflow import Overflow
    from engine.core.results import LEFT_OUT
    from engine.core.tree import Role, Tree
    from engine.models.files import default_model_path
    from engine.storage.store import Store

    app = QApplication(sys.argv[:1])
    apply_theme(app, Theme.LIGHT)
    tree = Tree("You are a concise botanist.")
    for role, text in SAMPLE:
        tree.add_child(tree.active_leaf, Role(role), text)
    tree.add_sibling(tree.message(2).id, "How tall can an oak grow?")
    tree.add_child(tree.active_leaf, Role.ASSISTANT, "Most reach 20-30 m; a few exceed 40 m.")
    tree.switch_variant(tree.message(2).id, 0)
    store = Store()
    code = Tree("You are a helpful programmer.")
    for role, text in CODE_SAMPLE:
        code.add_child(code.active_leaf, Role(role), text)
    code_id = store.create(code, title="Reading a CSV in Python")
    reasoning = Tree("")
    for role, text in REASONING_SAMPLE:
        reasoning.add_child(reasoning.active_leaf, Role(role), text)
    reasoning_id = store.create(reasoning, title="Is 221 prime?")
    long = Tree("You are a geographer.")
    for role, text in LONG_SAMPLE:
        long.add_child(long.active_leaf, Role(role), text)
    # The last reply left out what the gauge's own cut leaves out of the path it answered.
    left_out = branch_fill(long.active_path()[:-1], CONTEXT_SHOT_N_CTX,
                           overflow=Overflow.DROP_OLDEST, max_tokens=CONTEXT_SHOT_REPLY).dropped
    long.node(long.active_leaf).meta[LEFT_OUT] = left_out
    long_id = store.create(long, title="The Danube, source to delta")
    store.set_settings(long_id, Overrides(overflow=Overflow.DROP_OLDEST).write({}))
    tools_id, pending = tool_sample(store)
    documents_id, waiting = documents_sample(store)
    store.create(tree, title="Why oaks live long")
    # A small context, so that the long conversation outgrows it (the "context" shot).
    window = MainWindow(store=store, settings=Settings(n_ctx=CONTEXT_SHOT_N_CTX,
                                                       max_tokens=CONTEXT_SHOT_REPLY))
    window.resize(1280, 760)
    window.show()
    loop = QEventLoop()
    window.model_ready.connect(loop.quit)
    QTimer.singleShot(60_000, loop.quit)
    window.models.load_model(str(default_model_path()))
    loop.exec()
    app.processEvents()
    saved: list[Path] = []

    def shoot(name: str) -> None:
        app.processEvents()
        window.grab().save(str(out / f"{name}.png"))
        saved.append(out / f"{name}.png")

    def open_light(conversation_id: int) -> None:
        apply_theme(app, Theme.LIGHT)
        window.controller.open_conversation(conversation_id)
        app.processEvents()

    if "main-window" in shots:
        shoot("main-window")
        apply_theme(app, Theme.DARK)
        shoot("main-window-dark")
    if "code-blocks" in shots:
        open_light(code_id)
        shoot("code-blocks")
    if "reasoning" in shots:
        open_light(reasoning_id)
        window.chat.toggle_reasoning(window.chat.model().rows()[-1].node_id)  # one unfolded
        window.chat.scroll_to_end()
        shoot("reasoning")
    if "context" in shots:
        open_light(long_id)
        window.chat.scrollTo(window.chat.model().index(left_out),
                             QAbstractItemView.ScrollHint.PositionAtCenter)
        shoot("context")
    if "tools" in shots:
        from app.state.tool_calls import Asking

        open_light(tools_id)
        rows = window.chat.model().rows()
        window.chat.toggle_reasoning(rows[2].node_id)  # the first result unfolded
        window.approval._on_asking(Asking(tools_id, pending, "weather"))
        window.chat.scroll_to_end()
        shoot("tools")
        window.approval._on_asking(None)
    if "documents" in shots:
        open_light(documents_id)
        rows = window.chat.model().rows()
        window.chat.toggle_reasoning(rows[0].node_id)  # the document unfolded
        window.attachments.keep(waiting)
        window.composer.setPlainText("And what does the contract say about notice?")
        shoot("documents")
        window.attachments.take()
        window.composer.clear()
    if "settings" in shots:
        from app.dialogs.settings_dialog import SettingsDialog

        apply_theme(app, Theme.LIGHT)
        dialog = SettingsDialog(window.settings, window)
        dialog.show()
        app.processEvents()
        dialog.grab().save(str(out / "settings.png"))
        saved.append(out / "settings.png")
        dialog.close()
        dialog.deleteLater()
    if "discover" in shots or "downloads" in shots:
        stage_downloads(window.downloads)
    if "discover" in shots:
        picker = discover_picker(window)
        picker.show()
        app.processEvents()
        picker.grab().save(str(out / "discover.png"))
        saved.append(out / "discover.png")
        picker.close()
    if "downloads" in shots:
        open_light(long_id)
        shoot("downloads")
    window.close()
    print(*saved)
    return 0


def tool_sample(store: Store) -> tuple[int, ToolCall]:
    """A conversation whose model calls an MCP server's tool: a first call and its result,
    answered; a retried call beside it (the active branch); a next call not yet run."""
    from engine.core.tools import TOOL_CALL_ID, TOOL_CALLS, TOOL_SERVERS, TOOLS, ToolCall
    from engine.core.tree import Role, Tree

    tree = Tree("You help with daily plans. Check the forecast before advising.")
    tree.root.meta[TOOLS] = [WEATHER_TOOL]
    tree.root.meta[TOOL_SERVERS] = {"get_weather": "weather"}
    user = tree.add_child(tree.root_id, Role.USER, "Should I bike to work in Oslo tomorrow?")
    answers = (
        ({"city": "Oslo", "day": "tomorrow"},
         '{"sky": "rain", "temp_c": 9, "wind_ms": 11}',
         "Tomorrow brings **rain, 9 °C and a strong wind** (11 m/s). Take the tram, or bring "
         "rain gear if you bike."),
        ({"city": "Oslo", "day": "tomorrow", "hourly": True},
         '{"07:00": {"sky": "cloudy", "temp_c": 7}, "08:00": {"sky": "rain", "temp_c": 8},\n'
         ' "17:00": {"sky": "clear", "temp_c": 11}}',
         "The rain starts around 8:00: leave before it and you stay dry on the way in; the "
         "ride home at 17:00 is clear."),
    )
    for arguments, result, answer in answers:
        call = ToolCall.new("get_weather", arguments)
        reply = tree.add_child(user.id, Role.ASSISTANT, "")
        reply.meta[TOOL_CALLS] = [call.to_meta()]
        tool = tree.add_child(reply.id, Role.TOOL, result)
        tool.meta[TOOL_CALL_ID] = call.id
        tree.add_child(tool.id, Role.ASSISTANT, answer)
    tree.add_child(tree.active_leaf, Role.USER, "And on Saturday?")
    pending = ToolCall.new("get_weather", {"city": "Oslo", "day": "Saturday"})
    reply = tree.add_child(tree.active_leaf, Role.ASSISTANT, "")
    reply.meta[TOOL_CALLS] = [pending.to_meta()]
    return store.create(tree, title="Biking in Oslo"), pending


REPORT = (
    "[page 1]\nField report: the Elbe estuary, spring survey\n\nThe spring survey counted "
    "1,240 wading birds across the six tidal flats, against 1,610 a year earlier. The drop "
    "is largest on flats 4 and 5, where the new channel deepening has narrowed the exposed "
    "mud at low tide by about a third.\n\n[page 2]\nSediment cores from flat 5 show finer "
    "silt than in 2024. Recommendation: move the autumn count a week earlier, and add two "
    "transects on flat 6, which is still widening.")


def documents_sample(store: Store) -> tuple[int, Document]:
    """A field report attached to a question, asked a second way beside it (the active
    version), each answered; and a contract waiting to go with the next message."""
    from engine.core.attachments import DOCUMENTS, Document, DocumentKind
    from engine.core.tree import Role, Tree

    report = Document("elbe-spring-survey.pdf", DocumentKind.PDF, REPORT, "e" * 64, 48_213)
    tree = Tree("You help an ecologist read field reports.")
    first = tree.add_child(tree.root_id, Role.USER, "Summarise the report in two lines.")
    first.meta[DOCUMENTS] = [report.to_meta()]
    tree.add_child(first.id, Role.ASSISTANT,
                   "Wading birds fell from 1,610 to 1,240, most on flats 4 and 5 where channel "
                   "deepening narrowed the mud. The report advises an earlier autumn count.")
    second = tree.add_sibling(first.id, "Which flat should we watch, and why?")
    second.meta[DOCUMENTS] = [report.to_meta()]
    tree.add_child(second.id, Role.ASSISTANT,
                   "**Flat 6**: it is still widening while flats 4 and 5 shrink, so the report "
                   "adds two transects there. Flat 5's finer silt is worth a second core.")
    contract = Document("survey-contract.docx", DocumentKind.DOCX, "Notice: 30 days.", "f" * 64,
                        18_944)
    return store.create(tree, title="Elbe spring survey"), contract


def stage_downloads(downloads: Downloads) -> None:
    """Two downloads as they are a minute in: one running, one cancelled (to resume)."""
    from app.state.hub_jobs import DownloadRow, RowState
    from engine.models.download_parts import RemoteFile
    from engine.models.download_transfer import Progress

    def remote(repo: str, name: str, size: int) -> RemoteFile:
        return RemoteFile(repo, name, f"https://huggingface.co/{repo}/resolve/main/{name}",
                          size, None)

    gemma = remote("ggml-org/gemma-3-1b-it-GGUF", "gemma-3-1b-it-Q4_K_M.gguf", 806_058_240)
    qwen = remote("Qwen/Qwen3-1.7B-GGUF", "Qwen3-1.7B-Q8_0.gguf", 1_834_426_016)
    running = DownloadRow(1, f"{gemma.repo}:Q4_K_M", (gemma,), RowState.RUNNING, job=1,
                          progress=Progress(gemma.name, 301_989_888, gemma.size, 0,
                                            6.2 * 2**20, 77.0, 0), done_bytes=301_989_888)
    cancelled = DownloadRow(2, f"{qwen.repo}:Q8_0", (qwen,), RowState.CANCELLED,
                            done_bytes=612_368_384)
    for row in (running, cancelled):
        downloads.rows[row.row] = row
        downloads.changed.emit(row)


def discover_picker(window: MainWindow) -> ModelPicker:
    """The picker on its Discover tab: the recommended list, and the bundled model's
    repository with its header and fit."""
    from engine.models.files import default_model_path, summarize_header, wanted_header_key
    from engine.models.gguf_header import read_gguf_header
    from engine.models.hub import RepoDetails
    from engine.models.quants import RepoFile, group_files
    from engine.models.remote_header import RemoteHeader

    path = default_model_path()
    fields = read_gguf_header(path, wanted_header_key)
    size = path.stat().st_size
    repo = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
    picker = window.models.picker(discover=True)
    panel = picker.discover
    assert panel is not None
    panel.table.blockSignals(True)  # no request: the header is the local file's
    panel._show_details(RepoDetails(repo, "main", "apache-2.0", False, False,
                                    tuple(group_files([RepoFile(path.name, size, None)]))))
    panel.table.blockSignals(False)
    panel._show_header(RemoteHeader(repo, path.name, size,
                                    summarize_header(fields, path.name), fields, 0))
    group = panel.selected_group()
    if group is not None:
        panel.download_button.setText(f"Download {group.quant} ({size / 2**20:.0f} MiB)")
        panel.download_button.setEnabled(True)
    return picker


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
