"""The kinds a run is made of, each named once (modes, optimizers, interactions, cold stores), and the
look-ahead facts every layer sizes its buffers by (:data:`DEFAULT_LOOKAHEAD`, :func:`staging_slots`).

String enums (:class:`enum.StrEnum`): a member equals its name as a string (``Mode.HOTLINE == "hotline"``),
so a flag's value, a config field and a checkpoint's record compare with them directly. A config keeps the
plain string (:attr:`value`): ``torch.load(weights_only=True)`` refuses enum classes in a checkpoint.
"""

from __future__ import annotations

from enum import StrEnum


class Mode(StrEnum):
    """Where the embedding rows live during training."""

    AUTO = "auto"
    """One of the others, chosen by the cost model for this run's data and hardware."""
    DEVICE = "device"
    """Every row on the compute device (the reference)."""
    HYBRID = "hybrid"
    """Every row in the cold store (host memory or disk), the working rows copied in each step."""
    HOTLINE = "hotline"
    """The popular rows on the device, the rest in the cold store, gathered ahead of compute."""


class Optimizer(StrEnum):
    """The sparse optimizer (FBGEMM's kernels of the same names); the dense layers get its dense twin."""

    SGD = "sgd"
    ROWWISE_ADAGRAD = "rowwise-adagrad"
    ADAGRAD = "adagrad"
    ADAM = "adam"


class Interaction(StrEnum):
    """DLRM's feature interaction."""

    DOT = "dot"
    CAT = "cat"
    DCN = "dcn"
    """DCN-v2's low-rank cross net (torchrec's DLRM_DCN)."""


class ColdStoreKind(StrEnum):
    """Where hybrid and hotline keep the cold rows."""

    MEMORY = "memory"
    DISK = "disk"


class MicroBatches(StrEnum):
    """How a hotline step passes over its batch."""

    AUTO = "auto"
    SPLIT = "split"
    FUSED = "fused"


class Replace(StrEnum):
    """When hotline re-chooses its hot rows besides every N steps."""

    OFF = "off"
    AUTO = "auto"


def names(kind: type[StrEnum]) -> tuple[str, ...]:
    """The values of ``kind`` as plain strings, in declaration order (for messages and argparse choices)."""
    return tuple(member.value for member in kind)


MODES = names(Mode)
OPTIMIZERS = names(Optimizer)
INTERACTIONS = names(Interaction)
COLD_STORES = names(ColdStoreKind)


DEFAULT_LOOKAHEAD = 2
"""Steps whose cold rows hotline gathers ahead of compute unless told otherwise (``--lookahead``)."""


def staging_slots(mode: str, lookahead: int) -> int:
    """Staging buffers of a tiered mode's ring: one for hybrid (one step at a time); K + 3 with look-ahead K,
    the ring :class:`hotline.pipeline.executor.Executor` needs (a slot is filled again only after the step
    that used it last is written back)."""
    return 1 if mode == Mode.HYBRID else lookahead + 3
