"""Criteo preprocessing: Numba kernels against the plain-Python dlrm twin, splits, options, bad input."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotline.cli import main
from hotline.datasets.criteo import (
    CriteoFormatError,
    _UniqueCounter,
    order_inputs,
    preprocess,
    split_sizes,
)
from hotline.datasets.criteo_raw import write_raw_tsv
from hotline.datasets.format import Dataset
from hotline.kernels.criteo_parse import REASONS, build_id_table, format_lines, map_categories, parse_lines
from tests import naive


def _rows(n: int, seed: int = 0, card: int = 50):
    """Random rows with missing values, negatives and a few large values."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    dense = rng.integers(-1, 200, (n, 13))
    dense[rng.random((n, 13)) < 0.05] = 2**40
    cats = rng.integers(0, card, (n, 26)) * 0x01000193  # spread over 32 bits like hashes
    cats[rng.random((n, 26)) < 0.1] = -1
    return labels, dense, cats


def _write(path, n, seed=0, card=50):
    write_raw_tsv(path, *_rows(n, seed, card))
    return path


def _assert_dataset_equals_reference(out, ref, sizes):
    ds = Dataset(out)
    assert ds.table_sizes == sizes
    for split in ("train", "val", "test"):
        dense, sparse, labels = ref[split]
        got = ds.split(split)
        assert len(got) == len(labels), split
        np.testing.assert_array_equal(np.asarray(got.sparse), sparse)
        np.testing.assert_array_equal(np.asarray(got.labels), labels)
        np.testing.assert_allclose(np.asarray(got.dense), dense, rtol=1e-6)
    return ds


def _check_lines_against_twin(data: bytes, max_ind_range=None, segment_bytes=1 << 20):
    parsed = parse_lines(np.frombuffer(data, np.uint8), max_ind_range, segment_bytes=segment_bytes)
    lines = naive.criteo_split_lines(data)
    assert parsed.reason.shape[0] == len(lines)
    for i, line in enumerate(lines):
        reason, column, label, dense, cats = naive.criteo_parse_line(line, max_ind_range)
        assert REASONS[parsed.reason[i]] == reason, (line, parsed.column[i])
        if reason != "ok":
            assert parsed.column[i] == column, line
            continue
        assert parsed.labels[i] == label
        np.testing.assert_allclose(parsed.dense[i], dense, rtol=1e-6)
        assert parsed.cats[i].tolist() == cats


# ------------------------------------------------------------------------------------------- kernels


@pytest.mark.parametrize("max_ind_range", [None, 1000, 7])
def test_parse_lines_matches_twin(max_ind_range):
    labels, dense, cats = _rows(200, seed=1)
    data = format_lines(labels, dense, cats).tobytes()
    handmade = (
        b"1\t-5\t\t+3\t0\t00012\t\t\t\t\t\t\t\t9223372036854775807\tFFFFFFFFFFFFFFFF\tAbC"
        b"\t\t\t\t\t\t\t\t\t\t\t\t\t"
        b"\t\t\t\t\t\t\t\t\t\t\t\t\t0\r\n"
    )
    _check_lines_against_twin(data + handmade, max_ind_range)


def test_parse_values_follow_dlrm():
    line = b"1\t-5\t\t3" + b"\t" * 10 + b"\tff" + b"\t" * 25 + b"\n"
    p = parse_lines(np.frombuffer(line, np.uint8))
    assert p.reason.tolist() == [0]
    assert p.labels[0] == 1.0
    np.testing.assert_allclose(p.dense[0, :3], [0.0, 0.0, np.log(4.0)], rtol=1e-6)
    assert p.cats[0, 0] == 255 and p.cats[0, 1:].tolist() == [0] * 25


def test_parse_empty_buffer():
    p = parse_lines(np.empty(0, np.uint8))
    assert p.reason.shape == (0,) and p.cats.shape == (0, 26)


_TOKENS = [
    b"\t",
    b"0",
    b"1",
    b"7",
    b"-",
    b"+",
    b"a",
    b"F",
    b"g",
    b" ",
    b"\r",
    b"\0",
    b"99999999999999999999",
    b"fffffffffffffffff",
    b"\n",
]


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.sampled_from(_TOKENS), max_size=120),
    st.sampled_from([None, 5]),
    st.sampled_from([1, 13, 4096]),
)
def test_parse_random_tokens_matches_twin(tokens, max_ind_range, segment_bytes):
    labels, dense, cats = _rows(2, seed=3)
    good = format_lines(labels, dense, cats).tobytes()
    _check_lines_against_twin(good + b"".join(tokens) + good, max_ind_range, segment_bytes)


