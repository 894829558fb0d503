"""How the workbench window lays itself out on a screen of any size, from a laptop's up.

A first window's panels share one dock as tabs beside the knobs (on a large screen, two tab groups one
over the other); everything shrinks to small minimums, so the whole window fits a 1024 × 700 screen: the
readout captions and status lines are cut with "…" (whole in their tooltips), the panels stack their
readouts, the knobs scroll and the conversation list can be dragged shut. A layout saved on a bigger
screen is fitted to the one at hand; one that needs more room than that screen has (two panel groups one
over the other) gives way there to the layout last used on such a smaller screen (the default, the first
time), and stays saved for its own screen: each of the two is saved as the user leaves it, tabs, dividers
and docks alike. A window made narrow and wide again gives its docks back the width the shrink took
(:class:`DockWidths`). A layout saved by an older window (another version of the dock arrangement) is not
restored at all.
"""
from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QRect, QSize, Qt, QTimer
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QDockWidget, QMainWindow, QTabBar, QWidget

LAYOUT_VERSION = 2      # of saved dock layouts: one saved by an older window is not restored
# where a window saves its size, place and docks: the layout of the screens it fits, and the one used where
# that one needs more room than the screen has
LAYOUT_KEYS = {"main": ("geometry", "window_state"),
               "smaller": ("smaller_screen/geometry", "smaller_screen/window_state")}
SIDEBAR_MIN_WIDTH = 160  # the conversation list: its Rename and Delete side by side (titles are cut to it)
CHAT_MIN_WIDTH = 340    # the chat pane may shrink to this (its row of buttons), whatever its lines would like
CENTRAL_WIDTH = 570     # a first window's sidebar and chat together, at the least, where the screen has room
KNOBS_MIN_WIDTH = 250   # the knobs scroll sideways below this
KNOBS_WIDTH = 300
KNOBS_WIDTH_SMALL = 270          # on a screen narrower than SMALL_SCREEN_WIDTH: the panels' five tabs need the room
SMALL_SCREEN_WIDTH = 1500
LARGE_SCREEN = QSize(1800, 1000)   # from this size on, the panels open in two tab groups, one over the other
DEFAULT_SIZE = QSize(1680, 1050)   # the first window: this, or the screen if that is smaller
FRAME_ROOM = QSize(16, 40)         # what a window manager's frame and title bar take around the window
DOCK_TITLES = {"performance": "Throughput", "gpu": "GPU", "memory": "Memory", "experts": "Experts",
               "traffic": "Transfers", "knobs": "Knobs"}


def fit_rect(rect: QRect, area: QRect, minimum: QSize) -> QRect:
    """``rect`` moved (and shrunk, never below ``minimum``) so that it lies inside ``area``."""
    w = max(min(rect.width(), area.width()), minimum.width())
    h = max(min(rect.height(), area.height()), minimum.height())
    x = max(area.left(), min(rect.left(), area.left() + area.width() - w))
    y = max(area.top(), min(rect.top(), area.top() + area.height() - h))
    return QRect(x, y, w, h)


def fit_window(window: QWidget, available: QRect) -> None:
    """Move (and shrink) a top-level widget so that it, with its frame, lies inside ``available``."""
    frame, inner = window.frameGeometry(), window.geometry()      # the same before it is first shown
    room = available.adjusted(inner.left() - frame.left(), inner.top() - frame.top(),
                              inner.right() - frame.right(), inner.bottom() - frame.bottom())
    window.setGeometry(fit_rect(inner, room, window.minimumSizeHint()))


def fits(least: QSize, available: QSize) -> bool:
    """Whether a window whose inside needs ``least``, with its frame around it, fits ``available``."""
    return (least.width() + FRAME_ROOM.width() <= available.width()
            and least.height() + FRAME_ROOM.height() <= available.height())


def default_window_size(available: QSize) -> QSize:
    """The size of a first window: DEFAULT_SIZE, or what the screen offers less room for the frame."""
    return QSize(min(DEFAULT_SIZE.width(), available.width() - FRAME_ROOM.width()),
                 min(DEFAULT_SIZE.height(), available.height() - FRAME_ROOM.height()))


