"""Source rules the compiler cannot check.

* The core (csrc/core/) never includes Python.h, NumPy or the binding
  (csrc/bind/): it must run without the GIL.  (tests/test_c_layout.py checks
  the rest of the tree's layout.)
* No Python C-API call runs without the GIL: none sits between
  Py_BEGIN_ALLOW_THREADS and Py_END_ALLOW_THREADS, nor in a function of the
  binding (csrc/bind/) that such a block calls, directly or through others.
  Calls through function pointers are not followed; functions of the core
  need no check (the first rule keeps Python out of them).
"""

import os
import pathlib
import re

import pytest

# Reads source files and runs no C: nothing for the sanitizer run
# (scripts/test.sh sets FASTLOAD_SANITIZER_RUN) to check.
pytestmark = pytest.mark.skipif(bool(os.environ.get("FASTLOAD_SANITIZER_RUN")),
                                reason="reads source files only: no C runs (sanitizer run)")

CSRC = pathlib.Path(__file__).resolve().parent.parent / "csrc"
CORE, BIND = CSRC / "core", CSRC / "bind"
PY_CALL = re.compile(r"\b(Py[A-Z_]\w*|_Py\w+)\s*\(")
# The C API that CPython documents as safe without the GIL.
GIL_FREE_API = re.compile(r"PyMem_Raw(Malloc|Calloc|Realloc|Free)$")
BLOCK = re.compile(r"Py_BEGIN_ALLOW_THREADS(.*?)Py_END_ALLOW_THREADS", re.S)
CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
NOT_CALLS = {"if", "for", "while", "switch", "return", "sizeof", "defined"}
# A definition at the start of a line: return type, name, parameters, "{".
FUNCTION = re.compile(r"^([A-Za-z_][\w \t*]*?)\b([A-Za-z_]\w*)\s*\([^;{}]*\)\s*\{", re.M)
COMMENT_OR_LITERAL = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'",
                                re.S)

# Violations found in code this file does not fix, as gil_violations names
# them but without the line number.  Each must still be found (remove it
# once fixed); nothing else may be.
KNOWN_OFFENDERS = set()


def c_sources():
    files = sorted(CSRC.rglob("*.c")) + sorted(CSRC.rglob("*.h"))
    assert files, "no C sources found"
    return files


def blank_comments_and_literals(text):
    """Comments and string/char literals become spaces (newlines kept, so
    offsets and line numbers stay), leaving only code to match."""
    return COMMENT_OR_LITERAL.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def function_bodies(code):
    """{name: (is_static, body)} for each function defined in `code`."""
    bodies = {}
    for m in FUNCTION.finditer(code):
        depth, end = 0, m.end() - 1
        for end in range(m.end() - 1, len(code)):
            depth += {"{": 1, "}": -1}.get(code[end], 0)
            if depth == 0:
                break
        bodies[m.group(2)] = ("static" in m.group(1).split(), code[m.end():end])
    return bodies


def gil_violations(sources):
    """Python C-API calls made without the GIL in `sources` ({file name:
    text} of binding files), each as "file:line: f() -> g() (other.c): Call":
    where the GIL-free block starts, the functions it goes through, the call.
    A header's functions (static inline) are visible from every file."""
    code = {name: blank_comments_and_literals(text) for name, text in sources.items()}
    defined = {name: function_bodies(text) for name, text in code.items()}

    def resolve(file, callee):
        if callee in defined[file]:
            return file, defined[file][callee][1]
        for other, bodies in defined.items():
            if callee in bodies and (not bodies[callee][0] or other.endswith(".h")):
                return other, bodies[callee][1]
        return None

    found = []

    def check(block, file, body, chain, seen):
        for call in PY_CALL.findall(body):
            if not GIL_FREE_API.match(call):
                found.append(f"{block}: {' -> '.join(chain) or 'in the block'}: {call}")
        for callee in dict.fromkeys(CALL.findall(body)):
            target = None if callee in NOT_CALLS else resolve(file, callee)
            if target and target not in seen:
                seen.add(target)
                step = f"{callee}()" if target[0] == file else f"{callee}() ({target[0]})"
                check(block, target[0], target[1], chain + [step], seen)

    for file, text in code.items():
        for block in BLOCK.finditer(text):
            line = text.count("\n", 0, block.start()) + 1
            check(f"{file}:{line}", file, block.group(1), [], set())
    return found


