"""fastload.default_collate / default_convert parity with torch, collate errors,
and the output="numpy" rule of fastload.DataLoader."""

import collections
import collections.abc

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import torch.utils.data as tud  # noqa: E402
from torch.utils.data._utils.collate import default_collate_err_msg_format  # noqa: E402

import fastload  # noqa: E402
from fl_helpers import (  # noqa: E402
    fastload_only,
    MAP_DATASET_NAMES,
    Point,
    Triple,
    assert_same,
    capture_exception,
    contains_tensor,
    run_loader,
    to_numpy_tree,
)



class MyDict(dict):
    pass


class MyList(list):
    pass


class FrozenMapping(collections.abc.Mapping):
    """A read-only Mapping whose constructor does not accept a dict (torch falls back to dict)."""

    def __init__(self, *, pairs):
        self._d = dict(pairs)

    def __getitem__(self, k):
        return self._d[k]

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)


class Unsupported:
    pass


def _arr(i, shape=(2, 3), dtype=np.float32):
    return (np.arange(int(np.prod(shape))) + i).astype(dtype).reshape(shape)


def _memmap_rows(tmp_path_factory):
    path = tmp_path_factory.mktemp("collate") / "rows.bin"
    mm = np.memmap(path, dtype=np.int16, mode="w+", shape=(4, 3))
    mm[:] = np.arange(12, dtype=np.int16).reshape(4, 3)
    return [mm[i] for i in range(4)]


def _np_scalar_batch(dt):
    t = np.dtype(dt).type
    return [t(1), t(0), t(3)] if dt != "b1" else [t(True), t(False)]


