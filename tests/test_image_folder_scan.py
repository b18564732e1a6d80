"""ImageFolder's tree listed in C and kept in an index file
(fastload/datasets/folder_index.py, csrc/core/source/dir_scan.c).

torchvision's own ImageFolder and DatasetFolder are the oracle: same
classes, samples, order and errors on trees with nested folders, links to
folders and files, broken links, non-image files, upper-case extensions,
empty classes, non-ASCII and non-UTF-8 names.  Then the index: reused
while nothing changed (seen in ``scan_info``, which counts the folders
read), ignored when anything in any folder changed or the file is damaged,
written to $FASTLOAD_INDEX_DIR when the root takes no file, and safe when
processes race to write it.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import fastload
from fastload.datasets import folder_index


def touch(path, data=b""):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def make_tree(base):
    """A tree with most of what make_dataset has rules for; returns its root."""
    root = os.path.join(base, "root")
    outside = os.path.join(base, "outside")
    for rel in ["cat/a.jpg", "cat/B.JPG", "cat/c.Png", "cat/notes.txt", "cat/.hidden.jpg",
                "cat/sub/d.jpeg", "cat/sub/deeper/e.webp", "cat/sub/deeper/f.TIFF",
                "cat/sub-x/g.jpg", "cat/sub.x/h.jpg", "cat/sub0/i.bmp",
                "dog/z.jpg", "dog/y.ppm", "dog/x.pgm", "dog/w.tif", "dog/readme.md",
                "caf\u00e9/\u65e5\u672c.jpg", "caf\u00e9/e\u0301.jpg", "caf\u00e9/\u00e9.jpg",
                "caf\u00e9/\U0001f600.jpg", "caf\u00e9/x.\u212a",
                "empty/only.txt", "empty/sub/also.txt",
                "emu/a.jpg"]:
        touch(os.path.join(root, rel))
    touch(os.fsencode(os.path.join(root, "caf\u00e9")) + b"/\xff.jpg")  # not UTF-8
    touch(os.fsencode(os.path.join(root, "caf\u00e9")) + b"/\xc3.JPG")
    touch(os.path.join(root, "loose.jpg"))  # a file in the root: no class
    for rel in ["linked/l1.jpg", "linked/inner/l2.png", "files/target.txt", "files/t.jpg"]:
        touch(os.path.join(outside, rel))
    os.symlink(os.path.join(outside, "linked"), os.path.join(root, "dog", "link"))
    os.symlink(os.path.join(outside, "files", "target.txt"), os.path.join(root, "dog", "v.jpg"))
    os.symlink(os.path.join(outside, "files", "t.jpg"), os.path.join(root, "dog", "u.txt"))
    os.symlink(os.path.join(outside, "missing"), os.path.join(root, "dog", "dead.jpg"))
    os.symlink(os.path.join(outside, "missing"), os.path.join(root, "dog", "dead_dir"))
    os.symlink(os.path.join(outside, "linked"), os.path.join(root, "linkclass"))
    os.mkfifo(os.path.join(root, "emu", "pipe.jpg"))
    return root


@pytest.fixture
def tree(tmp_path):
    return make_tree(str(tmp_path))


@pytest.fixture(autouse=True)
def index_dir(tmp_path, monkeypatch):
    """Index files that miss the root go under the test's folder."""
    cache = tmp_path / "index-cache"
    monkeypatch.setenv("FASTLOAD_INDEX_DIR", str(cache))
    return cache


@pytest.fixture
def clean_reuse(monkeypatch):
    """No folder counts as changed too close to the scan: a reuse reads
    none again (the racy rule has its own tests)."""
    monkeypatch.setattr(folder_index, "RACY_SECONDS", 0.0)


def same_as(ours, theirs):
    assert ours.classes == theirs.classes
    assert ours.class_to_idx == theirs.class_to_idx
    assert list(ours.samples) == [(p, t) for p, t in theirs.samples]
    assert ours.targets == theirs.targets


def error_of(make):
    """(type, message) of what make() raises; None when it raises nothing."""
    try:
        make()
    except Exception as e:  # noqa: BLE001 - compared with torchvision's
        return type(e), str(e)
    return None


# --------------------------------------------------------- torchvision's rules


@pytest.mark.parametrize("index", [False, True])
def test_same_as_torchvision(torchvision, tree, index):
    ImageFolder = torchvision.datasets.ImageFolder
    theirs = ImageFolder(tree, allow_empty=True)
    for _ in range(2):  # the scan, then (index=True) the index
        same_as(fastload.ImageFolder(tree, allow_empty=True, index=index), theirs)
    assert len(theirs) > 20