@pytest.mark.parametrize("segment_bytes", [1, 2, 50, 333, 1 << 20])
@pytest.mark.parametrize("tail", [b"", b"\n", b"\n\n", b"1\t2"])
def test_parse_segments_own_each_line_once(segment_bytes, tail):
    """Lines that start in one segment and end in another, empty lines, no final newline."""
    labels, dense, cats = _rows(30, seed=6)
    data = b"\n" + format_lines(labels, dense, cats).tobytes() + tail
    _check_lines_against_twin(data, None, segment_bytes)
    parsed = parse_lines(np.frombuffer(data, np.uint8), segment_bytes=segment_bytes)
    assert (parsed.starts[1:] == parsed.ends[:-1] + 1).all()


def test_format_lines_matches_twin_and_round_trips():
    labels, dense, cats = _rows(100, seed=2)
    cats[0, 0] = 2**40 + 5  # beyond 32 bits: more than 8 digits
    data = format_lines(labels, dense, cats).tobytes()
    expected = b"".join(naive.criteo_format_line(*r) for r in zip(labels, dense, cats))
    assert data == expected
    p = parse_lines(np.frombuffer(data, np.uint8))
    assert (p.reason == 0).all()
    assert (p.cats == np.where(cats < 0, 0, cats)).all()
    assert format_lines(labels[:0], dense[:0], cats[:0]).shape == (0,)


def test_map_categories_matches_dict():
    rng = np.random.default_rng(4)
    values = [np.unique(rng.integers(0, 2**63, size)).astype(np.uint64) for size in (1, 3, 100, 0)]
    offsets = np.concatenate([[0], np.cumsum([len(v) for v in values])])
    remap = rng.integers(0, 1000, offsets[-1]).astype(np.int32)
    table = build_id_table(np.concatenate(values), offsets, remap)
    raw = np.stack([rng.choice(v, 50) if len(v) else np.zeros(50, np.uint64) for v in values[:3]], axis=1)
    out = np.empty(raw.shape, np.int32)
    sub = build_id_table(np.concatenate(values[:3]), offsets[:4], remap[: offsets[3]])
    map_categories(raw, sub, out)
    for t in range(3):
        lookup = {int(v): int(r) for v, r in zip(values[t], remap[offsets[t] : offsets[t + 1]])}
        assert out[:, t].tolist() == [lookup[int(v)] for v in raw[:, t]]
    with pytest.raises(ValueError, match="not in the id table"):
        map_categories(raw + np.uint64(1), sub, out)
    assert table.num_tables == 4


def test_write_raw_tsv_gzip_append_and_checks(tmp_path):
    labels, dense, cats = _rows(40, seed=7)
    path = tmp_path / "day_0.gz"
    write_raw_tsv(path, labels[:25], dense[:25], cats[:25].astype(np.int64))
    write_raw_tsv(path, labels[25:], dense[25:], cats[25:], append=True)
    assert gzip.decompress(path.read_bytes()) == format_lines(labels, dense, cats).tobytes()
    with pytest.raises(ValueError, match="expected labels"):
        write_raw_tsv(tmp_path / "x.txt", labels, dense[:, :12], cats)
    with pytest.raises(ValueError, match="labels must be 0 or 1"):
        write_raw_tsv(tmp_path / "x.txt", labels + 1, dense, cats)
    with pytest.raises(TypeError, match="integer"):
        write_raw_tsv(tmp_path / "x.txt", labels, dense.astype(np.float32), cats)


def test_unique_counter_merges_like_np_unique():
    rng = np.random.default_rng(8)
    chunks = [rng.integers(0, 50_000, rng.integers(0, 30_000)).astype(np.uint64) for _ in range(12)]
    counter = _UniqueCounter()
    for c in chunks:
        counter.add(*np.unique(c, return_counts=True))
    values, counts = counter.result()
    expected = np.unique(np.concatenate(chunks), return_counts=True)
    np.testing.assert_array_equal(values, expected[0])
    np.testing.assert_array_equal(counts, expected[1])


