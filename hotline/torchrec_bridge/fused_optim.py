"""The fused optimizer of Hotline's torchrec collection: a ``torchrec.optim.KeyedOptimizer`` over its tables.

torchrec's ``FusedEmbeddingBagCollection`` names its optimizer by a type and kwargs (``torch.optim.SGD``,
``torchrec.optim.RowWiseAdagrad``, ``torch.optim.Adagrad``, ``torch.optim.Adam``, fbgemm's ``EmbOptimType``)
and exposes the update as a KeyedOptimizer whose state is keyed ``<table>.weight`` ->
``<table>.weight.momentum_1`` (and ``momentum_2``): row-wise Adagrad's one float per row, Adagrad's [rows, D]
accumulators, Adam's [rows, D] first and second moments. :func:`sparse_optimizer` maps those names onto
Hotline's :class:`~hotline.tiers.sparse_optim.SparseOptimizer` (refusing what it cannot do, by name), and
:class:`HotlineFusedOptimizer` is that KeyedOptimizer: ``step()`` applies the pending sparse update,
``state_dict()`` / ``load_state_dict()`` save and restore the optimizer state in torchrec's convention,
``param_groups[0]["lr"]`` is read at every step (schedulers work), and ``set_optimizer_step`` sets Adam's
iteration as fbgemm's does.

Adam follows FBGEMM's ADAM: only the rows a batch looks up move, and the bias correction is the module's
iteration (every forward of the collection counts one, as fbgemm's ``iter``) unless
``use_rowwise_bias_correction=True`` asks for each row's own step count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch
from torchrec.optim.keyed import KeyedOptimizer

from hotline.tiers.sparse_optim import SparseOptimizer

_NAMES = {
    "sgd": {"sgd", "exact_sgd"},
    "rowwise-adagrad": {"rowwise-adagrad", "rowwise_adagrad", "rowwiseadagrad", "exact_rowwise_adagrad"},
    "adagrad": {"adagrad", "exact_adagrad"},
    "adam": {"adam"},
}
SUPPORTED = (
    "torch.optim.SGD, torchrec.optim.RowWiseAdagrad, torch.optim.Adagrad or torch.optim.Adam (or torchrec.optim's "
    "SGD / Adagrad / Adam, fbgemm's EmbOptimType.EXACT_SGD / EXACT_ROWWISE_ADAGRAD / EXACT_ADAGRAD / ADAM)"
)
_ZERO_ONLY = ("momentum", "weight_decay", "lr_decay", "initial_accumulator_value", "dampening")
_DEFAULT_EPS = {
    "rowwise-adagrad": 1e-10,
    "adagrad": 1e-8,
    "adam": 1e-8,
}  # torchrec's RowWiseAdagrad, fbgemm's TBE


def _kind(optimizer_type: Any) -> str:
    """Hotline's name of an optimizer type given as torchrec / torch / fbgemm / Hotline name it."""
    name = (
        getattr(optimizer_type, "name", None)
        or getattr(optimizer_type, "__name__", None)
        or str(optimizer_type)
    )
    key = str(name).lower().removeprefix("emboptimtype.")
    for kind, names in _NAMES.items():
        if key in names:
            return kind
    raise ValueError(
        f"optimizer_type {optimizer_type!r} is not supported by Hotline's collection: use {SUPPORTED}"
    )


def sparse_optimizer(
    optimizer_type: Any, optimizer_kwargs: Mapping[str, Any] | None = None, dim: int = 1
) -> SparseOptimizer:
    """Hotline's sparse rule for a torchrec-style ``(optimizer_type, optimizer_kwargs)``: ``lr``, ``eps``, and
    Adam's ``beta1``/``beta2`` (or torch's ``betas``), ``weight_decay`` and ``use_rowwise_bias_correction``; a
    clear error for anything it cannot apply exactly (momentum, another optimizer's weight decay, an unknown
    type or keyword). ``dim``: the width
    the per-element optimizers size their state by (the collection gives each dim group its own).

    Adam's rule comes with ``iteration`` 1 when it corrects the bias by the module's iteration (FBGEMM's
    default), which the collection then sets at every update, or 0 for each row's own step count."""
    kwargs = dict(optimizer_kwargs or {})
    kind = _kind(optimizer_type)
    lr = kwargs.pop("lr", kwargs.pop("learning_rate", 0.01))
    eps = kwargs.pop("eps", _DEFAULT_EPS.get(kind, 1e-8))
    betas = kwargs.pop("betas", None)
    beta1, beta2 = betas if betas is not None else (kwargs.pop("beta1", 0.9), kwargs.pop("beta2", 0.999))
    rowwise_bias = bool(kwargs.pop("use_rowwise_bias_correction", False))
    weight_decay = (
        float(kwargs.pop("weight_decay", 0.0) or 0.0) if kind == "adam" else 0.0
    )  # FBGEMM's ADAM has it
    for name in _ZERO_ONLY:
        if kwargs.pop(name, 0) not in (0, 0.0, None):
            raise ValueError(f"optimizer_kwargs[{name!r}] is not supported by Hotline's collection (only 0)")
    for name in ("maximize", "amsgrad"):
        if kwargs.pop(name, False):
            raise ValueError(f"optimizer_kwargs[{name!r}] is not supported by Hotline's collection")
    if kwargs:
        raise ValueError(f"optimizer_kwargs {sorted(kwargs)} are not supported by Hotline's collection")
    if kind != "adam" and (betas is not None or rowwise_bias):
        raise ValueError(f"optimizer_kwargs betas / use_rowwise_bias_correction are Adam's, not {kind}'s")
    iteration = 1 if kind == "adam" and not rowwise_bias else 0
    return SparseOptimizer(kind, float(lr), float(eps), dim=int(dim), beta1=float(beta1), beta2=float(beta2),
                           iteration=iteration, weight_decay=weight_decay)  # fmt: skip