def test_empty_class_errors_as_torchvision(torchvision, tree):
    expected = error_of(lambda: torchvision.datasets.ImageFolder(tree))
    assert expected[0] is FileNotFoundError
    assert error_of(lambda: fastload.ImageFolder(tree)) == expected
    assert error_of(lambda: fastload.ImageFolder(os.path.join(tree, "cat", "a.jpg")))[0] is \
        NotADirectoryError
    os.makedirs(os.path.join(tree, "..", "classless"))
    classless = os.path.join(tree, "..", "classless")
    assert error_of(lambda: fastload.ImageFolder(classless)) == \
        error_of(lambda: torchvision.datasets.ImageFolder(classless))


def test_is_valid_file_as_torchvision(torchvision, tree):
    calls = []

    def valid(path):
        calls.append(path)
        return "sub" in path or path.endswith(".md") or "\udcff" in path

    theirs = torchvision.datasets.ImageFolder(tree, is_valid_file=valid, allow_empty=True)
    their_calls, calls[:] = list(calls), []
    for index in (True, True, False):
        same_as(fastload.ImageFolder(tree, is_valid_file=valid, allow_empty=True, index=index),
                theirs)
        assert calls == their_calls  # every path, in torchvision's order
        calls[:] = []
    assert error_of(lambda: fastload.ImageFolder(tree, is_valid_file=valid)) == \
        error_of(lambda: torchvision.datasets.ImageFolder(tree, is_valid_file=valid))


@pytest.mark.parametrize("extensions", [(".jpg",), ".jpg", (".JPG",), (".k",), ("",),
                                        ("x/g.jpg", ".txt"), (".\u00e9.jpg", ".jpg")])
def test_extensions_as_torchvision(torchvision, tree, extensions):
    """DatasetFolder takes extensions as given: matched against the lowered
    path, never lowered themselves; a str is one extension."""
    theirs = torchvision.datasets.DatasetFolder(tree, loader=str, extensions=extensions,
                                                allow_empty=True)
    ours = fastload.ImageFolder(tree, extensions=extensions, allow_empty=True)
    same_as(ours, theirs)
    if extensions == (".k",):  # KELVIN SIGN lowers to "k": Python decides that one
        assert [os.path.basename(p) for p, _ in ours.samples] == ["x.\u212a"]
    assert error_of(lambda: fastload.ImageFolder(tree, extensions=extensions)) == \
        error_of(lambda: torchvision.datasets.DatasetFolder(tree, loader=str,
                                                            extensions=extensions))


def test_non_str_extension_raises_as_torchvision(torchvision, tree):
    assert error_of(lambda: fastload.ImageFolder(tree, extensions=(b".jpg",))) == \
        error_of(lambda: torchvision.datasets.DatasetFolder(tree, loader=str,
                                                            extensions=(b".jpg",)))


def test_unicode_order_is_pythons(torchvision, tree):
    """str order, not bytes order: a non-UTF-8 byte (U+DCFF) sorts before
    an astral character (4 bytes from 0xF0)."""
    ours = [os.path.basename(p) for p, _ in fastload.ImageFolder(tree, allow_empty=True).samples
            if "caf\u00e9" in p]
    assert ours == sorted(ours)
    assert ours.index("\udcff.jpg") < ours.index("\U0001f600.jpg")


def test_root_spellings_as_torchvision(torchvision, tree, monkeypatch):
    parent, name = os.path.split(tree)
    monkeypatch.chdir(parent)
    monkeypatch.setenv("HOME", parent)
    for spelling in (name, name + "/", "./" + name, "~/" + name, tree + "/"):
        same_as(fastload.ImageFolder(spelling, allow_empty=True),
                torchvision.datasets.ImageFolder(spelling, allow_empty=True))


def test_overridden_find_classes(torchvision, tree):
    def find_classes(self, directory):
        return ["dog", "cat", "nothere"], {"dog": 0, "cat": 5, "nothere": 2}

    class Ours(fastload.ImageFolder):
        pass

    class Theirs(torchvision.datasets.ImageFolder):
        pass

    Ours.find_classes = Theirs.find_classes = find_classes
    for _ in range(2):
        same_as(Ours(tree, allow_empty=True), Theirs(tree, allow_empty=True))
    assert error_of(lambda: Ours(tree)) == error_of(lambda: Theirs(tree))


