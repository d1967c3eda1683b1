"""The fields of a hardware description (``hotline calibrate`` JSON, or the shipped GPU table), checked one by
one: a missing, NaN, infinite, negative or zero figure is named with its section and field, instead of
becoming a prediction of nonsense or a KeyError deep inside the cost model; and where descriptions come from:
a JSON file, or the shipped table of known GPUs (``gpus.json``, :func:`known_gpus`)."""

from __future__ import annotations

import json
import math
import os
from importlib import resources
from pathlib import Path

RATE = "rate"
"""A throughput (GB/s, GFLOP/s): a finite number > 0 (a step is priced by dividing by it)."""
COST = "cost"
"""A time per unit (ns, us) or a share of one: a finite number >= 0."""
COUNT = "count"
"""A number of threads, cores or copies: a finite number >= 0."""

# section -> field -> (kind, required, per-threads: {"1": one thread, "n": all calibrated threads})
FIELDS: dict[str, dict[str, tuple[str, bool, bool]]] = {
    "host": {
        "dispatch_ns_per_lookup": (COST, True, True),
        "dispatch_ns_per_cold_lookup": (COST, False, True),
        "gather_gbps": (RATE, True, True),
        "scatter_gbps": (RATE, True, True),
        "memcpy_gbps": (RATE, False, False),
        "handover_us": (COST, False, False),
        "threads": (COUNT, False, False),
        "cores": (COUNT, False, False),
        "overlap_penalty": (COST, False, False),
    },
    "device": {
        "dense_gflops": (RATE, True, False),
        "mem_gbps": (RATE, True, False),
        "pass_overhead_us": (COST, True, False),
        "update_ns_per_lookup_float": (COST, True, False),
        "update_ns_per_row_float": (COST, True, False),
        "interaction_gflops": (RATE, False, False),
        "gather_gbps": (RATE, False, False),
        "assemble_gbps": (RATE, False, False),
        "update_ns_per_lookup": (COST, False, False),
        "update_overhead_us": (COST, False, False),
        "dense_update_overhead_us": (COST, False, False),
        "dense_update_us_per_tensor": (COST, False, False),
        "reference_pass_us": (RATE, False, False),
    },
    "link": {
        "h2d_gbps": (RATE, True, False),
        "d2h_gbps": (RATE, True, False),
        "latency_us": (COST, False, False),
        "copies_per_step": (COUNT, False, False),
    },
}


def _number_problem(value, kind: str) -> str | None:
    """What is wrong with ``value`` as a figure of ``kind``, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"is {value!r}, not a number"
    if not math.isfinite(value):
        return f"is {value}, not a finite number"
    if kind == RATE and value <= 0:
        return f"is {value}: a rate must be > 0"
    if value < 0:
        return f"is {value}: it must be >= 0"
    return None


def check_hardware(hw, source: str) -> dict:
    """Returns ``hw`` if every field the cost model reads is present and in range, else raises ValueError
    naming ``source`` (a file, or a GPU's name), the section and the field."""
    if not isinstance(hw, dict):
        raise ValueError(f"hardware description {source} holds a JSON {type(hw).__name__}, not an object")
    for section, fields in FIELDS.items():
        part = hw.get(section)
        if not isinstance(part, dict):
            what = "has no" if part is None else "has a malformed"
            raise ValueError(f"hardware description {source} {what} {section!r} section")
        shared = section == "link" and part.get("shared_memory") is True
        if section == "link" and not isinstance(part.get("shared_memory", False), bool):
            raise ValueError(f"hardware description {source}: link.shared_memory must be true or false")
        for name, (kind, required, per_threads) in fields.items():
            where = f"hardware description {source}: {section}.{name}"
            if name not in part:
                if required and not shared:
                    raise ValueError(f"{where} is missing")
                continue
            value = part[name]
            if per_threads and isinstance(value, dict):
                for key in ("1", "n"):
                    if key not in value:
                        raise ValueError(f'{where} has no "{key}" figure (one thread, all threads)')
                    problem = _number_problem(value[key], kind)
                    if problem:
                        raise ValueError(f'{where}["{key}"] {problem}')
                continue
            problem = _number_problem(value, kind)
            if problem:
                raise ValueError(f"{where} {problem}")
    _check_passes(hw["device"].get("passes"), source)
    return hw


PASS_FIELDS = {"batch": RATE, "pooling_factor": RATE, "pass_us": RATE, "assemble_us": COST}
"""The figures of each timed dense pass in ``device.passes`` (:func:`hotline.costmodel.dense_timing.time_pass`)."""


def _check_passes(passes, source: str) -> None:
    """``device.passes``: absent, or an object of timed passes keyed by their shape, each with
    :data:`PASS_FIELDS` in range."""
    if passes is None:
        return
    where = f"hardware description {source}: device.passes"
    if not isinstance(passes, dict):
        raise ValueError(f"{where} is {type(passes).__name__}, not an object")
    for key, timed in passes.items():
        if not isinstance(timed, dict):
            raise ValueError(f"{where}[{key!r}] is {type(timed).__name__}, not an object")
        for name, kind in PASS_FIELDS.items():
            if name not in timed:
                raise ValueError(f"{where}[{key!r}].{name} is missing")
            problem = _number_problem(timed[name], kind)
            if problem:
                raise ValueError(f"{where}[{key!r}].{name} {problem}")


def known_gpus() -> dict:
    """The shipped table of GPUs (``hotline/costmodel/gpus.json``): device and link figures, with sources."""
    text = resources.files("hotline.costmodel").joinpath("gpus.json").read_text()
    return json.loads(text)["gpus"]


def load_hardware(spec: str | os.PathLike | dict, host: str | os.PathLike | dict | None = None) -> dict:
    """A hardware description: a dict, a JSON file (from ``hotline calibrate``), or the name of a known GPU
    (``H100``, ``H200``, ...), whose host side comes from ``host`` (a calibration JSON; default: the typical
    host figures shipped with the GPU table)."""
    from hotline._paths import file_problem

    source = str(spec)
    if isinstance(spec, dict):
        hw, source = dict(spec), "(given as a dict)"
    elif Path(spec).exists() or Path(spec).is_symlink() or str(spec).endswith(".json"):
        problem = file_problem(spec)
        if problem is not None:
            raise ValueError(f"hardware file {spec} {problem}")
        try:
            hw = json.loads(Path(spec).read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"hardware file {spec} is not valid JSON: {e}") from None
    else:
        gpus = known_gpus()
        name = str(spec)
        match = next((k for k in gpus if k.lower() == name.lower()), None)
        if match is None:
            raise ValueError(f"hardware {name!r}: neither a JSON file nor a known GPU ({', '.join(gpus)})")
        gpu = gpus[match]
        base = (
            load_hardware(host)
            if host is not None
            else json.loads(resources.files("hotline.costmodel").joinpath("gpus.json").read_text())[
                "typical_host"
            ]
        )
        hw = {**base, "name": f"{match} + {base.get('name', 'host')}", "device": gpu["device"],
              "link": gpu["link"], "sources": gpu.get("sources", [])}  # fmt: skip
    return check_hardware(hw, source)
