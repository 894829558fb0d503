"""The chat's choices remembered across restarts, in the window's QSettings.

Sampling settings, the context-overflow policy, whether Enter sends, each conversation's text not yet
sent and the conversation shown. A value that cannot be read back (an edited or older settings file)
falls back to its default.
"""
from __future__ import annotations

import math

from PySide6.QtCore import QSettings

from app.messages import (
    CONTEXT_OVERFLOW_POLICIES,
    REASONING_EFFORTS,
    GenerationSettings,
)

_PREFIX = "chat/"
_DRAFTS = "drafts/"        # + a conversation's id: its unsent text


def _number(raw: object, kind: type, default: float | int) -> float | int:
    """A stored number, or ``default`` where a hand-edited file holds something the settings' boxes cannot
    show: not a number, NaN or infinite, or a whole number past what a Qt spin box holds (32 bits)."""
    try:
        value = kind(float(raw)) if kind is int else kind(raw)
    except (TypeError, ValueError, OverflowError):
        return default
    if not math.isfinite(value) or (kind is int and not -2**31 < value < 2**31):
        return default
    return value


def _flag(raw: object, default: bool) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    return {"true": True, "1": True, "false": False, "0": False}.get(text, default)


class ChatPrefs:
    """Reads and writes the chat's settings; with no QSettings it remembers nothing (tests, embedding)."""

    def __init__(self, settings: QSettings | None) -> None:
        self.settings = settings

    def _value(self, key: str) -> object:
        return None if self.settings is None else self.settings.value(_PREFIX + key)

    def _set(self, key: str, value: object) -> None:
        if self.settings is not None:
            self.settings.setValue(_PREFIX + key, value)

    def _number(self, key: str, kind: type, default: float | int) -> float | int:
        raw = self._value(key)
        return default if raw is None else _number(raw, kind, default)

    def generation(self) -> GenerationSettings:
        """The sampling settings last used (defaults where none is stored)."""
        d = GenerationSettings()
        overflow = self._value("context_overflow")
        effort = self._value("reasoning_effort")
        return GenerationSettings(
            temperature=self._number("temperature", float, d.temperature),
            top_p=self._number("top_p", float, d.top_p),
            top_k=self._number("top_k", int, d.top_k),
            max_tokens=self._number("max_tokens", int, d.max_tokens),
            context_overflow=overflow if overflow in CONTEXT_OVERFLOW_POLICIES else d.context_overflow,
            reasoning_effort=effort if effort in REASONING_EFFORTS else d.reasoning_effort)

    def set_generation(self, s: GenerationSettings) -> None:
        for key, value in (("temperature", s.temperature), ("top_p", s.top_p), ("top_k", s.top_k),
                           ("max_tokens", s.max_tokens), ("context_overflow", s.context_overflow),
                           ("reasoning_effort", s.reasoning_effort)):
            self._set(key, value)

    def enter_sends(self) -> bool:
        raw = self._value("enter_sends")
        return True if raw is None else _flag(raw, True)

    def set_enter_sends(self, on: bool) -> None:
        self._set("enter_sends", bool(on))

    def sync(self) -> None:
        """Write to disk now (Qt otherwise does it a little later, which a closing app may not live to see)."""
        if self.settings is not None:
            self.settings.sync()

    def problem(self) -> str:
        """One line when the settings file could not be written at the last sync (else ""): unsent text
        and settings then last only as long as this run."""
        if self.settings is None or self.settings.status() == QSettings.Status.NoError:
            return ""
        why = ("cannot be written" if self.settings.status() == QSettings.Status.AccessError
               else "could not be written")
        return (f"{self.settings.fileName()} {why}: unsent text and chat settings are kept only until Strata "
                "closes; make that file (and its folder) writable to keep them")

    def draft(self, conv_id: str) -> str:
        """The text not yet sent in conversation ``conv_id`` ("" when none)."""
        raw = self._value(_DRAFTS + conv_id)
        return raw if isinstance(raw, str) else ""

    def set_draft(self, text: str, conv_id: str) -> None:
        """Keep ``text`` as ``conv_id``'s unsent text (an empty box keeps nothing)."""
        if self.settings is None:
            return
        if text:
            self._set(_DRAFTS + conv_id, text)
        else:
            self.settings.remove(_PREFIX + _DRAFTS + conv_id)

    def drafted(self) -> list[str]:
        """The conversations that have unsent text."""
        if self.settings is None:
            return []
        self.settings.beginGroup(_PREFIX + _DRAFTS.rstrip("/"))
        try:
            return list(self.settings.childKeys())
        finally:
            self.settings.endGroup()

    def take_box_draft(self) -> str:
        """The single unsent text of versions that kept one for the whole box ("" when none), removed
        from the settings: the chat shown at start takes it."""
        raw = self._value("draft")
        if self.settings is not None and raw is not None:
            self.settings.remove(_PREFIX + "draft")
        return raw if isinstance(raw, str) else ""

    def current_chat(self) -> str:
        """The conversation shown when the window last kept its state ("" when none)."""
        raw = self._value("current")
        return raw if isinstance(raw, str) else ""

    def set_current_chat(self, conv_id: str) -> None:
        self._set("current", conv_id)