def test_loops_and_doubles_walked_once(tmp_path):
    """fastload's one rule beyond torchvision's (tests/test_image_files.py):
    a folder reached again in a class is walked once, at its first path."""
    root = tmp_path / "root"
    touch(str(tmp_path / "shared" / "s.jpg"))
    touch(str(root / "a" / "x.jpg"))
    touch(str(root / "a" / "b" / "y.jpg"))
    os.symlink(tmp_path / "shared", root / "a" / "l2")
    os.symlink(tmp_path / "shared", root / "a" / "l1")
    os.symlink(root / "a" / "b", root / "a" / "c")   # b, reached again at c
    os.symlink(root / "a", root / "a" / "b" / "up")  # a loop
    os.symlink(tmp_path / "shared", root / "b")      # another class: its own walk
    for index in (True, True, False):
        ds = fastload.ImageFolder(root, index=index)
        assert [os.path.relpath(p, root) for p, _ in ds.samples] == \
            ["a/x.jpg", "a/b/y.jpg", "a/l1/s.jpg", "b/s.jpg"]


# --------------------------------------------------------------- the index


def test_second_construction_reads_the_index(tree, clean_reuse):
    first = fastload.ImageFolder(tree, allow_empty=True)
    assert first.scan_info["reused"] is False
    # 13 folders, each read once: linkclass and dog/link are one folder
    assert first.scan_info["dirs_read"] == 13
    assert first.scan_info["index"] == os.path.join(tree, folder_index.NAME)
    second = fastload.ImageFolder(tree, allow_empty=True)
    assert second.scan_info == {"index": first.scan_info["index"], "reused": True,
                                "dirs_read": 0, "dirs_checked": 15}  # every path to a folder
    assert list(second.samples) == list(first.samples)
    # another filter: the same index
    third = fastload.ImageFolder(tree, is_valid_file=lambda p: True)
    assert third.scan_info["reused"] and len(third) > len(first)


def test_index_false_reads_and_writes_none(tree):
    ds = fastload.ImageFolder(tree, allow_empty=True, index=False)
    assert ds.scan_info == {"index": None, "reused": False, "dirs_read": 13, "dirs_checked": 0}
    assert not os.path.exists(os.path.join(tree, folder_index.NAME))


def mutations(tree):
    cat = os.path.join(tree, "cat")
    deeper = os.path.join(cat, "sub", "deeper")
    linked = os.path.join(tree, "..", "outside", "linked", "inner")
    return {
        "add nested": lambda: touch(os.path.join(deeper, "new.jpg")),
        "add in a linked folder": lambda: touch(os.path.join(linked, "new.jpg")),
        "remove nested": lambda: os.unlink(os.path.join(deeper, "e.webp")),
        "rename nested": lambda: os.rename(os.path.join(deeper, "e.webp"),
                                           os.path.join(deeper, "e2.webp")),
        "rename a folder": lambda: os.rename(os.path.join(cat, "sub"), os.path.join(cat, "sub2")),
        "add a folder": lambda: touch(os.path.join(cat, "sub", "n", "m.jpg")),
        "replace a folder": lambda: (os.rename(deeper, deeper + ".old"),
                                     touch(os.path.join(deeper, "e.webp"))),
        "retarget a link": lambda: (os.unlink(os.path.join(tree, "dog", "link")),
                                    os.symlink(os.path.join(tree, "cat", "sub"),
                                               os.path.join(tree, "dog", "link"))),
        "add a class": lambda: touch(os.path.join(tree, "new", "x.jpg")),
    }


@pytest.mark.parametrize("change", list(mutations("/")))
@pytest.mark.parametrize("racy", ["default", "no racy margin"])
def test_a_change_anywhere_invalidates(torchvision, tree, change, racy, monkeypatch):
    """Right after the scan, in the same clock tick: the racy folders are
    read again; with no margin (racy), the times alone must tell (a folder
    changed seconds later, as here, has other times)."""
    if racy != "default":
        monkeypatch.setattr(folder_index, "RACY_SECONDS", 0.0)
        # move the tree's times away from the scan's: later changes show
        for dirpath, dirnames, _ in os.walk(os.path.dirname(tree)):
            os.utime(dirpath, (1e9, 1e9))
    fastload.ImageFolder(tree, allow_empty=True)
    mutations(tree)[change]()
    ours = fastload.ImageFolder(tree, allow_empty=True)
    assert ours.scan_info["reused"] is False
    same_as(ours, torchvision.datasets.ImageFolder(tree, allow_empty=True))
    again = fastload.ImageFolder(tree, allow_empty=True)
    assert again.scan_info["reused"] is True
    assert list(again.samples) == list(ours.samples)


