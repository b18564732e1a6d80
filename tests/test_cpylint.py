"""Source rules the compiler cannot check.

* The core (csrc/core/) never includes Python.h: it must run without the GIL.
* No Python C-API call sits between Py_BEGIN_ALLOW_THREADS and
  Py_END_ALLOW_THREADS.
"""

import pathlib
import re

CSRC = pathlib.Path(__file__).resolve().parent.parent / "csrc"
PY_CALL = re.compile(r"\b(Py[A-Z_]\w*|_Py\w+)\s*\(")
BLOCK = re.compile(r"Py_BEGIN_ALLOW_THREADS(.*?)Py_END_ALLOW_THREADS", re.S)


def c_sources():
    files = sorted(CSRC.rglob("*.c")) + sorted(CSRC.rglob("*.h"))
    assert files, "no C sources found"
    return files


def test_core_never_includes_python():
    core = [f for f in c_sources() if f.parent.name == "core"]
    assert core
    for f in core:
        text = f.read_text()
        assert not re.search(r"#\s*include\s*[<\"](Python|numpy/)", text), f
        assert not PY_CALL.search(re.sub(r"/\*.*?\*/", "", text, flags=re.S)), f


def test_no_python_api_without_the_gil():
    blocks = 0
    for f in c_sources():
        for block in BLOCK.findall(f.read_text()):
            blocks += 1
            code = re.sub(r"/\*.*?\*/", "", block, flags=re.S)
            assert not PY_CALL.search(code), f"{f.name}: Python C-API call in a GIL-free block:\n{block}"
    assert blocks >= 3  # the rule guards something
