"""The conversation store on disk: atomic writes, versions of a reply, files set aside, the trash, the writer."""
from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path

import pytest

from app.conversations import Conversation, ConversationStore, Reply, StoredMessage, write_error_line
from app.store_writer import SaveJob, StoreWriter, TrashJob, WriteResult


def _conv(text: str = "hello", reply: str = "world") -> Conversation:
    return Conversation(title=text, messages=[StoredMessage("user", text), StoredMessage("assistant", reply, "s")])


def _files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


# --- the format ------------------------------------------------------------------------------------
def test_versions_of_a_reply_round_trip_and_the_chosen_one_is_the_message(tmp_path):
    msg = StoredMessage("assistant", "first", "stats 1")
    msg.add_reply(Reply("second", "stats 2"))
    msg.add_reply(Reply("third", "", interrupted=True))
    assert (msg.chosen, msg.content, msg.interrupted) == (2, "third", True)
    msg.choose(0)
    assert (msg.content, msg.stats, msg.interrupted) == ("first", "stats 1", False)
    msg.choose(9)                                   # out of range: the nearest version
    assert msg.chosen == 2
    store = ConversationStore(tmp_path)
    conv = Conversation(messages=[StoredMessage("user", "q"), msg])
    msg.choose(1)
    store.save(conv)
    raw = json.loads(store.path_of(conv.id).read_text())
    # an older Strata reads "content": it finds the version the user chose
    assert raw["messages"][1]["content"] == "second" and len(raw["messages"][1]["alternatives"]) == 3
    back = store.load_all().conversations[0].messages[1]
    assert [r.content for r in back.replies()] == ["first", "second", "third"]
    assert back.replies()[2].interrupted and back.chosen == 1 and back.content == "second"


@pytest.mark.parametrize("value, kept", [(352, 352), (0, 0), (None, None), ("many", None), (-3, None), (True, None)])
def test_the_context_a_chat_took_round_trips_and_a_stray_value_there_does_not_cost_the_chat(tmp_path, value, kept):
    store = ConversationStore(tmp_path)
    conv = _conv()
    store.save(conv)
    data = json.loads((tmp_path / f"{conv.id}.json").read_text())
    data["context_used"] = value
    (tmp_path / f"{conv.id}.json").write_text(json.dumps(data))
    loaded = store.load_all()
    assert loaded.problems == [] and [c.context_used for c in loaded.conversations] == [kept]
    assert loaded.conversations[0].messages == conv.messages


def test_deleting_a_version_keeps_the_others_and_never_the_last_one():
    msg = StoredMessage("assistant", "a")
    msg.delete_chosen()
    assert msg.content == "a"                       # a single reply cannot be deleted as a "version"
    msg.add_reply(Reply("b"))
    msg.add_reply(Reply("c"))
    msg.choose(1)
    msg.delete_chosen()
    assert [r.content for r in msg.replies()] == ["a", "c"] and msg.content == "c"
    msg.delete_chosen()
    assert msg.replies() == [Reply("a")] and msg.alternatives == [] and msg.content == "a"


def test_a_file_of_the_first_format_loads_unchanged(tmp_path):
    old = {"version": 1, "id": "abc", "title": "Old chat", "system_prompt": "be brief", "created": 1.0,
           "updated": 2.0, "messages": [{"role": "user", "content": "hi", "stats": ""},
                                        {"role": "assistant", "content": "hello", "stats": "TTFT 5 ms"}]}
    (tmp_path / "abc.json").write_text(json.dumps(old))
    loaded = ConversationStore(tmp_path).load_all()
    assert loaded.problems == []
    conv = loaded.conversations[0]
    assert (conv.id, conv.title, conv.system_prompt) == ("abc", "Old chat", "be brief")
    reply = conv.messages[1]
    assert (reply.content, reply.stats, reply.interrupted, reply.alternatives) == ("hello", "TTFT 5 ms", False, [])


# --- files that cannot be read -------------------------------------------------------------------------
@pytest.mark.parametrize("content, reason", [
    (b"{not json", "not valid JSON (line 1, column 2)"),
    (b"\xff\xfe{}", "not UTF-8 text"),
    (b"[1, 2]", "the file holds a list"),
    (b'{"id": "x", "messages": "hi"}', "messages is text, expected a list"),
    (b'{"id": "x", "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": 5}]}',
     "messages[1].content is a number, expected text"),
    (b'{"id": "x", "messages": [{"role": "robot", "content": "a"}]}', "messages[0].role is 'robot'"),
    (b'{"id": "x", "messages": [{"role": "assistant", "content": "a", "alternatives": [{"content": "a"}, 3]}]}',
     "messages[0].alternatives[1] is a number, expected an object"),
])
def test_a_damaged_file_is_renamed_aside_and_reported_never_skipped_or_deleted(tmp_path, content, reason):
    store = ConversationStore(tmp_path)
    good = _conv()
    store.save(good)
    (tmp_path / "bad.json").write_bytes(content)
    loaded = store.load_all()
    assert [c.id for c in loaded.conversations] == [good.id]
    assert len(loaded.problems) == 1
    line = loaded.problems[0]
    assert "bad.json" in line and reason in line and str(tmp_path) in line and "\n" not in line
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("bad.corrupt-")]
    assert len(aside) == 1 and aside[0].name.endswith(".json") and aside[0].read_bytes() == content
    assert aside[0].name in line and not (tmp_path / "bad.json").exists()
    # the file set aside is kept but never read (or renamed) again
    again = store.load_all()
    assert again.problems == [] and [p.name for p in tmp_path.iterdir() if "corrupt" in p.name] == [aside[0].name]