def stale_tab_bars(window: QMainWindow, docks: dict[str, QDockWidget]) -> list[QTabBar] | None:
    """The tab bars a dock state that gave way to another left behind: Qt keeps the tab bars of a state
    replaced by a second one on screen (a large screen's two panel groups, replaced by a small screen's one),
    where they lie over the menus and take Tab focus. Each group of docks tabbed together has its bar: the
    one with the group's titles next to the group's front dock; every other bar is a leftover, an empty one
    too. None while the window is not laid out yet (no group, or a group with no bar so far): nothing can be
    told apart then."""
    bars = window.findChildren(QTabBar, options=Qt.FindChildOption.FindDirectChildrenOnly)
    keep: set[QTabBar] = set()
    for dock in docks.values():
        if dock.isFloating() or not dock.isVisible() or not window.rect().intersects(dock.geometry()):
            continue                  # a tab group's front dock is the one in the window (the others lie outside)
        group = [dock, *(d for d in window.tabifiedDockWidgets(dock) if not d.isFloating())]
        if len(group) < 2:
            continue
        titles = sorted(d.windowTitle() for d in group)
        mine = [b for b in bars if sorted(b.tabText(i) for i in range(b.count())) == titles]
        if not mine:
            return None
        at = dock.geometry()
        keep.add(min(mine, key=lambda b: abs(b.geometry().left() - at.left())
                     + min(abs(b.geometry().bottom() + 1 - at.top()), abs(b.geometry().top() - at.bottom() - 1))))
    if not keep:
        return None                  # no group of docks so far: not laid out yet (or none to tell bars by)
    return [b for b in bars if b not in keep and not b.isHidden()]


def tidy_tab_bars(window: QMainWindow, docks: dict[str, QDockWidget], tries: int = 200) -> None:
    """Hide the leftover tab bars (:func:`stale_tab_bars`) once the window is shown and laid out: asked
    again every 25 ms until it is, at most ``tries`` times."""
    stale = stale_tab_bars(window, docks) if window.isVisible() else None
    if stale is None and tries > 0:
        QTimer.singleShot(25, window, lambda: tidy_tab_bars(window, docks, tries - 1))
    for bar in stale or ():
        bar.hide()


def arrange_docks(window: QMainWindow, docks: dict[str, QDockWidget], available: QSize) -> None:
    """The docks as a first window has them: the panels as tabs beside the knobs (on a screen of
    LARGE_SCREEN or more, in two tab groups one over the other)."""
    for dock in docks.values():
        dock.setFloating(False)
        window.removeDockWidget(dock)
    right = Qt.DockWidgetArea.RightDockWidgetArea
    window.addDockWidget(right, docks["performance"])
    window.addDockWidget(right, docks["knobs"])
    window.splitDockWidget(docks["performance"], docks["knobs"], Qt.Orientation.Horizontal)
    large = available.width() >= LARGE_SCREEN.width() and available.height() >= LARGE_SCREEN.height()
    groups = ((["performance", "gpu", "traffic"], ["memory", "experts"]) if large else
              (["performance", "gpu", "memory", "experts", "traffic"],))
    if large:
        window.splitDockWidget(docks["performance"], docks["memory"], Qt.Orientation.Vertical)
    for first, *rest in groups:
        for name in rest:
            window.tabifyDockWidget(docks[first], docks[name])
    for dock in docks.values():
        dock.show()
    for first, *_ in groups:
        docks[first].raise_()
    # the sidebar and the chat, then the panels, whose tab titles must fit whole on a laptop's 1280 pixels
    central = max(CENTRAL_WIDTH, int(available.width() * 0.44))
    knobs = KNOBS_WIDTH_SMALL if available.width() < SMALL_SCREEN_WIDTH else KNOBS_WIDTH
    panels = max(available.width() - central - knobs, 300)
    window.resizeDocks([docks["performance"], docks["knobs"]], [panels, knobs], Qt.Orientation.Horizontal)
    if large:
        half = available.height() // 2
        window.resizeDocks([docks["performance"], docks["memory"]], [half, half], Qt.Orientation.Vertical)


class WrappingWidget(QWidget):
    """A widget whose least height is what its layout needs at the width it has now.

    Qt counts one line for a label that wraps, so a window at its smallest height would squeeze the rows
    of a narrow pane whose lines wrap to several, and a row of fixed height (the prompt box) would then lie
    over the buttons under it. Here the minimum follows the width, and the window keeps room for every row.
    """

    def minimumSizeHint(self) -> QSize:
        hint = super().minimumSizeHint()
        lay = self.layout()
        # (a widget no layout has sized yet has Qt's default width, which says nothing of the one it gets)
        if lay is not None and lay.hasHeightForWidth() and self.testAttribute(Qt.WidgetAttribute.WA_Resized):
            hint.setHeight(max(hint.height(), lay.totalMinimumHeightForWidth(self.width())))
        return hint

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self.updateGeometry()          # another width: lines wrap anew, so the least height changes


