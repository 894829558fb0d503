"""What bootstrap.sh checks before it builds the environment or starts Qt, with the fix for this system.

    python3 packaging/system_check.py python                 can this interpreter make .venv?
    .venv/bin/python packaging/system_check.py gui [ARGS]    can main.py ARGS open a window here?
    .venv/bin/python packaging/system_check.py tests         can the test suite start Qt (offscreen)?

A problem is one line on stderr naming the cause and the install command for this distribution (read
from /etc/os-release), and exit code 2. Nothing is installed. Qt's platform plugin is dlopen()ed by Qt
itself, which aborts the process when one of its libraries is missing and names the wrong one, so the
plugin's libraries are found with ``ldd`` first. Runs on the standard library alone.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shlex
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

OS_RELEASE = Path("/etc/os-release")
FAMILIES = ("debian", "fedora", "arch")
INSTALLERS = {"debian": "apt-get install", "fedora": "dnf install", "arch": "pacman -S --needed"}
# os-release IDs (ID, then each word of ID_LIKE) -> the family whose package names apply
KNOWN_IDS = {"debian": "debian", "ubuntu": "debian", "fedora": "fedora", "rhel": "fedora", "centos": "fedora",
             "arch": "arch", "manjaro": "arch"}

# The libraries Qt's own libraries and platform plugins link (the PySide6 wheel's readelf -d NEEDED), by
# the package that provides each: (Debian/Ubuntu, Fedora/RHEL, Arch).
LIBRARIES: dict[str, tuple[str, str, str]] = {
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm", "xcb-util-wm"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms", "xcb-util-keysyms"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image", "xcb-util-image"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil", "xcb-util-renderutil"),
    "libxcb-util.so.1": ("libxcb-util1", "xcb-util", "xcb-util"),
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor", "xcb-util-cursor"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb", "libxcb"),
    "libxcb-randr.so.0": ("libxcb-randr0", "libxcb", "libxcb"),
    "libxcb-render.so.0": ("libxcb-render0", "libxcb", "libxcb"),
    "libxcb-shape.so.0": ("libxcb-shape0", "libxcb", "libxcb"),
    "libxcb-shm.so.0": ("libxcb-shm0", "libxcb", "libxcb"),
    "libxcb-sync.so.1": ("libxcb-sync1", "libxcb", "libxcb"),
    "libxcb-xfixes.so.0": ("libxcb-xfixes0", "libxcb", "libxcb"),
    "libxcb.so.1": ("libxcb1", "libxcb", "libxcb"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb", "libx11"),
    "libX11.so.6": ("libx11-6", "libX11", "libx11"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon", "libxkbcommon"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11", "libxkbcommon-x11"),
    "libwayland-client.so.0": ("libwayland-client0", "libwayland-client", "wayland"),
    "libwayland-cursor.so.0": ("libwayland-cursor0", "libwayland-cursor", "wayland"),
    "libwayland-egl.so.1": ("libwayland-egl1", "libwayland-egl", "wayland"),
    "libGL.so.1": ("libgl1", "libglvnd-glx", "libglvnd"),
    "libEGL.so.1": ("libegl1", "libglvnd-egl", "libglvnd"),
    "libGLX.so.0": ("libglx0", "libglvnd-glx", "libglvnd"),
    "libGLdispatch.so.0": ("libglvnd0", "libglvnd", "libglvnd"),
    "libOpenGL.so.0": ("libopengl0", "libglvnd-opengl", "libglvnd"),
    "libdrm.so.2": ("libdrm2", "libdrm", "libdrm"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig", "fontconfig"),
    "libfreetype.so.6": ("libfreetype6", "freetype", "freetype2"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs", "dbus"),
    "libglib-2.0.so.0": ("libglib2.0-0", "glib2", "glib2"),
    "libgthread-2.0.so.0": ("libglib2.0-0", "glib2", "glib2"),
    "libz.so.1": ("zlib1g", "zlib", "zlib"),
    "libzstd.so.1": ("libzstd1", "libzstd", "zstd"),
}
# the platform each plugin needs a display server for, and the variable that names it
DISPLAYS = {"xcb": "DISPLAY", "wayland": "WAYLAND_DISPLAY"}
NO_DISPLAY = ("error: there is no display to open the workbench on (DISPLAY and WAYLAND_DISPLAY are not set): "
              "run it in a desktop session or over `ssh -X`, or save a picture of the window without one: "
              "{command} --screenshot shot.png")
UNREACHABLE = ("error: the display {name}={value} does not answer (no display server listens there): start the "
               "desktop session it names, set {name} to one that runs, or save a picture of the window without "
               "one: {unset} {command} --screenshot shot.png")


def _bootstrap() -> str:
    """bootstrap.sh as the user can run it from where they are: by its path in the repository's folder,
    else by its whole path."""
    script = Path(__file__).resolve().parent / "bootstrap.sh"
    try:
        here = str(script.relative_to(Path.cwd().resolve()))
    except ValueError:
        return shlex.quote(str(script))
    return shlex.quote(here if "/" in here else f"./{here}")


NAMED_AT_MOST = 4        # more missing libraries than this are counted, not all named (the command lists all)
MISSING_NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found", re.MULTILINE)

Ldd = Callable[[Sequence[Path]], str]
Reachable = Callable[[str, Mapping[str, str]], bool]     # (platform, environ) -> its display server answers


@dataclass(frozen=True)
class Distro:
    """The distribution's family (one of FAMILIES, or None when not known) and its name for messages."""

    family: str | None
    name: str