def test_a_file_of_a_newer_format_is_left_as_it_is_and_said(tmp_path):
    # a later Strata's file may hold what this one does not know: loading and saving it back would drop
    # that, so it is neither loaded nor renamed, and the line says which version to use
    store = ConversationStore(tmp_path)
    good = _conv()
    store.save(good)
    newer = dict(good.to_json(), id="abcdef123456", version=99, reactions=["a field of later versions"])
    text = json.dumps(newer)
    (tmp_path / "abcdef123456.json").write_text(text)
    loaded = store.load_all()
    assert [c.id for c in loaded.conversations] == [good.id]
    assert loaded.problems == ["Conversation file abcdef123456.json was written by a newer Strata (format 99; this "
                               "one reads up to 2); it was left as it is and not loaded. To open it, use that newer "
                               "version."]
    assert (tmp_path / "abcdef123456.json").read_text() == text and store.holds("abcdef123456")


@pytest.mark.parametrize("fields", [{"title": None}, {"updated": "yesterday"}, {"created": True, "updated": None},
                                    {"messages": [{"role": "user", "content": "a"},
                                                  {"role": "assistant", "content": "b", "stats": None,
                                                   "interrupted": "yes"}]}])
def test_a_stray_value_in_what_the_window_only_shows_or_sorts_by_does_not_set_a_chat_aside(tmp_path, fields):
    # a title, times, a reply's summary line or flags of another type fall back to their defaults: the
    # chat opens with every message (the next save writes the defaults)
    data = {"version": 2, "id": "x", "messages": [{"role": "user", "content": "kept"}], **fields}
    (tmp_path / "x.json").write_text(json.dumps(data))
    loaded = ConversationStore(tmp_path).load_all()
    assert loaded.problems == [] and [c.id for c in loaded.conversations] == ["x"]
    conv = loaded.conversations[0]
    assert [m.content for m in conv.messages] == [m["content"] for m in data["messages"]]
    assert isinstance(conv.title, str) and isinstance(conv.updated, float | int)


def test_a_damaged_file_that_cannot_be_renamed_is_left_as_it_is_and_said_so(tmp_path, monkeypatch):
    (tmp_path / "bad.json").write_text("{")
    real = os.replace

    def refuse(src, dst):
        if "corrupt" in str(dst):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", refuse)
    line, = ConversationStore(tmp_path).load_all().problems
    assert "could not be renamed aside (Permission denied)" in line and "left as it is" in line
    assert (tmp_path / "bad.json").read_text() == "{"


def test_a_conversations_folder_that_is_a_file_is_reported_at_load(tmp_path):
    where = tmp_path / "conversations"
    where.write_text("not a folder")
    loaded = ConversationStore(where).load_all()
    assert loaded.conversations == [] and len(loaded.problems) == 1
    assert str(where) in loaded.problems[0] and "a file is in the way" in loaded.problems[0]


# --- writing ------------------------------------------------------------------------------------------
def test_a_save_is_fsynced_before_the_rename(tmp_path, monkeypatch):
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append("replace"), real_replace(a, b))[1])
    ConversationStore(tmp_path).save(_conv())
    assert calls[:2] == ["fsync", "replace"], "the data must be on disk before the new name points at it"


def test_a_failed_rename_leaves_the_old_file_whole_and_no_temporary_file(tmp_path, monkeypatch):
    store = ConversationStore(tmp_path)
    conv = _conv(reply="kept")
    store.save(conv)
    before = _files(tmp_path)
    conv.messages[1].set_reply("new text")

    def full(_a, _b):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError) as caught:
        store.save(conv)
    assert _files(tmp_path) == before
    line = write_error_line(store.folder, caught.value)
    assert str(tmp_path) in line and "No space left on device" in line and "free some disk space" in line