class DockWidths(QObject):
    """Gives the docks back, when the window grows again, the width a shrink took from them.

    Qt hands all of a window's new width to the chat in the middle: a window made narrow (snapped to half
    the screen) and wide again kept its panels and knobs at their narrow widths. Here the panels' and the
    knobs' widths are remembered whenever the user sets them (a divider dragged, docks rearranged, a layout
    arranged or restored: the chat changes width while the window does not); a window that grows gives each
    back up to that width first, and the chat takes the rest. A window that starts small has nothing to
    give back.
    """

    def __init__(self, window: QMainWindow, panels: list[QDockWidget], knobs: QDockWidget) -> None:
        super().__init__(window)
        self.window, self.panels, self.knobs = window, panels, knobs
        self.wanted: dict[str, int] = {}      # "panels", "knobs" -> the width the user left them at
        self._width: int | None = None        # the window's width when the chat last changed width
        # the docks' widths before and after the last give-back, while the chat's change of width it causes
        # (later, as Qt lays the window out) is still to come: that one is not the user's
        self._given: dict[str, tuple[int, int]] = {}
        window.centralWidget().installEventFilter(self)

    def arranged(self) -> None:
        """The docks were laid out anew (a default or restored layout): their widths, once laid out, are
        the ones to keep, whatever the window's width did meanwhile."""
        self.wanted, self._width, self._given = {}, None, {}

    def front_panel(self) -> QDockWidget | None:
        """The panel dock in front of its tab group, docked beside the chat (None: none is)."""
        area = Qt.DockWidgetArea.RightDockWidgetArea
        shown = [d for d in self.panels if not d.isFloating() and self.window.dockWidgetArea(d) == area
                 and d.widget().on_screen()]
        return max(shown, key=lambda d: d.width(), default=None)

    def _docked(self) -> dict[str, QDockWidget]:
        knobs = self.knobs if self.knobs.isVisible() and not self.knobs.isFloating() else None
        return {name: dock for name, dock in (("panels", self.front_panel()), ("knobs", knobs)) if dock is not None}

    def record(self) -> None:
        """Remember the panels' and the knobs' widths as they are now, unless they are what the last
        give-back made them (a window grown in steps took each step's half-way widths for the user's)."""
        now = {name: dock.width() for name, dock in self._docked().items()}
        given, self._given = self._given, {}
        if given and now.keys() == given.keys() and all(lo <= now[n] <= hi for n, (lo, hi) in given.items()):
            return
        self.wanted = now

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Resize:
            width, last = self.window.width(), self._width
            self._width = width
            if last is None or width == last:      # the chat's width changed, the window's did not: the user's
                QTimer.singleShot(0, self.record)  # (once the docks have their new widths too)
            elif width > last:
                QTimer.singleShot(0, self._give_back)
        return False

    def _give_back(self) -> None:
        """Each dock up to the width it was left at, as far as the chat has room beyond its least width."""
        central = self.window.centralWidget()
        spare = central.width() - central.minimumSizeHint().width()
        self._given = {}           # an earlier give-back's, whose layout came with a resize of the window
        docked, given = self._docked(), {}
        for name, dock in docked.items():
            gain = max(0, min(self.wanted.get(name, 0) - dock.width(), spare))
            if gain:
                given[name] = dock.width() + gain
                spare -= gain
        if given:
            self._given = {name: (dock.width(), given.get(name, dock.width())) for name, dock in docked.items()}
            self.window.resizeDocks([docked[n] for n in given], list(given.values()), Qt.Orientation.Horizontal)


def access_keyed(titles: list[str], taken: str = "") -> list[str]:
    """``titles`` as menu items, each with an access key of its own: the first letter of its title no item
    before it (nor ``taken``) has, else none ("Throughput" and "Transfers": "&Throughput", "T&ransfers")."""
    used, out = set(taken.lower()), []
    for title in titles:
        at = next((i for i, c in enumerate(title) if c.isalpha() and c.lower() not in used), None)
        if at is None:
            out.append(title.replace("&", "&&"))
            continue
        used.add(title[at].lower())
        out.append(title[:at].replace("&", "&&") + "&" + title[at:].replace("&", "&&"))
    return out