@dataclass(frozen=True)
class System:
    """What a check reads from the machine, passed in so that tests can give a made-up one."""

    environ: Mapping[str, str]
    distro: Distro
    root: bool                       # installs need no sudo
    qt_dir: Path | None              # PySide6's bundled Qt (holds lib/ and plugins/), None without PySide6
    ldd: Ldd
    reachable: Reachable = lambda platform, environ: True


def read_distro(os_release: str) -> Distro:
    """The family of the distribution an os-release file describes (ID first, then ID_LIKE)."""
    fields = {}
    for line in os_release.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key.strip()] = value.strip().strip("\"'")
    ids = [fields.get("ID", "").lower()] + fields.get("ID_LIKE", "").lower().split()
    family = next((KNOWN_IDS[i] for i in ids if i in KNOWN_IDS), None)
    return Distro(family, fields.get("PRETTY_NAME") or fields.get("ID") or "this system")


def install_command(distro: Distro, packages: Sequence[str], root: bool) -> str | None:
    """The one command that installs ``packages`` here, or None for a family this file does not know."""
    if distro.family is None or not packages:
        return None
    return ("" if root else "sudo ") + INSTALLERS[distro.family] + " " + " ".join(packages)


def packages_for(sonames: Sequence[str], family: str) -> tuple[list[str], list[str]]:
    """(the packages that provide ``sonames`` in ``family``, in order and once each; the sonames not known)."""
    column = FAMILIES.index(family)
    packages: list[str] = []
    unknown: list[str] = []
    for so in sonames:
        if so not in LIBRARIES:
            unknown.append(so)
        elif LIBRARIES[so][column] not in packages:
            packages.append(LIBRARIES[so][column])
    return packages, unknown


def missing_sonames(ldd_output: str) -> list[str]:
    """The libraries ``ldd`` reports as "not found", once each, in the order it reports them."""
    return list(dict.fromkeys(MISSING_NOT_FOUND.findall(ldd_output)))