def test_core_never_includes_python():
    core = [f for f in c_sources() if CORE in f.parents]
    assert core
    for f in core:
        text = f.read_text()
        assert not re.search(r"#\s*include\s*[<\"](Python|numpy/|bind/)", text), f
        assert not PY_CALL.search(blank_comments_and_literals(text)), f


def test_no_python_api_without_the_gil():
    binding = {f.relative_to(BIND).as_posix(): f.read_text()
               for f in sorted(BIND.rglob("*.c")) + sorted(BIND.rglob("*.h"))}
    assert sum(len(BLOCK.findall(text)) for text in binding.values()) >= 3  # guards something
    found = gil_violations(binding)
    # Line numbers move with edits; known offenders are matched without them.
    found = {re.sub(r"^([^:]+):\d+", r"\1", v) for v in found}
    assert found - KNOWN_OFFENDERS == set(), "Python C-API calls without the GIL"
    assert KNOWN_OFFENDERS - found == set(), "fixed: remove from KNOWN_OFFENDERS"


SNIPPET = """
#include "fastload.h"

static int leaf(int x)
{
    %s
    return x + 1;
}

/* Calls itself: the walk must end. */
static int middle(int x)
{
    if (x > 10)
        return middle(x - 1);
    return leaf(x) * 2;
}

static int only_with_the_gil(void)
{
    PyErr_SetString(PyExc_ValueError, "called only with the GIL held");
    return -1;
}

static PyObject *entry(PyObject *self, PyObject *unused)
{
    int r;
    if (!self)
        return PyErr_Format(PyExc_TypeError, "no self"), NULL;
    Py_BEGIN_ALLOW_THREADS /* PyErr_Format(...) in a comment is not a call */
    r = middle((int)sizeof(Py_ssize_t));
    Py_END_ALLOW_THREADS
    if (r < 0)
        return only_with_the_gil(), NULL;
    return PyLong_FromLong(r);
}
"""


BLOCK_LINE = SNIPPET.count("\n", 0, SNIPPET.index("Py_BEGIN_ALLOW_THREADS")) + 1


def test_a_python_call_in_a_helper_of_a_gil_free_block_is_found():
    found = gil_violations({"x.c": SNIPPET % 'PyErr_SetString(PyExc_ValueError, "x");'})
    assert found == [f"x.c:{BLOCK_LINE}: middle() -> leaf(): PyErr_SetString"]
    in_block = SNIPPET.replace("r = middle(", "r = PyObject_Hash(self) + middle(") % ""
    assert gil_violations({"x.c": in_block}) == [f"x.c:{BLOCK_LINE}: in the block: PyObject_Hash"]


def test_gil_free_helpers_pass():
    clean = 'void *p = PyMem_RawMalloc(8); const char *s = "PyErr_Format(";\n    PyMem_RawFree(p);'
    assert gil_violations({"x.c": SNIPPET % clean}) == []


def test_a_helper_in_another_binding_file_is_followed():
    caller = SNIPPET % "x = shared_helper(x);"
    other = """
int shared_helper(int x)
{
    Py_DECREF(Py_None);
    return x;
}
"""
    found = gil_violations({"x.c": caller, "y.c": other})
    assert found == [f"x.c:{BLOCK_LINE}: middle() -> leaf() -> shared_helper() (y.c): Py_DECREF"]
    # A static function of another file is a different function.
    hidden = other.replace("int shared_helper", "static int shared_helper")
    assert gil_violations({"x.c": caller, "y.c": hidden}) == []
    # ...but a header's static inline function is the same one everywhere.
    found = gil_violations({"x.c": caller, "y.h": hidden.replace("static int", "static inline int")})
    assert found == [f"x.c:{BLOCK_LINE}: middle() -> leaf() -> shared_helper() (y.h): Py_DECREF"]