# ------------------------------------------------------------------------------------------- preprocess


@pytest.mark.parametrize("max_ind_range,min_count", [(None, 1), (None, 3), (7, 1), (40, 2)])
def test_kaggle_matches_reference(tmp_path, max_ind_range, min_count):
    raw = _write(tmp_path / "train.txt", 103)
    out = preprocess(
        raw,
        tmp_path / "ds",
        max_ind_range=max_ind_range,
        min_count=min_count,
        progress=False,
        block_bytes=997,
    )  # tiny blocks: lines cross block boundaries
    ref, sizes = naive.criteo_reference([raw.read_bytes()], "kaggle", max_ind_range, min_count)
    ds = _assert_dataset_equals_reference(out, ref, sizes)
    # 103 rows = 7 days of 15 / 14 rows; the last day of 14 is split 7 test + 7 val.
    assert (len(ds.train), len(ds.test), len(ds.val)) == (89, 7, 7)
    src = ds.meta["source"]
    assert src["kind"] == "criteo" and src["layout"] == "kaggle"
    assert src["options"] == {"max_ind_range": max_ind_range, "min_count": min_count}
    assert src["rare_id"] == (0 if min_count > 1 else None)
    assert (
        src["files"][0]["bytes"] == raw.stat().st_size and len(src["files"][0]["sha256_size_head_tail"]) == 64
    )
    assert ds.meta["bad_lines"] == {}


def test_terabyte_layout_orders_days_and_splits_last(tmp_path):
    days = {
        d: _write(tmp_path / f"day_{d}.gz" if d == 10 else tmp_path / f"day_{d}", 11 + d, seed=d)
        for d in (0, 2, 10)
    }
    glob_order = [days[0], days[10], days[2]]  # what a shell glob gives
    assert order_inputs(glob_order) == [days[0], days[2], days[10]]
    out = preprocess(glob_order, tmp_path / "ds", progress=False)
    contents = [
        gzip.decompress(days[d].read_bytes()) if d == 10 else days[d].read_bytes() for d in (0, 2, 10)
    ]
    ref, sizes = naive.criteo_reference(contents, "terabyte")
    ds = _assert_dataset_equals_reference(out, ref, sizes)
    assert (len(ds.train), len(ds.test), len(ds.val)) == (24, 11, 10)
    assert ds.meta["source"]["layout"] == "terabyte"
    assert [f["name"] for f in ds.meta["source"]["files"]] == ["day_0", "day_2", "day_10.gz"]


def test_layout_flag_overrides_detection(tmp_path):
    a, b = _write(tmp_path / "a.txt", 30, seed=1), _write(tmp_path / "b.txt", 40, seed=2)
    out = preprocess([a, b], tmp_path / "ds", layout="kaggle", progress=False)
    ref, sizes = naive.criteo_reference([a.read_bytes(), b.read_bytes()], "kaggle")
    _assert_dataset_equals_reference(out, ref, sizes)
    with pytest.raises(ValueError, match="with one file .* there would be 0 training rows"):
        preprocess(
            [a], tmp_path / "ds1", layout="terabyte", progress=False
        )  # (it used to write 0 train rows)
    assert not (tmp_path / "ds1").exists()