def _names(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _missing(sonames: Sequence[str]) -> str:
    if len(sonames) > NAMED_AT_MOST:
        shown = ", ".join(sonames[:NAMED_AT_MOST - 1])
        return f"{len(sonames)} libraries that are not installed ({shown} and {len(sonames) - NAMED_AT_MOST + 1} more)"
    return f"{_names(sonames)}, which {'is' if len(sonames) == 1 else 'are'} not installed"


def missing_libraries_line(what: str, sonames: Sequence[str], distro: Distro, root: bool) -> str:
    """The one line for ``sonames`` missing, with the command that installs them on ``distro``."""
    head = f"error: {what} needs {_missing(sonames)}"
    if distro.family is None:
        return (f"{head}: install the packages of {distro.name} that provide "
                f"{'it' if len(sonames) == 1 else 'them'} (README.md, \"System libraries\", lists them)")
    packages, unknown = packages_for(sonames, distro.family)
    fix = install_command(distro, packages, root)
    also = f" and the package that provides {_names(unknown)}" if unknown else ""
    if fix is None:
        return f"{head}: install the package that provides {_names(unknown)}"
    return f"{head}: install {'it' if len(sonames) == 1 else 'them'} with: {fix}{also}"


# --- the interpreter -------------------------------------------------------------------------------
def python_line(version: tuple[int, int], has_venv: bool, executable: str, distro: Distro, root: bool) -> str | None:
    """None when ``executable`` can make .venv, else the line that says what to install."""
    if has_venv:
        return None
    v = f"{version[0]}.{version[1]}"
    head = f"error: {executable} (Python {v}) cannot make a virtual environment (no venv/ensurepip module)"
    if distro.family == "debian":   # Debian and Ubuntu ship them in a package of their own
        return f"{head}: install it with: {install_command(distro, [f'python{v}-venv'], root)}"
    if distro.family == "fedora":
        return f"{head}: reinstall Python with: {install_command(distro, ['python3', 'python3-libs'], root)}"
    if distro.family == "arch":
        return f"{head}: reinstall Python with: {install_command(distro, ['python'], root)}"
    return f"{head}: install a Python that has them and run PYTHON=/path/to/python3 packaging/bootstrap.sh again"


def _has_venv() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("venv", "ensurepip"))


# --- Qt ------------------------------------------------------------------------------------------
def _shows_window(args: Sequence[str]) -> bool:
    """Whether ``main.py args`` opens the workbench (a first word other than gui is a command line tool)."""
    if any(a in ("-h", "--help") for a in args):
        return False
    return not args or args[0].startswith("-") or args[0] == "gui"


def requested_platforms(environ: Mapping[str, str], args: Sequence[str]) -> list[str]:
    """The Qt platform plugins Qt will try, in order, for ``main.py args`` under ``environ``."""
    spec = environ.get("QT_QPA_PLATFORM", "")
    if spec:
        return [p.split(":")[0].strip() for p in spec.split(";") if p.strip()]
    if "--screenshot" in args and not environ.get("DISPLAY") and not environ.get("WAYLAND_DISPLAY"):
        return ["offscreen"]   # what main.py itself chooses then
    if environ.get("WAYLAND_DISPLAY"):
        return ["wayland", "xcb"]
    return ["xcb"]


def plugin_file(qt_dir: Path, platform: str) -> Path | None:
    folder = qt_dir / "plugins" / "platforms"
    for name in (f"libq{platform}.so", f"libq{platform}-generic.so"):
        if (folder / name).is_file():
            return folder / name
    return None


def available_platforms(qt_dir: Path) -> list[str]:
    folder = qt_dir / "plugins" / "platforms"
    return sorted(p.name[len("libq"):-len(".so")] for p in folder.glob("libq*.so"))


