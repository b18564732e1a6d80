"""The layout of csrc/, as docs/design.md draws it.

* Every quoted #include is a path from csrc/ ("core/image/jpeg.h",
  "bind/fastload.h") naming a file that exists: one rule, in the extension,
  the fuzz targets and the C tests alike.
* The core cut by domain keeps decoding apart from I/O: csrc/core/image/
  includes nothing of csrc/core/source/ and makes no file-system call (the
  source layer reads, the image layer decodes).  That the core never
  includes the binding or Python.h is test_cpylint.py's rule.
* The bindings (csrc/bind/) call each other one way only: the graph of
  references between binding files (functions, types, method tables) has
  no cycle, and nothing calls into module.c, which registers everything
  (module state is reached through fastload.h's inline accessors).  Generic
  helpers live in errors.c and convert.c, which call no feature file.
* Test probes (functions only the tests call, "for tests" in their
  docstrings) sit in testing.c, none among module.c's production functions.
"""

import os
import pathlib
import re

import pytest

from graphs import find_cycle
from test_cpylint import blank_comments_and_literals, function_bodies

# Reads source files and runs no C: nothing for the sanitizer run
# (scripts/test.sh sets FASTLOAD_SANITIZER_RUN) to check.
pytestmark = pytest.mark.skipif(bool(os.environ.get("FASTLOAD_SANITIZER_RUN")),
                                reason="reads source files only: no C runs (sanitizer run)")


ROOT = pathlib.Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"
CORE, BIND = CSRC / "core", CSRC / "bind"
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
# A non-static definition of data at the start of a line: `PyType_Spec
# fl__X_spec = {`, `PyMethodDef fl__x_methods[] = {`.
DATA = re.compile(r"^(?!static\b)[A-Za-z_][\w \t*]*?\b(fl__\w+)\s*(?:\[\s*\])?\s*=", re.M)
SYMBOL = re.compile(r"\bfl__\w+\b")


def rel(path):
    return path.relative_to(ROOT).as_posix()


def quoted_includes(path):
    return INCLUDE.findall(path.read_text())


def test_includes_are_paths_from_csrc():
    files = sorted(CSRC.rglob("*.[ch]")) + sorted((ROOT / "fuzz").glob("*.c")) + sorted(
        (ROOT / "tests" / "c").glob("*.c"))
    assert len(files) > 90
    bad = [f"{rel(f)}: {name}" for f in files for name in quoted_includes(f)
           if not (CSRC / name).is_file()]
    assert bad == [], "a quoted #include must be a path from csrc/"


def test_the_core_is_cut_by_domain():
    domains = {p.name for p in CORE.iterdir() if p.is_dir()}
    assert domains == {"engine", "memory", "image", "source", "cuda", "observe"}
    # Only the status codes, which every domain uses, sit at the top.
    assert sorted(p.name for p in CORE.glob("*.[ch]")) == ["status.c", "status.h"]


def test_image_decoding_owns_no_file_io():
    image = sorted((CORE / "image").glob("*.[ch]"))
    assert image
    for f in image:
        assert not [i for i in quoted_includes(f) if i.startswith("core/source/")], rel(f)
        code = blank_comments_and_literals(f.read_text())
        calls = re.findall(r"\b(open|openat|fopen|pread|read|stat|fstat|mmap)\s*\(", code)
        assert calls == [], f"{rel(f)} reads files: {calls}"


def bind_references(sources):
    """{file: {other file: sorted symbols}} for `sources` ({file name: text}
    of binding files): the fl__ functions and data each file uses that
    another file defines."""
    code = {name: blank_comments_and_literals(text) for name, text in sources.items()}
    defined = {}
    for name, text in code.items():
        symbols = [s for s, (static, _) in function_bodies(text).items()
                   if not static and s.startswith("fl__")] + DATA.findall(text)
        for symbol in symbols:
            assert symbol not in defined, f"{symbol} defined in {defined[symbol]} and {name}"
            defined[symbol] = name
    refs = {name: {} for name in code}
    for name, text in code.items():
        for symbol in sorted(set(SYMBOL.findall(text))):
            owner = defined.get(symbol)
            if owner and owner != name:
                refs[name].setdefault(owner, []).append(symbol)
    return refs


def describe(refs, cycle):
    return " -> ".join(
        f"{a} ({', '.join(refs[a][b])})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def binding_sources():
    return {f.relative_to(BIND).as_posix(): f.read_text() for f in sorted(BIND.rglob("*.c"))}


def test_bindings_call_each_other_one_way():
    refs = bind_references(binding_sources())
    assert sum(len(v) for v in refs.values()) > 20  # the parse finds the references
    assert "testing.c" in refs["module.c"] and "errors.c" in refs["engine/native_batch.c"]
    callers = sorted(name for name, used in refs.items() if "module.c" in used)
    assert callers == [], "module.c registers; no file calls into it"
    for helper in ("errors.c", "convert.c"):
        assert set(refs[helper]) <= {"errors.c"}, f"{helper} calls {sorted(refs[helper])}"
    cycle = find_cycle(refs)
    assert cycle is None, "binding files call each other: " + describe(refs, cycle)


def test_includes_between_binding_files():
    for f in sorted(BIND.rglob("*.c")):
        own = [i for i in quoted_includes(f) if not i.startswith("core/")]
        assert own == ["bind/fastload.h"], rel(f)


def test_the_cycle_check_finds_a_circle():
    a = "#include \"x.h\"\nint fl__a(void)\n{\n    return fl__b() + 1;\n}\n"
    b = "int fl__b(void)\n{\n    return 2;\n}\nint fl__c(void)\n{\n    return fl__a();\n}\n"
    spec = "PyType_Spec fl__T_spec = {0};\n"
    use = "void f(void)\n{\n    g(&fl__T_spec);\n}\n"
    refs = bind_references({"a.c": a, "b.c": b, "t.c": spec, "m.c": use})
    assert refs == {"a.c": {"b.c": ["fl__b"]}, "b.c": {"a.c": ["fl__a"]}, "t.c": {},
                    "m.c": {"t.c": ["fl__T_spec"]}}
    assert describe(refs, find_cycle(refs)) == "a.c (fl__b) -> b.c (fl__a) -> a.c"
    refs["b.c"] = {}
    assert find_cycle(refs) is None
    # A static function of the same name elsewhere is another function.
    hidden = b.replace("int fl__b", "static int fl__b")
    assert bind_references({"a.c": a, "b.c": hidden})["a.c"] == {}


def method_docs(path):
    """{name: docstring} of the PyMethodDef entries in `path`."""
    text = path.read_text()
    entries = re.findall(
        r'\{"(\w+)",\s*\(PyCFunction\)[^,]*,\s*METH_\w+,\s*((?:"(?:\\.|[^"\\])*"\s*)+)\}', text)
    return {name: "".join(re.findall(r'"((?:\\.|[^"\\])*)"', doc)).replace("\\n", " ")
            for name, doc in entries}


def test_test_probes_live_apart():
    production = method_docs(BIND / "module.c")
    probes = method_docs(BIND / "testing.c")
    assert len(production) > 20 and len(probes) >= 8
    for_tests = re.compile(r"\bfor tests\b", re.I)
    assert sorted(n for n, doc in production.items() if for_tests.search(doc)) == []
    assert sorted(n for n, doc in probes.items() if not for_tests.search(doc)) == []
    assert not set(production) & set(probes)
