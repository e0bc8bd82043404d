"""Every action of the window, once: text, shortcuts, icon, menu, toolbar, when it is enabled.

The menus, the toolbar, the chat view's context menu and the F1 shortcut list all read this
table; nothing else defines an action's text or keys. Chat actions act on the chat view's
current message, and their shortcuts are scoped to the view (Delete in the composer deletes a
character, not a branch).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum, StrEnum

from PySide6.QtCore import QObject, Qt
from PySide6.QtGui import QAction, QKeySequence

from app.look.icons import icon


class Menu(StrEnum):
    FILE = "&File"
    EDIT = "&Edit"
    MESSAGE = "&Message"
    VIEW = "&View"
    HELP = "&Help"


class Scope(Enum):
    WINDOW = "window"  # anywhere in the window
    CHAT = "chat"  # on the chat view's current message, keys scoped to the view


class When(Enum):
    """When a window action can be used (chat actions follow the current message)."""

    ALWAYS = "always"
    IDLE = "idle"  # a model is loaded and no reply is streaming
    ANSWERING = "answering"  # a reply is streaming
    CAN_UNDO = "can_undo"


@dataclass(frozen=True)
class ActionSpec:
    name: str
    text: str
    keys: tuple[str, ...] = ()
    icon: str | None = None
    menu: Menu | None = None
    tip: str = ""
    scope: Scope = Scope.WINDOW
    when: When = When.ALWAYS
    toolbar: bool = False
    separator: bool = False  # a separator before it, in its menu
    checkable: bool = False


def _chat(name: str, text: str, tip: str, keys: tuple[str, ...], icon_name: str) -> ActionSpec:
    return ActionSpec(name, text, keys, icon_name, Menu.MESSAGE, tip, Scope.CHAT)


ACTIONS: tuple[ActionSpec, ...] = (
    # File
    ActionSpec("new", "New conversation", ("Ctrl+N",), "new_conversation", Menu.FILE,
               toolbar=True),
    ActionSpec("models", "Models…", ("Ctrl+M",), "model", Menu.FILE, toolbar=True),
    ActionSpec("open_model", "Open GGUF model…", ("Ctrl+O",), None, Menu.FILE),
    ActionSpec("import", "Import…", ("Ctrl+I",), "import", Menu.FILE, separator=True),
    ActionSpec("export_native", "Export as session file…", ("Ctrl+Shift+E",), "export",
               Menu.FILE),
    ActionSpec("export_chatgpt", "Export as ChatGPT JSON…", (), None, Menu.FILE),
    ActionSpec("export_markdown", "Export branch as Markdown…", (), None, Menu.FILE),
    ActionSpec("settings", "Settings…", ("Ctrl+,",), "settings", Menu.FILE, toolbar=True,
               separator=True),
    ActionSpec("quit", "Quit", ("Ctrl+Q",), None, Menu.FILE, separator=True),
    # Edit
    ActionSpec("undo", "Undo", ("Ctrl+Z",), "undo", Menu.EDIT, when=When.CAN_UNDO,
               toolbar=True),
    ActionSpec("stop", "Stop", ("Esc",), "stop", Menu.EDIT, when=When.ANSWERING, toolbar=True),
    ActionSpec("continue", "Continue the reply", ("Ctrl+Shift+Return",), "continue",
               Menu.EDIT, when=When.IDLE),
    ActionSpec("regenerate_last", "Regenerate the last reply", ("Ctrl+Shift+R",),
               "regenerate", Menu.EDIT, when=When.IDLE),
    ActionSpec("system", "System prompt…", ("Ctrl+Shift+P",), None, Menu.EDIT),
    ActionSpec("conversation_settings", "Conversation settings…", ("Ctrl+Shift+,",), None,
               Menu.EDIT, "This conversation's own sampling, reply length and model"),
    ActionSpec("rename", "Rename conversation…", ("Ctrl+Shift+N",), None, Menu.EDIT,
               separator=True),
    ActionSpec("delete_conversation", "Delete conversation", ("Ctrl+Shift+Delete",), None,
               Menu.EDIT),
    # Message: the chat view's current message
    _chat("edit", "&Edit", "Edit this message in place (the original is kept as a version)",
          ("Ctrl+E", "F2"), "edit"),
    _chat("regenerate", "&Regenerate", "Write a new version of this reply", ("Ctrl+R",),
          "regenerate"),
    _chat("rewind", "Re&wind here",
          "End the conversation at this message (later messages stay in the tree)",
          ("Ctrl+Backspace",), "rewind"),
    _chat("fork", "&Fork from here",
          "Start a new conversation that shares everything up to this message",
          ("Ctrl+Shift+F",), "fork"),
    _chat("copy", "&Copy text", "Copy this message's text to the clipboard", ("Ctrl+Shift+C",),
          "copy"),
    _chat("copy_code", "Copy c&ode", "Copy this message's code block; again: the next one",
          ("Ctrl+Alt+C",), "copy"),
    ActionSpec("toggle_reasoning", "Show/hide re&asoning", ("Ctrl+Shift+K",), None,
               Menu.MESSAGE, "Fold or unfold this reply's reasoning (its <think> part)",
               Scope.CHAT),
    _chat("delete", "&Delete branch", "Delete this message and everything after it",
          ("Delete",), "delete"),
    _chat("previous_variant", "&Previous version", "Show the previous version", ("Alt+Left",),
          "previous"),
    _chat("next_variant", "&Next version", "Show the next version", ("Alt+Right",), "next"),
    # View
    ActionSpec("tree", "Conversation tree", ("Ctrl+T",), "tree_panel", Menu.VIEW,
               toolbar=True, checkable=True),
    ActionSpec("search", "Search conversations", ("Ctrl+F",), "search", Menu.VIEW,
               separator=True),
    ActionSpec("composer", "Write a message", ("Ctrl+L",), None, Menu.VIEW),
    ActionSpec("attach", "Attach documents…", ("Ctrl+Shift+A",), "attach", Menu.VIEW,
               tip="Attach text, Markdown, code, HTML, PDF or DOCX files to the next message"),
    ActionSpec("messages", "Go to the messages", ("Ctrl+J",), None, Menu.VIEW),
    ActionSpec("tree_nodes", "Go to the conversation tree", ("Ctrl+Shift+T",), None,
               Menu.VIEW, "Arrow keys move between messages, Enter shows that branch"),
    ActionSpec("next_conversation", "Next conversation", ("Ctrl+PgDown",), None, Menu.VIEW),
    ActionSpec("previous_conversation", "Previous conversation", ("Ctrl+PgUp",), None,
               Menu.VIEW),
    # Help
    ActionSpec("shortcuts", "Keyboard shortcuts", ("F1",), None, Menu.HELP),
    ActionSpec("log_folder", "Open log folder", (), None, Menu.HELP,
               "The app's and the engine's logs, and the stack of a native crash"),
)

# Toolbar order; None is a separator.
TOOLBAR: tuple[str | None, ...] = ("new", "models", "tree", None, "undo", "stop", None,
                                   "settings")

# Keys that belong to a widget, not an action: listed with the shortcuts.
WIDGET_KEYS: tuple[tuple[str, str], ...] = (
    ("Send the message (in the composer)", "Enter"),
    ("New line (in the composer)", "Shift+Enter"),
)


def specs(scope: Scope) -> tuple[ActionSpec, ...]:
    return tuple(spec for spec in ACTIONS if spec.scope is scope)


def spec(name: str) -> ActionSpec:
    return next(s for s in ACTIONS if s.name == name)


def make_actions(scope: Scope, parent: QObject,
                 slots: Mapping[str, Callable[[], object]]) -> dict[str, QAction]:
    """One QAction per spec of `scope`, triggering `slots[name]`."""
    actions: dict[str, QAction] = {}
    for item in specs(scope):
        action = QAction(item.text, parent)
        action.setObjectName(f"{item.scope.value}_{item.name}_action")
        action.setShortcuts([QKeySequence(key) for key in item.keys])
        if item.scope is Scope.CHAT:
            action.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        tip = item.tip or item.text.replace("&", "").rstrip("…")
        if item.keys:
            tip = f"{tip} ({QKeySequence(item.keys[0]).toString()})"
        action.setToolTip(tip)
        if item.tip:
            action.setStatusTip(item.tip)
        action.setCheckable(item.checkable)
        action.triggered.connect(_without_arguments(slots[item.name]))
        actions[item.name] = action
    return actions


def _without_arguments(slot: Callable[[], object]) -> Callable[[], None]:
    """`triggered` passes `checked`; the slots take no argument (a stray False must never
    reach a parameter such as `node_id=None`)."""

    def run(*_args: object) -> None:
        slot()

    return run


def apply_icons(actions: Mapping[str, QAction]) -> None:
    """Icons are drawn in the palette's text colour: fetched again on a theme change."""
    for name, action in actions.items():
        name_of_icon = spec(name).icon
        if name_of_icon is not None:
            action.setIcon(icon(name_of_icon))


def shortcut_rows(specs_: Iterable[ActionSpec] = ACTIONS) -> list[tuple[str, str]]:
    """(action, keys) for every action with a shortcut, in menu order, then the widgets' own
    keys: the F1 list."""
    rows: list[tuple[str, str]] = []
    for menu in Menu:
        for item in specs_:
            if item.menu is menu and item.keys:
                keys = ", ".join(QKeySequence(k).toString(QKeySequence.SequenceFormat.NativeText)
                                 for k in item.keys)
                rows.append((item.text.replace("&", "").rstrip("…"), keys))
    rows.extend(WIDGET_KEYS)
    return rows
