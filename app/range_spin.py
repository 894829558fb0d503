"""Spin boxes that say so when a number typed into them lies outside their range.

Qt drops a keystroke that would take the number past the top, and puts the last value back without a word
when Enter or leaving the box finds it below the bottom: "100000" became 1000, "-3" became 3, "5" for a
temperature of at most 2 stayed what it was. Here any number is kept while it is typed, and one out of range
gives ``out_of_range`` a line to show ("✗ 5 is outside 0–2; it stays 0.7") while the box keeps its value.
"""
from __future__ import annotations

import re

from PySide6.QtCore import QLocale, Signal
from PySide6.QtGui import QValidator
from PySide6.QtWidgets import QAbstractSpinBox, QDoubleSpinBox, QLabel, QSpinBox

_NUMBER = re.compile(r"-?\d+([.,]\d*)?")
_FRACTION = re.compile(r"-?(\d+[.,]\d*|[.,]\d+)")


class _SaysOutOfRange:
    """What the two spin boxes share: the typed number, its check, and the line. Each box says how it reads
    a number (``_number``), writes one (``_shown``) and what one looks like while it is typed (``_typing``)."""

    def _typed(self, text: str) -> str:
        typed = self.cleanText() if text == self.text() else text
        return typed.strip().removeprefix(self.prefix().strip()).removesuffix(self.suffix().strip()).strip()

    def validate(self, text: str, pos: int):
        """A number the box could hold but for its range is let through while it is typed, so that Enter
        or leaving the box can say it is out of range; so is a fraction in a box of whole numbers, which
        Enter refuses with its reason (Qt dropped the point at the keystroke: "3.5" became 35). A third
        decimal in a box of two Qt still refuses at the keystroke."""
        result = super().validate(text, pos)            # (state, text, pos)
        if result[0] == QValidator.State.Invalid and self._typing().fullmatch(self._typed(text)):
            return QValidator.State.Intermediate, text, pos
        return result

    def fixup(self, text: str) -> str:
        typed = self._typed(text)
        number = self._number(typed) if _NUMBER.fullmatch(typed) else None
        low, special = self.minimum(), self.specialValueText()
        kept = special if special and self.value() == low else self._shown(self.value())
        if number is not None and not low <= number <= self.maximum():
            self.out_of_range.emit(f"✗ {self._shown(number)} is outside {special or self._shown(low)}–"
                                   f"{self._shown(self.maximum())}; it stays {kept}")
        elif number is None and _FRACTION.fullmatch(typed) and isinstance(self, QSpinBox):
            self.out_of_range.emit(f"✗ {typed} is not a whole number; it stays {kept}")
            return text         # as typed: Qt's own fixup drops a group separator ("3,5" -> 35) and applies that
        return super().fixup(text)


class RangeSpin(_SaysOutOfRange, QSpinBox):
    out_of_range = Signal(str)

    def _number(self, typed: str) -> float | None:
        return int(typed) if typed.lstrip("-").isdigit() else None

    def _shown(self, value: float) -> str:
        return str(int(value))

    def _typing(self) -> re.Pattern:
        return _WHOLE


_WHOLE = re.compile(r"-?\d*([.,]\d*)?")     # a fraction too, for Enter to refuse with its reason


class RangeDoubleSpin(_SaysOutOfRange, QDoubleSpinBox):
    out_of_range = Signal(str)

    def _number(self, typed: str) -> float | None:
        value, ok = self.locale().toDouble(typed)
        if not ok:
            value, ok = self.locale().toDouble(typed.replace(".", self.locale().decimalPoint()))
        return value if ok else None

    def _shown(self, value: float) -> str:
        # as the box writes numbers ("0,7" where the decimal point is a comma), without trailing zeros and
        # without the group separators the box leaves out ("12345,5", not "12.345,5")
        locale = QLocale(self.locale())
        locale.setNumberOptions(locale.numberOptions() | QLocale.NumberOption.OmitGroupSeparator)
        return locale.toString(float(value), "g", 6)

    def validate(self, text: str, pos: int):
        """A point typed where the decimal point is a comma ("0.5" in German) is taken as that comma."""
        point = self.locale().decimalPoint()
        if point != "." and "." in text and point not in text:
            text = text.replace(".", point)
        return super().validate(text, pos)

    def _typing(self) -> re.Pattern:
        point = re.escape(self.locale().decimalPoint())
        return re.compile(rf"-?\d*({point}\d{{0,{self.decimals()}}})?")


class RangeNote(QLabel):
    """The line under a group of range boxes: a number typed out of range is said here until a box's value
    changes or another box is typed into (a line about one box left standing over another read as that
    one's)."""

    def __init__(self) -> None:
        super().__init__("")
        self.setObjectName("replyStats")
        self.setWordWrap(True)
        self.hide()
        self._about: QAbstractSpinBox | None = None

    def watch(self, *boxes: RangeSpin | RangeDoubleSpin) -> None:
        for box in boxes:
            box.out_of_range.connect(lambda line, box=box: self._say(box, line))
            box.valueChanged.connect(self._done)
            box.lineEdit().textEdited.connect(lambda _text, box=box: self._typed_in(box))

    def _say(self, box: QAbstractSpinBox, line: str) -> None:
        self._about = box
        self.setText(line)
        self.show()

    def _typed_in(self, box: QAbstractSpinBox) -> None:
        if box is not self._about:
            self._done()

    def _done(self) -> None:
        self._about = None
        self.hide()