def test_racy_folders_are_read_again_then_cleared(tree, monkeypatch):
    first = fastload.ImageFolder(tree, allow_empty=True)  # the tree is new: every folder racy
    assert first.scan_info["reused"] is False
    second = fastload.ImageFolder(tree, allow_empty=True)
    assert second.scan_info["reused"] is True
    assert second.scan_info["dirs_read"] == 15  # each check read again, the same
    # once the folders are older than the margin, the file is rewritten without the flags
    monkeypatch.setattr(folder_index, "RACY_SECONDS", 0.0)
    fastload.ImageFolder(tree, allow_empty=True)
    fourth = fastload.ImageFolder(tree, allow_empty=True)
    assert fourth.scan_info["reused"] is True and fourth.scan_info["dirs_read"] == 0


@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped", "empty", "other magic"])
def test_damaged_index_is_ignored_and_rewritten(tree, clean_reuse, damage):
    first = fastload.ImageFolder(tree, allow_empty=True)
    path = first.scan_info["index"]
    with open(path, "rb") as f:
        data = bytearray(f.read())
    if damage == "garbage":
        data = bytearray(os.urandom(len(data)))
    elif damage == "truncated":
        data = data[:len(data) // 2]
    elif damage == "flipped":
        data[-20] ^= 0x40
    elif damage == "empty":
        data = bytearray()
    else:
        data[:8] = b"FLDIRIX0"
    with open(path, "wb") as f:
        f.write(data)
    ds = fastload.ImageFolder(tree, allow_empty=True)
    assert ds.scan_info["reused"] is False and ds.scan_info["index"] == path
    assert list(ds.samples) == list(first.samples)
    assert fastload.ImageFolder(tree, allow_empty=True).scan_info["reused"] is True


def test_index_of_other_classes_is_not_used(tree, clean_reuse):
    fastload.ImageFolder(tree, allow_empty=True)

    class Fewer(fastload.ImageFolder):
        @staticmethod
        def find_classes(directory):
            return ["dog"], {"dog": 0}

    ds = Fewer(tree)
    assert ds.scan_info["reused"] is False and ds.classes == ["dog"]


def test_unwritable_root_uses_the_cache_dir(tree, index_dir, clean_reuse, monkeypatch):
    os.chmod(tree, 0o555)
    try:
        if os.access(tree, os.W_OK):  # root ignores modes: refuse the root's temp files
            import tempfile
            mkstemp = tempfile.mkstemp

            def refusing(*args, dir=None, **kwargs):
                if os.path.samefile(dir, tree):
                    raise PermissionError(13, "Permission denied", dir)
                return mkstemp(*args, dir=dir, **kwargs)

            monkeypatch.setattr(tempfile, "mkstemp", refusing)
        first = fastload.ImageFolder(tree, allow_empty=True)
        path = first.scan_info["index"]
        assert os.path.dirname(path) == str(index_dir)
        assert not os.path.exists(os.path.join(tree, folder_index.NAME))
        second = fastload.ImageFolder(tree, allow_empty=True)
        assert second.scan_info["reused"] is True and second.scan_info["index"] == path
        assert list(second.samples) == list(first.samples)
    finally:
        os.chmod(tree, 0o755)


RACE = r"""
import hashlib, sys
import fastload
for _ in range(int(sys.argv[2])):
    ds = fastload.ImageFolder(sys.argv[1], allow_empty=True)
    print(hashlib.sha1(repr(list(ds.samples)).encode("utf-8", "surrogateescape")).hexdigest(),
          ds.scan_info["reused"], flush=True)
"""


def test_processes_racing_to_write_the_index(torchvision, tree, clean_reuse):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    procs = [subprocess.Popen([sys.executable, "-c", RACE, tree, "6"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err for _, err in outputs]
    digests = {line.split()[0] for out, _ in outputs for line in out.splitlines()}
    assert len(digests) == 1
    import hashlib
    theirs = torchvision.datasets.ImageFolder(tree, allow_empty=True)
    assert digests == {hashlib.sha1(repr(list(theirs.samples)).encode(
        "utf-8", "surrogateescape")).hexdigest()}
    assert fastload.ImageFolder(tree, allow_empty=True).scan_info["reused"] is True
    leftovers = [n for n in os.listdir(tree) if n.endswith(".tmp")]
    assert leftovers == []


def test_scan_arrays_are_compact(tree):
    """The walk is a few bytes objects and int64 arrays, not a Python object
    a file."""
    walk, _ = folder_index.walk(tree, [b"cat", b"dog"], index=False)
    assert {type(v) for k, v in walk.items() if k not in ("complete", "dirs_read")} == \
        {bytes, np.ndarray}
    assert walk["checks"].shape[1] == 7
