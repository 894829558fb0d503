"""packaging/system_check.py: the libraries Qt's platform plugin needs, named per distribution, before Qt starts.

Made-up machines (an os-release text, ldd's report, an environment) exercise every branch; the last tests
run the real script and the real ldd on the PySide6 wheel installed here.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "packaging" / "system_check.py"
_spec = importlib.util.spec_from_file_location("strata_system_check", SCRIPT)
sc = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = sc          # dataclasses look their module up while the class is made
_spec.loader.exec_module(sc)

DEBIAN_12 = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\nID=debian\n'
UBUNTU = 'NAME="Ubuntu"\nVERSION_ID="24.04"\nID=ubuntu\nID_LIKE=debian\nPRETTY_NAME="Ubuntu 24.04.1 LTS"\n'
MINT = 'NAME="Linux Mint"\nID=linuxmint\nID_LIKE="ubuntu debian"\n'
FEDORA = 'NAME="Fedora Linux"\nVERSION_ID=41\nID=fedora\nPRETTY_NAME="Fedora Linux 41 (Workstation Edition)"\n'
ROCKY = 'NAME="Rocky Linux"\nID="rocky"\nID_LIKE="rhel centos fedora"\n'
ARCH = 'NAME="Arch Linux"\nPRETTY_NAME="Arch Linux"\nID=arch\nBUILD_ID=rolling\n'
ENDEAVOUR = 'NAME="EndeavourOS"\nID="endeavouros"\nID_LIKE="arch"\n'
SUSE = 'NAME="openSUSE Tumbleweed"\nID="opensuse-tumbleweed"\nID_LIKE="opensuse suse"\nPRETTY_NAME="openSUSE Tumbleweed"\n'

# ldd on a minimal Debian (libxcb-icccm4 and libxcb-keysyms1 absent): a missing library shows once per
# library that links it
LDD_MINIMAL_DEBIAN = """\
/x/PySide6/Qt/plugins/platforms/libqxcb.so:
\tlinux-vdso.so.1 (0x00007fa6f0138000)
\tlibQt6XcbQpa.so.6 => /x/PySide6/Qt/plugins/platforms/../../lib/libQt6XcbQpa.so.6 (0x00007fa6efa00000)
\tlibxcb-cursor.so.0 => /lib/x86_64-linux-gnu/libxcb-cursor.so.0 (0x00007fa6eff80000)
\tlibxcb-icccm.so.4 => not found
\tlibxcb-image.so.0 => /lib/x86_64-linux-gnu/libxcb-image.so.0 (0x00007fa6eff72000)
\tlibxcb-keysyms.so.1 => not found
\tlibxcb-icccm.so.4 => not found
\tlibxcb-keysyms.so.1 => not found
/x/PySide6/Qt/lib/libQt6Widgets.so.6:
\tlibGL.so.1 => /lib/x86_64-linux-gnu/libGL.so.1 (0x00007f72add79000)
"""


def fake_qt(tmp_path: Path, platforms=("xcb", "wayland", "offscreen", "minimal", "eglfs")) -> Path:
    qt = tmp_path / "PySide6" / "Qt"
    (qt / "plugins" / "platforms").mkdir(parents=True)
    (qt / "lib").mkdir()
    for name in platforms:
        (qt / "plugins" / "platforms" / f"libq{name}.so").write_bytes(b"")
    (qt / "lib" / "libQt6Widgets.so.6").write_bytes(b"")
    return qt


class FakeLdd:
    """ldd that reports ``missing`` for the plugins named in it; records what it was asked about."""

    def __init__(self, missing: dict[str, list[str]] | None = None) -> None:
        self.missing = missing or {}
        self.asked: list[list[str]] = []

    def __call__(self, files) -> str:
        names = [Path(f).name for f in files]
        self.asked.append(names)
        out = []
        for name in names:
            out.append(f"/x/{name}:")
            out += [f"\t{so} => not found" for so in self.missing.get(name, [])]
        return "\n".join(out) + "\n"


def system(tmp_path, environ, os_release=DEBIAN_12, ldd=None, root=False, qt=True) -> sc.System:
    return sc.System(environ, sc.read_distro(os_release), root, fake_qt(tmp_path) if qt else None,
                     ldd if ldd is not None else FakeLdd())


MINIMAL_DEBIAN = {"libqxcb.so": ["libxcb-icccm.so.4", "libxcb-keysyms.so.1", "libxcb-icccm.so.4"]}


@pytest.mark.parametrize("text, family", [(DEBIAN_12, "debian"), (UBUNTU, "debian"), (MINT, "debian"),
                                          (FEDORA, "fedora"), (ROCKY, "fedora"), (ARCH, "arch"),
                                          (ENDEAVOUR, "arch"), (SUSE, None), ("", None)])
def test_the_family_comes_from_id_then_id_like(text, family):
    assert sc.read_distro(text).family == family


def test_ldd_report_gives_each_missing_library_once_in_order():
    assert sc.missing_sonames(LDD_MINIMAL_DEBIAN) == ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"]
    assert sc.missing_sonames("\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x1)\n") == []


def test_minimal_debian_with_a_display_gets_the_apt_get_line_and_exit_2(tmp_path, capsys):
    ldd = FakeLdd(MINIMAL_DEBIAN)
    assert sc.main(["gui"], system(tmp_path, {"DISPLAY": ":0"}, ldd=ldd)) == 2
    err = capsys.readouterr().err
    assert err == ("error: the workbench cannot open its window: Qt's xcb platform plugin needs libxcb-icccm.so.4 "
                   "and libxcb-keysyms.so.1, which are not installed: install them with: "
                   "sudo apt-get install libxcb-icccm4 libxcb-keysyms1\n")
    assert ldd.asked == [["libqxcb.so", "libQt6Widgets.so.6"]]


@pytest.mark.parametrize("os_release, command", [
    (FEDORA, "sudo dnf install xcb-util-wm xcb-util-keysyms"),
    (ROCKY, "sudo dnf install xcb-util-wm xcb-util-keysyms"),
    (ARCH, "sudo pacman -S --needed xcb-util-wm xcb-util-keysyms"),
    (UBUNTU, "sudo apt-get install libxcb-icccm4 libxcb-keysyms1"),
])
def test_each_family_gets_its_own_package_names(tmp_path, capsys, os_release, command):
    assert sc.main(["gui"], system(tmp_path, {"DISPLAY": ":1"}, os_release, FakeLdd(MINIMAL_DEBIAN))) == 2
    assert capsys.readouterr().err.rstrip("\n").endswith(f"install them with: {command}")


def test_root_needs_no_sudo_and_a_package_is_named_once(tmp_path, capsys):
    missing = {"libqxcb.so": ["libxcb-randr.so.0", "libxcb-shm.so.0", "libxcb-xkb.so.1"]}
    assert sc.main(["gui"], system(tmp_path, {"DISPLAY": ":0"}, FEDORA, FakeLdd(missing), root=True)) == 2
    assert capsys.readouterr().err.rstrip("\n").endswith("install them with: dnf install libxcb")


def test_a_library_the_table_lacks_is_still_named(tmp_path, capsys):
    missing = {"libqxcb.so": ["libxcb-icccm.so.4", "libfuture.so.9"]}
    assert sc.main(["gui"], system(tmp_path, {"DISPLAY": ":0"}, DEBIAN_12, FakeLdd(missing))) == 2
    assert capsys.readouterr().err.rstrip("\n").endswith(
        "sudo apt-get install libxcb-icccm4 and the package that provides libfuture.so.9")


def test_an_unknown_distribution_is_told_the_libraries_and_where_the_list_is(tmp_path, capsys):
    assert sc.main(["gui"], system(tmp_path, {"DISPLAY": ":0"}, SUSE, FakeLdd(MINIMAL_DEBIAN))) == 2
    err = capsys.readouterr().err
    assert "install the packages of openSUSE Tumbleweed that provide them" in err and "README.md" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("platform", ["offscreen", "minimal", "offscreen:fontengine=freetype"])
def test_offscreen_and_minimal_need_no_display_and_no_x_libraries(tmp_path, capsys, platform):
    ldd = FakeLdd(MINIMAL_DEBIAN)      # the xcb libraries are missing, as on CI: irrelevant here
    assert sc.main(["gui"], system(tmp_path, {"QT_QPA_PLATFORM": platform}, ldd=ldd)) == 0
    assert capsys.readouterr().err == ""
    assert ldd.asked == [[f"libq{platform.split(':')[0]}.so", "libQt6Widgets.so.6"]]


def test_no_display_says_how_to_run_without_looking_at_libraries(tmp_path, capsys):
    ldd = FakeLdd(MINIMAL_DEBIAN)
    assert sc.main(["gui", "--model", "m"], system(tmp_path, {}, ldd=ldd)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: there is no display") and "DISPLAY" in err and "--screenshot" in err
    assert ldd.asked == []


def test_a_screenshot_without_a_display_runs_offscreen_as_main_py_does(tmp_path, capsys):
    ldd = FakeLdd(MINIMAL_DEBIAN)
    assert sc.main(["gui", "--screenshot", "out.png"], system(tmp_path, {}, ldd=ldd)) == 0
    assert ldd.asked == [["libqoffscreen.so", "libQt6Widgets.so.6"]]


@pytest.mark.parametrize("args", [["info", "--model", "m"], ["generate", "--prompt", "x"], ["--help"]])
def test_command_line_tools_open_no_window_and_are_not_checked(tmp_path, args):
    ldd = FakeLdd(MINIMAL_DEBIAN)
    assert sc.main(["gui", *args], system(tmp_path, {}, ldd=ldd)) == 0
    assert ldd.asked == []


def test_a_wayland_session_runs_when_wayland_works_even_without_xcb_libraries(tmp_path):
    ldd = FakeLdd(MINIMAL_DEBIAN)
    env = {"WAYLAND_DISPLAY": "wayland-0", "DISPLAY": ":0"}
    assert sc.main(["gui"], system(tmp_path, env, ldd=ldd)) == 0
    assert ldd.asked == [["libqwayland.so", "libQt6Widgets.so.6"]]


def test_wayland_alone_names_the_wayland_packages(tmp_path, capsys):
    ldd = FakeLdd({"libqwayland.so": ["libwayland-cursor.so.0"]})
    assert sc.main(["gui"], system(tmp_path, {"WAYLAND_DISPLAY": "wayland-0"}, ARCH, ldd)) == 2
    assert capsys.readouterr().err.rstrip("\n").endswith("install it with: sudo pacman -S --needed wayland")


def test_an_explicit_platform_list_is_tried_in_order(tmp_path):
    ldd = FakeLdd({"libqwayland.so": ["libwayland-cursor.so.0"]})
    env = {"QT_QPA_PLATFORM": "wayland;xcb", "WAYLAND_DISPLAY": "w", "DISPLAY": ":0"}
    assert sc.main(["gui"], system(tmp_path, env, ldd=ldd)) == 0     # xcb is there to fall back on
    assert [a[0] for a in ldd.asked] == ["libqwayland.so", "libqxcb.so"]


def test_a_platform_qt_does_not_have_is_named_with_the_ones_it_has(tmp_path, capsys):
    assert sc.main(["gui"], system(tmp_path, {"QT_QPA_PLATFORM": "xbc"})) == 2
    err = capsys.readouterr().err
    assert "(xbc)" in err and "eglfs, minimal, offscreen, wayland, xcb" in err


def test_the_test_suite_check_looks_at_the_offscreen_plugin_only(tmp_path):
    ldd = FakeLdd({"libqoffscreen.so": ["libEGL.so.1"], **MINIMAL_DEBIAN})
    assert sc.main(["tests"], system(tmp_path, {"DISPLAY": ":0"}, ldd=ldd)) == 2
    assert ldd.asked == [["libqoffscreen.so", "libQt6Widgets.so.6"]]


def test_without_pyside6_there_is_nothing_to_check(tmp_path):
    assert sc.main(["gui"], system(tmp_path, {}, qt=False)) == 0


@pytest.mark.parametrize("os_release, fix", [
    (DEBIAN_12, "install it with: sudo apt-get install python3.11-venv"),
    (UBUNTU, "install it with: sudo apt-get install python3.11-venv"),
    (FEDORA, "reinstall Python with: sudo dnf install python3 python3-libs"),
    (ARCH, "reinstall Python with: sudo pacman -S --needed python"),
    (SUSE, "run PYTHON=/path/to/python3 packaging/bootstrap.sh again"),
])
def test_a_python_without_venv_is_told_the_package(os_release, fix):
    line = sc.python_line((3, 11), False, "/usr/bin/python3", sc.read_distro(os_release), root=False)
    assert line.startswith("error: /usr/bin/python3 (Python 3.11) cannot make a virtual environment")
    assert line.endswith(fix)
    assert sc.python_line((3, 11), True, "/usr/bin/python3", sc.read_distro(os_release), root=False) is None


def _qt_dir() -> Path:
    qt = sc.find_qt_dir()
    if qt is None:
        pytest.skip("no PySide6 wheel here")
    return qt


GLIBC = {"libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1",
         "libdl.so.2", "libpthread.so.0", "librt.so.1"}


def _system_libraries_linked(*platforms: str) -> set[str]:
    """What the installed Qt's libraries and ``platforms``' plugins link (readelf -d NEEDED), less Qt and glibc."""
    qt = _qt_dir()
    if shutil.which("readelf") is None:
        pytest.skip("no readelf here")
    files = [qt / "plugins" / "platforms" / f"libq{p}.so" for p in platforms]
    files += [qt / "lib" / f"libQt6{m}.so.6" for m in ("Core", "Gui", "Widgets", "DBus", "XcbQpa")]
    needed: set[str] = set()
    for f in filter(Path.is_file, files):
        dynamic = subprocess.run(["readelf", "-d", str(f)], capture_output=True, text=True).stdout
        needed |= {line.split("[")[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line}
    return {n for n in needed if not n.startswith(("libQt6", "libicu"))} - GLIBC


def test_every_library_the_installed_qt_links_has_a_package_in_each_family():
    """A newer Qt that links another library makes this name it."""
    linked = _system_libraries_linked("xcb", "wayland", "offscreen", "minimal")
    assert {"libxcb-icccm.so.4", "libxcb-keysyms.so.1", "libEGL.so.1"} <= linked
    assert sorted(linked - set(sc.LIBRARIES)) == []


@pytest.mark.parametrize("family, command", [("debian", "sudo apt-get install "), ("fedora", "sudo dnf install "),
                                             ("arch", "sudo pacman -S --needed ")])
def test_the_readme_lists_every_package_the_xcb_window_needs(family, command):
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### System libraries"):]
    line = next(line for line in section.splitlines() if line.startswith(command))
    listed = set(line[len(command):].split("#")[0].split())
    wanted, unknown = sc.packages_for(sorted(_system_libraries_linked("xcb", "offscreen")), family)
    assert unknown == [] and sorted(set(wanted) - listed) == []


def _run_script(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env={**base, **env}, timeout=60)


def test_the_script_with_no_display_prints_one_line_and_exits_2():
    _qt_dir()
    done = _run_script("gui")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: there is no display") and done.stderr.count("\n") == 1


def test_the_script_passes_offscreen_where_this_suite_runs_qt():
    _qt_dir()
    done = _run_script("gui", QT_QPA_PLATFORM="offscreen")
    assert (done.returncode, done.stderr) == (0, "")
    assert _run_script("tests").returncode == 0


def test_many_missing_libraries_are_counted_and_the_command_installs_them_all(tmp_path, capsys):
    """A minbase Debian lacks every library of the window (debootstrap --variant=minbase bookworm)."""
    sonames = ["libGL.so.1", "libxkbcommon.so.0", "libxcb-icccm.so.4", "libxcb-keysyms.so.1", "libX11.so.6",
               "libEGL.so.1", "libfontconfig.so.1"]
    assert sc.main(["gui"], system(tmp_path, {"DISPLAY": ":0"}, ldd=FakeLdd({"libqxcb.so": sonames}))) == 2
    err = capsys.readouterr().err
    assert ("needs 7 libraries that are not installed (libGL.so.1, libxkbcommon.so.0, libxcb-icccm.so.4 and 4 more)"
            in err)
    assert err.rstrip("\n").endswith("sudo apt-get install libgl1 libxkbcommon0 libxcb-icccm4 libxcb-keysyms1 "
                                     "libx11-6 libegl1 libfontconfig1")


def test_main_py_run_directly_checks_before_qt_starts():
    """`python main.py` without the bootstrap: one line and exit 2 where Qt would abort, nothing started."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    run = subprocess.run([sys.executable, str(ROOT / "main.py"), "--device", "cpu"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and run.stderr.startswith("error: there is no display")
    # the picture it offers is taken the way the user ran it, not through the installer
    command = run.stderr.split("without one: ")[1].split(" --screenshot")[0]
    assert command.endswith("main.py") and "bootstrap" not in command
    shot = subprocess.run([*shlex.split(command), "--screenshot", "/dev/null.png", "--device", "cpu", "--help"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert shot.returncode == 0 and "--screenshot" in shot.stdout


def test_a_display_that_does_not_answer_is_one_line_before_qt_aborts(tmp_path, capsys):
    silent = sc.System({"DISPLAY": ":7"}, sc.read_distro(DEBIAN_12), False, fake_qt(tmp_path), FakeLdd(),
                       lambda platform, environ: False)
    assert sc.main(["gui"], silent) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the display DISPLAY=:7 does not answer") and "--screenshot" in err
    assert err.count("\n") == 1 and "DISPLAY= packaging/bootstrap.sh gui --screenshot" in err
    both = sc.System({"DISPLAY": ":7", "WAYLAND_DISPLAY": "wayland-0"}, sc.read_distro(DEBIAN_12), False,
                     silent.qt_dir, FakeLdd(), lambda platform, environ: False)
    assert sc.main(["gui"], both) == 2            # a session that outlived its desktop: the fix clears both
    assert "DISPLAY= WAYLAND_DISPLAY= packaging/bootstrap.sh gui --screenshot" in capsys.readouterr().err


def test_a_display_server_is_reachable_only_where_one_listens(tmp_path):
    import socket
    assert not sc.display_reachable("xcb", {"DISPLAY": ":9876"})              # no X server at that number
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as x:               # an "X server" on a TCP port
        x.bind(("127.0.0.1", 0))
        x.listen()
        port = x.getsockname()[1]
        assert port > 6000 and sc.display_reachable("xcb", {"DISPLAY": f"127.0.0.1:{port - 6000}.0"})
    wayland = tmp_path / "wayland-1"
    assert not sc.display_reachable("wayland", {"WAYLAND_DISPLAY": "wayland-1", "XDG_RUNTIME_DIR": str(tmp_path)})
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as w:
        w.bind(str(wayland))
        w.listen()
        assert sc.display_reachable("wayland", {"WAYLAND_DISPLAY": "wayland-1", "XDG_RUNTIME_DIR": str(tmp_path)})
        assert sc.display_reachable("wayland", {"WAYLAND_DISPLAY": str(wayland)})
    assert sc.display_reachable("xcb", {"DISPLAY": "something odd"})          # unreadable: Qt says for itself


def test_the_no_display_advice_runs_from_any_folder(tmp_path, monkeypatch):
    # from the repository's folder the short path; from elsewhere the script's whole path
    monkeypatch.chdir(Path(SCRIPT).resolve().parent.parent)
    assert sc._bootstrap() == "packaging/bootstrap.sh"
    monkeypatch.chdir(tmp_path)
    assert sc._bootstrap() == str(Path(SCRIPT).resolve().parent / "bootstrap.sh")