def state_names(rule: SparseOptimizer) -> tuple[str, ...]:
    """The names torchrec's FusedEmbeddingBagCollection gives the optimizer state of a table (after
    ``<table>.weight.``): none for SGD, ``momentum_1`` for the Adagrads, ``momentum_1`` and ``momentum_2``
    for Adam (and Adam's per-row step counts, ``row_counter``, when they correct its bias)."""
    if rule.kind == "sgd":
        return ()
    if rule.kind != "adam":
        return ("momentum_1",)
    return ("momentum_1", "momentum_2") + (("row_counter",) if rule.iteration == 0 else ())


def state_views(rule: SparseOptimizer, state: torch.Tensor, dim: int) -> dict[str, torch.Tensor]:
    """A table's optimizer state (rows of Hotline's state array, [rows], [rows, D] or [rows, 2 D + 1]) as
    views by :func:`state_names`' names: Adam's moments are its first D and next D columns, its step counts
    the last."""
    names = state_names(rule)
    if rule.kind != "adam":
        return {n: state for n in names}
    views = {
        "momentum_1": state[:, :dim],
        "momentum_2": state[:, dim : 2 * dim],
        "row_counter": state[:, 2 * dim],
    }
    return {n: views[n] for n in names}


class HotlineFusedOptimizer(KeyedOptimizer):
    """The KeyedOptimizer of a Hotline collection (see the module docstring).

    Args:
        params: ``<table>.weight`` -> the table's weight parameter.
        momentum: ``<table>.weight`` -> its optimizer state by name (:func:`state_views`; empty for SGD).
        optimizer: the sparse rule (kind, lr, eps, Adam's betas); ``lr`` follows ``param_groups[0]["lr"]``.
        step_fn: applies the pending update with a given SparseOptimizer (the collection's sparse step).
        before_save: brings the state up to date in host memory (hot rows' state synced).
        after_load: pushes loaded state to the hot rows.
    """

    def __init__(self, params: dict[str, torch.Tensor], momentum: dict[str, dict[str, torch.Tensor]],
                 optimizer: SparseOptimizer, step_fn: Callable[[SparseOptimizer], int],
                 before_save: Callable[[], None], after_load: Callable[[], None]):  # fmt: skip
        state = {p: {f"{key}.{n}": t for n, t in momentum.get(key, {}).items()} for key, p in params.items()}
        state = {p: s for p, s in state.items() if s}
        group = {"params": list(params.values()), "lr": optimizer.lr, "eps": optimizer.eps}
        super().__init__(params, state, [group])
        self.rule = optimizer
        self.iteration = 0
        """Forwards of the collection so far (fbgemm's ``iter``): the bias correction of FBGEMM's Adam."""
        self._step_fn, self._before_save, self._after_load = step_fn, before_save, after_load

    def current_rule(self) -> SparseOptimizer:
        """The sparse rule with the learning rate of ``param_groups[0]`` (a scheduler may have changed it)."""
        lr = float(next(iter(self.param_groups))["lr"])
        if lr != self.rule.lr:
            self.rule = replace(self.rule, lr=lr)
        return self.rule

    def set_optimizer_step(self, step: int) -> None:
        """Sets the iteration Adam's bias correction counts from (torchrec's / fbgemm's ``set_optimizer_step``:
        a resumed run sets the step it resumes at)."""
        if int(step) < 0:
            raise ValueError(f"set_optimizer_step: step must be >= 0, got {step}")
        self.iteration = int(step)

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