COLLATE_BATCHES = {
    "ndarray_f32": [_arr(i) for i in range(3)],
    "ndarray_noncontiguous": [_arr(i, (3, 4)).T for i in range(2)],
    "ndarray_0d": [np.array(1.5), np.array(-2.0)],
    "ndarray_empty": [np.zeros((0, 2), np.float32), np.zeros((0, 2), np.float32)],
    "ndarray_mixed_dtypes_promote": [np.zeros(2, np.float32), np.ones(2, np.float64)],
    "ndarray_int_float_promote": [np.arange(2, dtype=np.int32), np.ones(2, np.float32)],
    "ndarray_uint_dtypes": [np.array([1, 2], np.uint16), np.array([3, 4], np.uint16)],
    "ndarray_uint32": [np.array([1, 2**32 - 1], np.uint32)] * 2,
    "ndarray_uint64": [np.array([2**64 - 1], np.uint64)],
    "ndarray_bool": [np.array([True, False]), np.array([False, False])],
    "ndarray_complex": [np.array([1 + 2j], np.complex64), np.array([3j], np.complex64)],
    "ndarray_f16": [np.array([0.5, 1.5], np.float16)] * 3,
    "single_element_batch": [_arr(7)],
    "tuple_array_int": [(_arr(i), i) for i in range(4)],
    "tuple_of_tuples": [((i, float(i)), (str(i),)) for i in range(3)],
    "dict_nested": [{"a": _arr(i), "b": {"c": i, "d": [i, i + 1]}, "e": "s"} for i in range(3)],
    "ordered_dict": [collections.OrderedDict([("z", i), ("a", float(i))]) for i in range(3)],
    "default_dict": [collections.defaultdict(list, {"k": np.int8(i)}) for i in range(3)],
    "dict_subclass": [MyDict(x=i, y=np.float32(i)) for i in range(2)],
    "frozen_mapping": [FrozenMapping(pairs=[("p", i), ("q", np.arange(2) * i)]) for i in range(2)],
    "namedtuple": [Point(x=_arr(i, (2,)), y=i) for i in range(3)],
    "namedtuple_nested": [Triple(a=Point(i, 2.5), b=[i], c={"k": i}) for i in range(2)],
    "nested_list": [[[i, i + 1], [np.float64(i)], "x"] for i in range(3)],
    "list_subclass": [MyList([i, 2 * i]) for i in range(3)],
    "torch_f32": [torch.arange(4, dtype=torch.float32) + i for i in range(3)],
    "torch_i64_bool": [(torch.tensor(i), torch.tensor(i % 2 == 0)) for i in range(3)],
    "torch_bf16_f16": [(torch.ones(2, dtype=torch.bfloat16) * i, torch.ones(1, dtype=torch.float16))
                       for i in range(2)],
    "torch_mixed_dtypes_promote": [torch.zeros(2, dtype=torch.int32), torch.ones(2, dtype=torch.float64)],
    "torch_0d": [torch.tensor(1.0), torch.tensor(2.0)],
    **{f"np_scalar_{dt}": _np_scalar_batch(dt) for dt in
       ["f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "b1", "c8", "c16"]},
    "np_scalars_mixed": [np.float32(1), np.float64(2.5)],
    "np_scalars_int_float": [np.int32(1), np.float64(2.5)],
    "np_scalar_big_endian": [np.dtype(">i8").type(7), np.dtype(">i8").type(-1)],
    "py_float": [0.5, 1.25, -3.0],
    "py_int": [1, -2, 3],
    "py_bool": [True, False, True],
    "py_int_then_float": [1, 2.5],  # torch: float32 (torch.tensor default dtype)
    "py_float_then_int": [2.5, 1],  # torch: float64
    "py_bool_then_int": [True, 2],
    "py_int_then_bool": [2, True],
    "py_int64_limits": [2**63 - 1, -(2**63)],
    "str": ["a", "bc", ""],
    "bytes": [b"a", b"\x00\xff"],
    "np_str_bytes": [(np.str_("u"), np.bytes_(b"b")), (np.str_("v"), np.bytes_(b"c"))],
}


@pytest.mark.parametrize("name", list(COLLATE_BATCHES))
def test_default_collate_parity(name):
    batch = COLLATE_BATCHES[name]
    expected = tud.default_collate(batch)
    actual = fastload.default_collate(batch)
    assert_same(actual, expected)


def test_default_collate_memmap_rows(tmp_path_factory):
    rows = _memmap_rows(tmp_path_factory)
    assert_same(fastload.default_collate(rows), tud.default_collate(rows))
    assert_same(fastload.default_collate([(r, "m") for r in rows]),
                tud.default_collate([(r, "m") for r in rows]))


def test_collate_surprises_are_matched():
    """Spot-check the less obvious torch rules explicitly (not only via parity)."""
    c = fastload.default_collate
    assert c([1, 2.5]).dtype == torch.float32
    assert c([2.5, 1]).dtype == torch.float64
    assert c([1.0, 2.0]).dtype == torch.float64
    assert c([True, False]).dtype == torch.bool
    assert c([2, True]).dtype == torch.int64
    assert isinstance(c([(1, 2), (3, 4)]), list)  # tuples become lists
    assert c(["a", "b"]) == ["a", "b"]
    assert c([np.zeros(1, np.float32), np.ones(1, np.float64)]).dtype == torch.float64


# --------------------------------------------------------------------------
# default_convert
# --------------------------------------------------------------------------

CONVERT_SAMPLES = {
    "ndarray": _arr(3),
    "ndarray_0d": np.array(4, dtype=np.int16),
    "np_scalar_f32": np.float32(1.5),
    "np_scalar_bool": np.bool_(True),
    "np_scalar_f64": np.float64(2.0),
    "tuple": (_arr(1), 5, "s"),
    "namedtuple": Point(x=_arr(2, (2,)), y=np.int64(3)),
    "dict": {"a": _arr(0), "b": [np.float32(1), 2], "c": "txt"},
    "ordered_dict": collections.OrderedDict([("b", np.arange(3)), ("a", 1)]),
    "nested_list": [[np.arange(2)], (np.arange(1),), 3.5],
    "list_subclass": MyList([np.arange(2), 1]),
    "py_int": 7,
    "py_float": 0.25,
    "str": "hello",
    "bytes": b"raw",
    "none": None,
    "np_str_scalar": np.str_("u"),
    "str_ndarray": np.array(["a", "b"]),
    "object_ndarray": np.array([1, "a"], dtype=object),
    "torch_tensor": torch.arange(3),
}


@pytest.mark.parametrize("name", list(CONVERT_SAMPLES))
def test_default_convert_parity(name):
    sample = CONVERT_SAMPLES[name]
    assert_same(fastload.default_convert(sample), tud.default_convert(sample))


def test_default_convert_returns_tensors_unchanged():
    t = torch.arange(3)
    assert tud.default_convert(t) is t
    assert fastload.default_convert(t) is t


def test_default_convert_leaves_unsupported_objects_alone():
    obj = Unsupported()
    assert tud.default_convert(obj) is obj
    assert fastload.default_convert(obj) is obj


# --------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------

def _assert_same_error(fn_name, batch, *, exact_message=False, message_contains=None):
    t_exc = capture_exception(lambda: getattr(tud, fn_name)(batch))
    f_exc = capture_exception(lambda: getattr(fastload, fn_name)(batch))
    assert t_exc is not None, "premise: torch raises for this input"
    assert f_exc is not None, f"fastload.{fn_name} did not raise; torch raised {type(t_exc).__name__}: {t_exc}"
    assert isinstance(f_exc, type(t_exc)), (
        f"fastload raised {type(f_exc).__name__}: {f_exc}; torch raised {type(t_exc).__name__}: {t_exc}")
    if exact_message:
        assert str(f_exc) == str(t_exc)
    if message_contains:
        assert message_contains in str(t_exc)
        assert message_contains in str(f_exc)
    return f_exc, t_exc


def test_ragged_lists():
    _assert_same_error("default_collate", [[1, 2], [3]],
                       message_contains="each element in list of batch should be of equal size")
    f_exc, _ = _assert_same_error("default_collate", [[np.zeros(2), 1], [np.zeros(2)]])
    assert isinstance(f_exc, RuntimeError)


@pytest.mark.parametrize("batch", [
    pytest.param([np.zeros(2), np.zeros(3)], id="ndarray"),
    pytest.param([np.zeros((2, 2)), np.zeros((2, 3))], id="ndarray2d"),
    pytest.param([torch.zeros(2), torch.zeros(3)], id="tensor"),
    pytest.param([{"a": np.zeros(1)}, {"a": np.zeros(2)}], id="in_dict"),
])
def test_shape_mismatch(batch):
    f_exc, _ = _assert_same_error("default_collate", batch)
    assert isinstance(f_exc, RuntimeError)


@pytest.mark.parametrize("batch", [
    pytest.param([None, None], id="none"),
    pytest.param([object()], id="object"),
    pytest.param([Unsupported(), Unsupported()], id="custom_class"),
    pytest.param([{1}, {2}], id="set"),
    pytest.param([np.datetime64("2020-01-01")], id="datetime64"),
    pytest.param([(1, None), (2, None)], id="none_in_tuple"),
])
def test_unsupported_objects(batch):
    f_exc, t_exc = _assert_same_error("default_collate", batch, exact_message=True)
    assert isinstance(f_exc, TypeError)
    assert str(f_exc).startswith(default_collate_err_msg_format.split("{}")[0])


@pytest.mark.parametrize("batch", [
    pytest.param([np.array([1, "a"], dtype=object)] * 2, id="object_array"),
    pytest.param([np.array(["a", "b"])] * 2, id="str_array"),
    pytest.param([np.array([b"a", b"b"])] * 2, id="bytes_array"),
    pytest.param([np.array(1, dtype=object)], id="object_0d"),
])
def test_object_and_string_arrays(batch):
    f_exc, t_exc = _assert_same_error("default_collate", batch, exact_message=True)
    assert isinstance(f_exc, TypeError)


@pytest.mark.parametrize("batch", [
    pytest.param([2**63, 1], id="above_int64"),
    pytest.param([1, -(2**63) - 1], id="below_int64"),
    pytest.param([{"k": 2**70}, {"k": 0}], id="nested"),
])
def test_int_overflow(batch):
    _assert_same_error("default_collate", batch)


@pytest.mark.parametrize("batch", [
    pytest.param([np.arange(3, dtype=">f4")] * 2, id="f4"),
    pytest.param([np.arange(3, dtype=">i8")], id="i8"),
])
def test_big_endian_arrays(batch):
    _assert_same_error("default_collate", batch)
    _assert_same_error("default_convert", batch[0])


def test_other_errors_match_torch_types():
    _assert_same_error("default_collate", [])  # empty batch
    _assert_same_error("default_collate", [np.uint64(1), np.uint64(2)])  # torch: TypeError
    _assert_same_error("default_collate", [np.zeros(2, dtype=[("a", "i4")])])  # structured array


# --------------------------------------------------------------------------
# output="numpy" / output="torch"
# --------------------------------------------------------------------------

# Unbatched torch tensors are excluded: default_convert returns them untouched, so
# "numpy where torch would give a tensor" is not a meaningful rule for them.
NUMPY_OUTPUT_CASES = [
    pytest.param(ds_name, batch_size, id=f"{ds_name}-bs{batch_size}")
    for ds_name in MAP_DATASET_NAMES for batch_size in (3, None)
    if not (batch_size is None and ds_name in ("torch_tensors", "tensor_dataset"))
]


def _assert_numpy_output(actual, expected_torch):
    assert not contains_tensor(actual), "output='numpy' returned a torch.Tensor"
    assert_same(actual, to_numpy_tree(expected_torch))


@fastload_only
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("ds_name,batch_size", NUMPY_OUTPUT_CASES)
def test_output_numpy_matches_torch_structure(make_map_dataset, ds_name, batch_size, num_workers):
    ds = make_map_dataset(ds_name)
    expected = run_loader(tud.DataLoader, ds, dict(batch_size=batch_size))
    actual = run_loader(fastload.DataLoader, ds,
                        dict(batch_size=batch_size, num_workers=num_workers, output="numpy"))
    assert len(actual[0]) == len(expected[0]) > 0
    for a, e in zip(actual[0], expected[0]):
        _assert_numpy_output(a, e)


@fastload_only
def test_output_numpy_with_shuffle_matches_torch_order(make_map_dataset):
    ds = make_map_dataset("tuple")
    expected = run_loader(tud.DataLoader, ds, dict(batch_size=4, shuffle=True,
                                                    generator=torch.Generator().manual_seed(3)))
    actual = run_loader(fastload.DataLoader, ds, dict(batch_size=4, shuffle=True, output="numpy",
                                                      generator=torch.Generator().manual_seed(3)))
    for a, e in zip(actual[0], expected[0]):
        _assert_numpy_output(a, e)


@fastload_only
def test_output_numpy_leaves_custom_collate_output_alone(make_map_dataset):
    ds = make_map_dataset("tuple")
    marker = object()
    out = list(fastload.DataLoader(ds, batch_size=2, output="numpy", collate_fn=lambda b: (marker, b)))
    assert out[0][0] is marker
    assert isinstance(out[0][1], list) and isinstance(out[0][1][0], tuple)


@fastload_only
@pytest.mark.parametrize("num_workers", [0, 2])
def test_output_torch_and_auto_give_tensors(make_map_dataset, num_workers):
    ds = make_map_dataset("dict")
    expected = run_loader(tud.DataLoader, ds, dict(batch_size=4))
    for output in ("torch", "auto"):
        actual = run_loader(fastload.DataLoader, ds, dict(batch_size=4, num_workers=num_workers,
                                                          output=output))
        assert len(actual[0]) == len(expected[0])
        for a, e in zip(actual[0], expected[0]):
            assert_same(a, e)


@fastload_only
def test_output_numpy_iterable(make_map_dataset):
    from fl_helpers import iterable_dataset

    ds = iterable_dataset(shard="uneven", n=10)
    expected = run_loader(tud.DataLoader, ds, dict(batch_size=3, num_workers=2))
    actual = run_loader(fastload.DataLoader, ds, dict(batch_size=3, num_workers=2, output="numpy"))
    assert len(actual[0]) == len(expected[0])
    for a, e in zip(actual[0], expected[0]):
        _assert_numpy_output(a, e)