@pytest.mark.parametrize("blocked", ["folder", "parent"])
def test_a_file_where_the_folder_should_be_names_that_file(tmp_path, blocked):
    blocker = tmp_path / "data"
    blocker.write_text("in the way")
    folder = blocker if blocked == "folder" else blocker / "conversations"
    with pytest.raises(OSError) as caught:
        ConversationStore(folder).save(_conv())
    line = write_error_line(folder, caught.value)
    assert f"Conversations cannot be saved in {folder}" in line
    assert f"a file is in the way: rename {blocker} or remove it" in line
    assert "kept in memory" in line and blocker.read_text() == "in the way"


@pytest.mark.parametrize("code, fix", [
    (errno.EACCES, "make {parent} writable, or start Strata with XDG_DATA_HOME set to a folder you can write"),
    (errno.EPERM, "make {parent} writable"),
    (errno.EROFS, "the disk is read-only: start Strata with XDG_DATA_HOME set to a folder you can write"),
    (errno.EDQUOT, "free some disk space"),
    (errno.EIO, "start Strata with XDG_DATA_HOME set to a folder you can write"),
])
def test_every_failed_save_names_a_fix_that_works_here(tmp_path, code, fix):
    folder = tmp_path / "not" / "yet"
    line = write_error_line(folder, OSError(code, os.strerror(code)))
    assert line.startswith(f"Conversations cannot be saved in {folder}: {os.strerror(code)}. To fix it, ")
    assert fix.format(parent=tmp_path) in line and "\n" not in line


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_a_folder_the_system_refuses_is_reported_not_raised_at_the_user():
    # a real refusal even as root: nothing can be created under /proc
    folder = Path("/proc/strata-test/conversations")
    with pytest.raises(OSError) as caught:
        ConversationStore(folder).save(_conv())
    line = write_error_line(folder, caught.value)
    assert str(folder) in line and (caught.value.strerror or "") in line and "XDG_DATA_HOME" in line


def test_trash_moves_the_file_and_restore_brings_it_back(tmp_path):
    store = ConversationStore(tmp_path)
    conv = _conv()
    store.save(conv)
    data = store.path_of(conv.id).read_bytes()
    store.trash(conv.id)
    assert not store.path_of(conv.id).exists()
    assert (store.trash_folder / f"{conv.id}.json").read_bytes() == data
    assert store.load_all().conversations == []     # the trash is not read as conversations
    store.restore(conv.id)
    assert store.path_of(conv.id).read_bytes() == data and not (store.trash_folder / f"{conv.id}.json").exists()
    store.trash("never-saved")                        # nothing there: nothing to do


def test_restore_never_overwrites_a_file_that_is_there(tmp_path):
    store = ConversationStore(tmp_path)
    conv = _conv(reply="old")
    store.save(conv)
    store.trash(conv.id)
    conv.messages[1].set_reply("newer")
    store.save(conv)
    store.restore(conv.id)
    assert json.loads(store.path_of(conv.id).read_text())["messages"][1]["content"] == "newer"
    assert (store.trash_folder / f"{conv.id}.json").exists()


# --- the writer thread --------------------------------------------------------------------------------
class GatedStore(ConversationStore):
    """A store whose writes wait for ``gate``: the writer thread is held busy while jobs queue up."""

    def __init__(self, folder) -> None:
        super().__init__(folder)
        self.gate = threading.Event()
        self.started = threading.Event()
        self.written: list[str] = []

    def write(self, conv_id: str, data: dict) -> None:
        self.started.set()
        self.gate.wait(10)
        self.written.append(data["messages"][-1]["content"])
        super().write(conv_id, data)


def test_the_writer_keeps_only_the_newest_snapshot_waiting(tmp_path):
    store = GatedStore(tmp_path)
    results: list[WriteResult] = []
    writer = StoreWriter(store, results.append)
    conv = _conv(reply="r0")
    writer.put(SaveJob(conv.id, conv.to_json()))
    assert store.started.wait(10)
    for i in range(1, 6):
        conv.messages[1].set_reply(f"r{i}")
        writer.put(SaveJob(conv.id, conv.to_json()))
    store.gate.set()
    assert writer.flush(10)
    assert store.written == ["r0", "r5"], "snapshots nobody needs any more are not written"
    assert json.loads(store.path_of(conv.id).read_text())["messages"][1]["content"] == "r5"
    assert [r.error for r in results] == [None, None]
    writer.close()


def test_the_writer_keeps_a_trash_after_the_save_before_it(tmp_path):
    store = GatedStore(tmp_path)
    writer = StoreWriter(store, lambda _r: None)
    other, conv = _conv("other"), _conv()
    writer.put(SaveJob(other.id, other.to_json()))
    assert store.started.wait(10)
    writer.put(SaveJob(conv.id, conv.to_json()))
    writer.put(TrashJob(conv.id))
    writer.put(SaveJob(other.id, other.to_json()))
    store.gate.set()
    assert writer.flush(10)
    assert not store.path_of(conv.id).exists() and (store.trash_folder / f"{conv.id}.json").exists()
    writer.close()


