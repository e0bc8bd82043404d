"""Telling screen readers about things they cannot see change: announcements.

`announce` sends a polite `QAccessibleAnnouncementEvent` (Qt 6.8 and later) from a widget;
on an older Qt it sets the widget's accessible description to the message, which Qt reports
as a `DescriptionChanged` event. Both go through `QAccessible.updateAccessibility`, which does
nothing while no assistive technology is listening.
"""

from __future__ import annotations

import logging

from PySide6 import QtGui
from PySide6.QtGui import QAccessible
from PySide6.QtWidgets import QWidget

log = logging.getLogger(__name__)


def announce(widget: QWidget, message: str) -> None:
    """Have a screen reader say `message`, without moving the focus (politely: after what
    it is saying now)."""
    event_type = getattr(QtGui, "QAccessibleAnnouncementEvent", None)
    if event_type is None:
        widget.setAccessibleDescription(message)  # Qt sends DescriptionChanged itself
        return
    event = event_type(widget, message)
    politeness = getattr(QAccessible, "AnnouncementPoliteness", None)
    if politeness is not None:
        event.setPoliteness(politeness.Polite)
    QAccessible.updateAccessibility(event)
    log.debug("announced: %s", message[:80])
