"""The Hugging Face access token in Settings, for gated and private models.

The field never shows a saved token: it starts empty whatever is stored, says whether one is
saved, and hides what is typed. Saving goes through engine.models.credentials (the OS keyring,
else a file only the user can read); nothing here logs the token or puts it in a message.
"""

from __future__ import annotations

from PySide6.QtWidgets import QCheckBox, QFormLayout, QGroupBox, QLabel, QLineEdit, QWidget

from engine.models import credentials

TOKEN_HELP = (
    "Only for gated or private models (Llama, Gemma…): accept the model's terms on its page, "
    "then create a read token at huggingface.co/settings/tokens and paste it here."
)


class TokenBox(QGroupBox):
    """The token field; `save()` applies it when the dialog is accepted."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Hugging Face", parent)
        self.had_token = _stored()
        self.field = QLineEdit()
        self.field.setObjectName("hf-token")
        self.field.setEchoMode(QLineEdit.EchoMode.Password)
        self.field.setPlaceholderText(
            "a token is saved (hidden); type a new one to replace it" if self.had_token
            else "none: public models only")
        self.forget = QCheckBox("Forget the saved token")
        self.forget.setVisible(self.had_token)
        help_line = QLabel(TOKEN_HELP)
        help_line.setWordWrap(True)
        form = QFormLayout(self)
        form.addRow("Access token", self.field)
        form.addRow("", self.forget)
        form.addRow(help_line)

    def problem(self) -> str | None:
        """Why the typed token cannot be saved (None: it can, or nothing was typed)."""
        text = self.field.text().strip()
        if text and any(c.isspace() for c in text):
            return "a Hugging Face token is one word, without spaces"
        return None

    def save(self) -> str | None:
        """Save, replace or forget the token as the user asked; a line saying where it went
        (None: nothing changed)."""
        text = self.field.text().strip()
        self.field.clear()  # the typed token does not stay in the widget
        if text:
            store = credentials.save_token(text)
            where = ("the system keyring" if store is credentials.TokenStore.KEYRING
                     else "a file only you can read")
            return f"Hugging Face token saved in {where}."
        if self.forget.isChecked():
            credentials.forget_token()
            return "Hugging Face token forgotten."
        return None


def _stored() -> bool:
    try:
        return credentials.load_token() is not None
    except Exception:  # a broken keyring backend: say none is saved, saving still works
        return False