def test_a_failed_save_is_tried_again_with_the_next_change(tmp_path):
    blocker = tmp_path / "conversations"
    blocker.write_text("in the way")
    store = ConversationStore(blocker)
    results: list[WriteResult] = []
    writer = StoreWriter(store, results.append)
    first, second = _conv("first"), _conv("second")
    writer.put(SaveJob(first.id, first.to_json()))
    assert writer.flush(10)
    assert results[-1].error is not None and str(blocker) in results[-1].error
    blocker.unlink()                              # the user moves the file out of the way
    writer.put(SaveJob(second.id, second.to_json()))
    assert writer.flush(10)
    assert store.path_of(first.id).exists() and store.path_of(second.id).exists()
    assert [r.error for r in results[1:]] == [None, None]
    writer.close()


def test_a_failed_save_is_tried_again_when_the_window_closes(tmp_path):
    # the disk had no room when the reply ended, the user freed some and quit: the chat is written then
    blocker = tmp_path / "conversations"
    blocker.write_text("in the way")
    store = ConversationStore(blocker)
    results: list[WriteResult] = []
    writer = StoreWriter(store, results.append)
    conv = _conv("kept")
    writer.put(SaveJob(conv.id, conv.to_json()))
    assert writer.flush(10) and results[-1].error is not None
    blocker.unlink()
    assert writer.close()
    assert json.loads(store.path_of(conv.id).read_text())["id"] == conv.id
    assert results[-1].error is None and writer.rescued == []


def test_a_save_that_fails_again_at_close_is_copied_where_it_can_go(tmp_path, monkeypatch):
    # still no way into the folder when the window closes: a copy beside it, named, and close says so
    import app.store_writer as sw
    blocker = tmp_path / "data" / "conversations"
    blocker.parent.mkdir()
    blocker.write_text("in the way")
    unwritable = tmp_path / "nowhere"
    unwritable.write_text("a file, so no folder goes here")
    beside = sw.rescue_folders(blocker)[0]
    monkeypatch.setattr(sw, "rescue_folders", lambda folder: [unwritable / "x", tmp_path / "rescue"])
    store = ConversationStore(blocker)
    results: list[WriteResult] = []
    writer = StoreWriter(store, results.append)
    conv = _conv("rescued")
    writer.put(SaveJob(conv.id, conv.to_json()))
    assert writer.flush(10)
    assert not writer.close()
    copy = tmp_path / "rescue" / f"{conv.id}.json"
    assert writer.rescued == [copy] and json.loads(copy.read_text()) == conv.to_json()
    assert str(copy) in results[-1].error and str(blocker) in results[-1].error
    assert beside == blocker.parent / "Strata unsaved chats"


def test_a_rescue_copy_cut_short_by_a_full_disk_leaves_no_empty_file(tmp_path, monkeypatch):
    # the first rescue folder takes the file's name but not its bytes (a full disk): nothing is left there,
    # not even the folder made for it, and the copy goes to the next folder
    import pathlib

    import app.store_writer as sw
    blocker = tmp_path / "data" / "conversations"
    blocker.parent.mkdir()
    blocker.write_text("in the way")
    full, spare = tmp_path / "full" / "Strata unsaved chats", tmp_path / "spare"
    monkeypatch.setattr(sw, "rescue_folders", lambda folder: [full, spare])
    real_write = pathlib.Path.write_text

    def write_text(self, data, *args, **kwargs):
        if full in self.parents:
            real_write(self, "", *args, **kwargs)           # the name is made, then no room for the bytes
            raise OSError(28, "No space left on device", str(self))
        return real_write(self, data, *args, **kwargs)
    monkeypatch.setattr(pathlib.Path, "write_text", write_text)
    writer = StoreWriter(ConversationStore(blocker), lambda r: None)
    conv = _conv("rescued")
    writer.put(SaveJob(conv.id, conv.to_json()))
    assert writer.flush(10) and not writer.close()
    assert not full.exists() and (tmp_path / "full").is_dir()
    assert writer.rescued == [spare / f"{conv.id}.json"]
    assert json.loads((spare / f"{conv.id}.json").read_text()) == conv.to_json()


def test_after_close_a_save_is_written_at_once(tmp_path):
    store = ConversationStore(tmp_path)
    results: list[WriteResult] = []
    writer = StoreWriter(store, results.append)
    writer.close()
    conv = _conv(reply="late")     # a reply that ends while the window closes
    writer.put(SaveJob(conv.id, conv.to_json()))
    assert json.loads(store.path_of(conv.id).read_text())["messages"][1]["content"] == "late"
    assert [r.error for r in results] == [None]
