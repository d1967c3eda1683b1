"""The fused optimizer of Hotline's torchrec collection: a ``torchrec.optim.KeyedOptimizer`` over its tables.

torchrec's ``FusedEmbeddingBagCollection`` names its optimizer by a type and kwargs (``torch.optim.SGD``,
``torchrec.optim.RowWiseAdagrad``, fbgemm's ``EmbOptimType``) and exposes the update as a KeyedOptimizer whose
state is keyed ``<table>.weight`` -> ``<table>.weight.momentum_1`` (row-wise Adagrad's one float per row).
:func:`sparse_optimizer` maps those names onto Hotline's :class:`~hotline.tiers.sparse_optim.SparseOptimizer`
(refusing what it cannot do, by name), and :class:`HotlineFusedOptimizer` is that KeyedOptimizer: ``step()``
applies the pending sparse update, ``state_dict()`` / ``load_state_dict()`` save and restore the accumulators
in torchrec's convention, and ``param_groups[0]["lr"]`` is read at every step (schedulers work).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torchrec.optim.keyed import KeyedOptimizer

from hotline.tiers.sparse_optim import SparseOptimizer

_SGD_NAMES = {"sgd", "exact_sgd", "emboptimtype.exact_sgd"}
_ADAGRAD_NAMES = {"rowwise-adagrad", "rowwise_adagrad", "rowwiseadagrad", "exact_rowwise_adagrad",
                  "emboptimtype.exact_rowwise_adagrad"}  # fmt: skip
_IGNORED_ZERO = ("momentum", "weight_decay", "lr_decay", "initial_accumulator_value", "dampening")


def _kind(optimizer_type: Any) -> str:
    """``sgd`` or ``rowwise-adagrad`` for an optimizer type given as torchrec / torch / fbgemm / Hotline name it."""
    from torchrec.optim import RowWiseAdagrad

    if optimizer_type is torch.optim.SGD:
        return "sgd"
    if optimizer_type is RowWiseAdagrad:
        return "rowwise-adagrad"
    name = (
        getattr(optimizer_type, "name", None)
        or getattr(optimizer_type, "__name__", None)
        or str(optimizer_type)
    )
    key = str(name).lower()
    if key in _SGD_NAMES:
        return "sgd"
    if key in _ADAGRAD_NAMES:
        return "rowwise-adagrad"
    raise ValueError(
        f"optimizer_type {optimizer_type!r} is not supported by Hotline's collection: use torch.optim.SGD or "
        "torchrec.optim.RowWiseAdagrad (or fbgemm's EmbOptimType.EXACT_SGD / EXACT_ROWWISE_ADAGRAD)"
    )


def sparse_optimizer(
    optimizer_type: Any, optimizer_kwargs: Mapping[str, Any] | None = None
) -> SparseOptimizer:
    """Hotline's sparse rule for a torchrec-style ``(optimizer_type, optimizer_kwargs)``; a clear error for
    anything it cannot apply exactly (momentum, weight decay, an unknown type or keyword)."""
    kwargs = dict(optimizer_kwargs or {})
    kind = _kind(optimizer_type)
    lr = kwargs.pop("lr", kwargs.pop("learning_rate", 0.01))
    default_eps = 1e-10 if kind == "rowwise-adagrad" else 1e-8  # torchrec.optim.RowWiseAdagrad's default
    eps = kwargs.pop("eps", default_eps)
    for name in _IGNORED_ZERO:
        if kwargs.pop(name, 0) not in (0, 0.0, None):
            raise ValueError(f"optimizer_kwargs[{name!r}] is not supported by Hotline's collection (only 0)")
    if kwargs.pop("maximize", False):
        raise ValueError("optimizer_kwargs['maximize'] is not supported by Hotline's collection")
    if kwargs:
        raise ValueError(f"optimizer_kwargs {sorted(kwargs)} are not supported by Hotline's collection")
    return SparseOptimizer(kind, float(lr), float(eps))


class HotlineFusedOptimizer(KeyedOptimizer):
    """The KeyedOptimizer of a Hotline collection (see the module docstring).

    Args:
        params: ``<table>.weight`` -> the table's weight parameter.
        momentum: ``<table>.weight`` -> its row-wise accumulator view (empty for SGD).
        optimizer: the sparse rule (kind, lr, eps); ``lr`` follows ``param_groups[0]["lr"]``.
        step_fn: applies the pending update with a given SparseOptimizer (the collection's sparse step).
        before_save: brings the accumulators up to date in host memory (hot rows' state synced).
        after_load: pushes loaded accumulators to the hot rows.
    """

    def __init__(self, params: dict[str, torch.Tensor], momentum: dict[str, torch.Tensor], optimizer: SparseOptimizer,
                 step_fn: Callable[[SparseOptimizer], int], before_save: Callable[[], None],
                 after_load: Callable[[], None]):  # fmt: skip
        state = {
            p: ({f"{key}.momentum_1": momentum[key]} if key in momentum else {}) for key, p in params.items()
        }
        state = {p: s for p, s in state.items() if s}
        group = {"params": list(params.values()), "lr": optimizer.lr, "eps": optimizer.eps}
        super().__init__(params, state, [group])
        self.rule = optimizer
        self._step_fn, self._before_save, self._after_load = step_fn, before_save, after_load

    def current_rule(self) -> SparseOptimizer:
        """The sparse rule with the learning rate of ``param_groups[0]`` (a scheduler may have changed it)."""
        lr = float(next(iter(self.param_groups))["lr"])
        if lr != self.rule.lr:
            self.rule = SparseOptimizer(self.rule.kind, lr, self.rule.eps)
        return self.rule

    def step(self, closure: Any = None) -> None:  # noqa: ARG002 - torch's signature
        """Applies the pending sparse update of the collection's last training forward (nothing if none)."""
        self._step_fn(self.current_rule())

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to clear: the collection keeps no ``.grad`` on its tables."""

    def state_dict(self) -> dict[str, Any]:
        self._before_save()
        return super().state_dict()

    def post_load_state_dict(self) -> None:
        self._after_load()