def qt_line(system: System, platforms: Sequence[str], who: str, command: str | None = None) -> str | None:
    """None when Qt can start one of ``platforms`` here, else the one line that says why not and the fix
    (``command``: how the user started the workbench, default the bootstrap's ``gui``)."""
    command = command or f"{_bootstrap()} gui"
    if system.qt_dir is None:
        return None          # no PySide6 wheel: nothing of ours to check
    named = [p for p in platforms if p not in DISPLAYS or system.environ.get(DISPLAYS[p])]
    if not named:
        return NO_DISPLAY.format(command=command)
    usable = [p for p in named if p not in DISPLAYS or system.reachable(p, system.environ)]
    if not usable:                   # Qt would abort on the first, after a screenful of its own output
        name = DISPLAYS[named[0]]
        unset = " ".join(f"{v}=" for v in DISPLAYS.values() if system.environ.get(v))   # every stale one
        return UNREACHABLE.format(name=name, value=system.environ[name], unset=unset, command=command)
    first_problem = None
    for platform in usable:
        plugin = plugin_file(system.qt_dir, platform)
        if plugin is None:
            line = (f"error: QT_QPA_PLATFORM names a Qt platform plugin that does not exist ({platform}): "
                    f"unset it or use one of {', '.join(available_platforms(system.qt_dir))}")
        else:
            missing = missing_sonames(system.ldd([plugin, system.qt_dir / "lib" / "libQt6Widgets.so.6"]))
            if not missing:
                return None
            line = missing_libraries_line(f"{who}: Qt's {platform} platform plugin", missing, system.distro,
                                          system.root)
        first_problem = first_problem or line
    return first_problem


def _connects(family: int, address: object, timeout: float = 1.0) -> bool:
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(address)
        return True
    except OSError:
        return False


def display_reachable(platform: str, environ: Mapping[str, str]) -> bool:
    """Whether the display server ``platform`` would use answers: an X server at ``DISPLAY`` (its Unix
    socket, or TCP port 6000 + N on a host), a Wayland compositor at ``WAYLAND_DISPLAY`` (a socket in
    ``XDG_RUNTIME_DIR``). A name this cannot read is taken to answer: Qt then says for itself."""
    if platform == "xcb":
        m = re.fullmatch(r"(?:(?P<host>[^:/]*))?:(?P<n>\d+)(?:\.\d+)?", environ.get("DISPLAY", ""))
        if m is None:
            return True
        n, host = int(m["n"]), m["host"] or ""
        if host in ("", "unix"):
            path = f"/tmp/.X11-unix/X{n}"
            return any(_connects(socket.AF_UNIX, a) for a in (path, "\0" + path))   # the path, or abstract
        try:                          # a host's X server (ssh -X forwards localhost:10 and up)
            socket.create_connection((host, 6000 + n), timeout=1.0).close()
            return True
        except OSError:
            return False
    if platform == "wayland":
        name = environ.get("WAYLAND_DISPLAY", "")
        runtime = environ.get("XDG_RUNTIME_DIR", "")
        path = name if name.startswith("/") else (f"{runtime}/{name}" if runtime else "")
        return not path or _connects(socket.AF_UNIX, path)
    return True


def run_ldd(files: Sequence[Path]) -> str:
    """``ldd``'s report on ``files`` ("" where there is no ldd: nothing is then reported missing)."""
    try:
        return subprocess.run(["ldd", *map(str, files)], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def find_qt_dir() -> Path | None:
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return None
    qt = Path(list(spec.submodule_search_locations)[0]) / "Qt"
    return qt if (qt / "plugins" / "platforms").is_dir() else None


def this_system() -> System:
    try:
        os_release = OS_RELEASE.read_text(encoding="utf-8", errors="replace")
    except OSError:
        os_release = ""
    return System(os.environ, read_distro(os_release), os.geteuid() == 0, find_qt_dir(), run_ldd, display_reachable)


def main(argv: Sequence[str], system: System | None = None, command: str | None = None) -> int:
    system = system or this_system()
    what, args = (argv[0] if argv else ""), list(argv[1:])
    if what == "python":
        line = python_line(sys.version_info[:2], _has_venv(), sys.executable, system.distro, system.root)
    elif what == "gui":
        line = (qt_line(system, requested_platforms(system.environ, args), "the workbench cannot open its window",
                        command) if _shows_window(args) else None)
    elif what == "tests":
        line = qt_line(system, ["offscreen"], "the test suite cannot start Qt")   # its Qt tests run offscreen
    else:
        line = "error: usage: system_check.py python | gui [main.py args] | tests"
    if line:
        print(line, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