def test_split_sizes_follow_dlrm_array_split():
    for n in (1, 6, 7, 8, 13, 100, 1001):
        days = np.array_split(np.arange(n), np.cumsum([n // 7 + (d < n % 7) for d in range(7)])[:-1])
        test, val = np.array_split(days[-1], 2)
        assert split_sizes("kaggle", [n]) == {"train": n - len(days[-1]), "test": len(test), "val": len(val)}
    assert split_sizes("terabyte", [5, 6, 9]) == {"train": 11, "test": 5, "val": 4}


def test_gzip_crlf_and_no_final_newline(tmp_path):
    labels, dense, cats = _rows(20, seed=5)
    text = format_lines(labels, dense, cats).tobytes()
    crlf = text.replace(b"\n", b"\r\n").rstrip(b"\n")  # CRLF and no newline after the last line
    plain = tmp_path / "plain.txt"
    plain.write_bytes(text)
    gz = tmp_path / "crlf.txt.gz"
    gz.write_bytes(gzip.compress(crlf))
    a = Dataset(preprocess(plain, tmp_path / "a", progress=False))
    b = Dataset(preprocess(gz, tmp_path / "b", progress=False, block_bytes=100))
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(np.asarray(a.split(split).sparse), np.asarray(b.split(split).sparse))
        np.testing.assert_array_equal(np.asarray(a.split(split).dense), np.asarray(b.split(split).dense))


# ------------------------------------------------------------------------------------------- bad input

_GOOD = naive.criteo_format_line(1, [3] * 13, [0xABC] * 26).rstrip(b"\n")


def _with_field(column: int, value: bytes) -> bytes:
    fields = _GOOD.split(b"\t")
    fields[column - 1] = value
    return b"\t".join(fields)


# (bad line, reason, field name, column)
_BAD_LINES = [
    (b"\t".join(_GOOD.split(b"\t")[:30]), "too_few_fields", "C17", 31),
    (_GOOD + b"\t1", "too_many_fields", "extra field 41", 41),
    (_with_field(1, b"2"), "bad_label", "label", 1),
    (_with_field(1, b""), "bad_label", "label", 1),
    (_with_field(4, b"1.5"), "bad_integer", "I3", 4),
    (_with_field(5, b"99999999999999999999"), "integer_overflow", "I4", 5),
    (_with_field(31, b"xyz"), "bad_hex", "C17", 31),
    (_with_field(40, b"1" * 17), "hex_overflow", "C26", 40),
    (_with_field(20, b"ab\0cd"), "nul_byte", "C6", 20),
]


@pytest.mark.parametrize(
    "bad,reason,field,column", _BAD_LINES, ids=[r[1] + str(i) for i, r in enumerate(_BAD_LINES)]
)
def test_bad_line_error_names_file_line_field(tmp_path, bad, reason, field, column):
    raw = tmp_path / "train.txt"
    raw.write_bytes((_GOOD + b"\n") * 4 + bad + b"\n" + (_GOOD + b"\n") * 3)
    twin_reason, twin_column = naive.criteo_parse_line(bad)[:2]
    assert twin_reason == reason and (twin_column == column or reason == "too_few_fields")
    with pytest.raises(CriteoFormatError) as info:
        preprocess(raw, tmp_path / "ds", progress=False, block_bytes=64)
    e = info.value
    assert (e.path, e.line, e.field, e.column) == (str(raw), 5, field, column)
    assert str(raw) in str(e) and "line 5" in str(e) and field in str(e) and "expected" in str(e)
    assert not (tmp_path / "ds").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["train.txt"]  # no temporary directory left either


def test_bad_lines_skipped_and_counted(tmp_path):
    bad = b"".join(b + b"\n" for b, *_ in _BAD_LINES)
    raw = tmp_path / "train.txt"
    raw.write_bytes((_GOOD + b"\n") * 5 + bad + b"x" * ((1 << 20) + 5) + b"\n" + (_GOOD + b"\n") * 2)
    out = preprocess(raw, tmp_path / "ds", on_bad_line="skip", progress=False, block_bytes=4096)
    ds = Dataset(out)
    assert len(ds.train) + len(ds.val) + len(ds.test) == 7
    expected = {}
    for _, reason, *_ in _BAD_LINES:
        expected[reason] = expected.get(reason, 0) + 1
    expected["line_too_long"] = 1
    assert ds.meta["bad_lines"] == expected
    assert ds.meta["bad_lines_per_file"] == {"train.txt": expected}
    meta = json.loads((out / "meta.json").read_text())
    assert meta["on_bad_line"] == "skip"


@settings(max_examples=20, deadline=None)
@given(
    st.lists(
        st.sampled_from([b"good", b"crlf", b"empty"] + [b[0] for b in _BAD_LINES]), min_size=1, max_size=40
    ),
    st.sampled_from([16, 100, 1000]),
)
def test_skip_mode_matches_twin_across_blocks(tmp_path_factory, kinds, block_bytes):
    lines = {b"good": _GOOD, b"crlf": _GOOD.replace(b"\t3\t", b"\t7\t", 1) + b"\r", b"empty": b""}
    data = b"".join(lines.get(k, k) + b"\n" for k in kinds)
    raw = tmp_path_factory.mktemp("skip") / "train.txt"
    raw.write_bytes(data)
    twin = [naive.criteo_parse_line(line)[0] for line in naive.criteo_split_lines(data)]
    expected = {r: twin.count(r) for r in set(twin) - {"ok"}}
    if "ok" not in twin:
        with pytest.raises(CriteoFormatError, match="no rows"):
            preprocess(raw, raw.parent / "ds", on_bad_line="skip", progress=False, block_bytes=block_bytes)
        return
    out = preprocess(raw, raw.parent / "ds", on_bad_line="skip", progress=False, block_bytes=block_bytes)
    ref, sizes = naive.criteo_reference([data], "kaggle", skip_bad=True)
    ds = _assert_dataset_equals_reference(out, ref, sizes)
    assert ds.meta["bad_lines"] == expected


def test_line_too_long_error(tmp_path):
    raw = tmp_path / "train.txt"
    raw.write_bytes((_GOOD + b"\n") * 2 + b"1" * ((1 << 20) + 10))
    with pytest.raises(CriteoFormatError, match="line 3") as info:
        preprocess(raw, tmp_path / "ds", progress=False, block_bytes=1 << 16)
    assert info.value.line == 3


def test_truncated_gzip_names_file(tmp_path):
    data = gzip.compress(b"".join(_GOOD + b"\n" for _ in range(500)))
    raw = tmp_path / "day_0.gz"
    raw.write_bytes(data[: len(data) // 2])
    with pytest.raises(CriteoFormatError, match="truncated or corrupt gzip") as info:
        preprocess(raw, tmp_path / "ds", progress=False, on_bad_line="skip")
    assert info.value.path == str(raw)
    assert not (tmp_path / "ds").exists()


def test_empty_input_is_an_error(tmp_path):
    empty = tmp_path / "train.txt"
    empty.write_bytes(b"")
    with pytest.raises(CriteoFormatError, match="no rows: the input has no lines"):
        preprocess(empty, tmp_path / "ds", progress=False)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"garbage\n\n")
    with pytest.raises(CriteoFormatError, match="all 2 lines were bad"):
        preprocess(bad, tmp_path / "ds", progress=False, on_bad_line="skip")
    assert not (tmp_path / "ds").exists()


def test_failed_rewrite_keeps_existing_dataset(tmp_path):
    good = _write(tmp_path / "train.txt", 30)
    out = preprocess(good, tmp_path / "ds", progress=False)
    before = (out / "meta.json").read_text()
    bad = tmp_path / "bad.txt"
    bad.write_bytes(good.read_bytes() + b"oops\n")
    with pytest.raises(CriteoFormatError, match="line 31"):
        preprocess(bad, out, progress=False, overwrite=True)
    assert (out / "meta.json").read_text() == before
    assert len(Dataset(out).train) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "ds", "train.txt"]


@settings(max_examples=30, deadline=None)
@given(st.binary(max_size=300), st.booleans())
def test_random_bytes_raise_only_criteo_format_error(tmp_path_factory, data, skip):
    d = tmp_path_factory.mktemp("rand")
    raw = d / "train.txt"
    raw.write_bytes(data)
    try:
        preprocess(raw, d / "ds", progress=False, on_bad_line="skip" if skip else "error", block_bytes=64)
    except CriteoFormatError:
        assert not (d / "ds").exists()


# ------------------------------------------------------------------------------------------- CLI


def test_cli(tmp_path, capsys):
    raw = _write(tmp_path / "train.txt", 50)
    assert (
        main(["data", "criteo", str(raw), "--out", str(tmp_path / "ds"), "--no-progress", "--min-count", "2"])
        == 0
    )
    printed = capsys.readouterr().out
    assert "train 43" in printed and "rows/s" in printed and "bad lines skipped: none" in printed
    assert Dataset(tmp_path / "ds").meta["source"]["options"]["min_count"] == 2
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"1\t2\n")
    assert main(["data", "criteo", str(bad), "--out", str(tmp_path / "ds2"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert (
        "bad.txt, line 1, field I2 (column 3)" in err and "expected 40 tab-separated fields, found 2" in err
    )
    assert not (tmp_path / "ds2").exists()
