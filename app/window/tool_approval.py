"""The bar above the composer that asks the user about a tool call: what the model wants to
run, with which arguments, on which server; Allow once, Always allow (this tool of this
server, saved in Settings), Deny. Nothing runs until one is pressed; Stop (Esc) ends the loop
with the call not run. While a call runs, the bar says so."""

from __future__ import annotations

from PySide6.QtCore import Slot
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget

from app.state.tool_calls import Asking, Decision, ToolCalls


class ApprovalBar(QFrame):
    def __init__(self, tools: ToolCalls, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.tools = tools
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setAccessibleName("Tool call")
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.allow_once = QPushButton("Allow once")
        self.allow_always = QPushButton("Always allow")
        self.deny = QPushButton("Deny")
        self.allow_once.clicked.connect(lambda: tools.decide(Decision.ONCE))
        self.allow_always.clicked.connect(lambda: tools.decide(Decision.ALWAYS))
        self.deny.clicked.connect(lambda: tools.decide(Decision.DENY))
        row = QHBoxLayout(self)
        row.addWidget(self.label, 1)
        for button in (self.allow_once, self.allow_always, self.deny):
            row.addWidget(button)
        tools.asking.connect(self._on_asking)
        tools.running.connect(self._on_running)
        self.hide()

    @Slot(object)
    def _on_asking(self, asking: Asking | None) -> None:
        if asking is None:
            self.hide()
            return
        self.label.setText(asking.describe() + ".")
        self.allow_always.setToolTip(f"Run {asking.call.name} of {asking.server} without "
                                     f"asking from now on (Settings → Tools can take it back)")
        for button in (self.allow_once, self.allow_always, self.deny):
            button.show()
        self.show()
        self.allow_once.setFocus()

    @Slot(str)
    def _on_running(self, what: str) -> None:
        if self.tools.waiting is not None:
            return
        if not what:
            self.hide()
            return
        self.label.setText(what + " Esc stops it.")
        for button in (self.allow_once, self.allow_always, self.deny):
            button.hide()
        self.show()
