"""The learning-rate schedule of the reference DLRM and of MLPerf's DLRM-DCNv2 reference: linear warm-up, then
a quadratic (polynomial, power 2) decay, applied to the dense and the sparse learning rates alike.

It is the rule of ``LRPolicyScheduler`` (facebookresearch/dlrm ``dlrm_s_pytorch.py`` and
``torchrec_dlrm/lr_scheduler.py``, which MLPerf's ``recommendation_v2`` reference imports), written as a pure
function of the step, so a resumed run continues the schedule exactly. With ``c = step + 1`` (the reference
scheduler's ``_step_count`` while step ``step``, counted from 0, runs):

* warm-up, ``c < W``: ``lr * c / W``;
* decay, ``S <= c < S + N``: ``max(1e-7, lr * ((N - (c - S)) / N) ** 2)``;
* otherwise, with ``N > 0``, the rate stays at the last one computed (the warm-up's last between warm-up and
  decay, the decay's last after it); with ``N = 0``, ``lr``.

MLPerf's closed division runs DLRM-DCNv2 with ``W = S = N = 0`` (``opt_learning_rate_warmup_steps``,
``opt_learning_rate_decay_start_step``, ``opt_learning_rate_decay_steps`` all 0): a constant rate.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_DECAYED_LR = 1e-7
"""The floor of the decayed rate (the reference's ``min_lr``)."""


@dataclass(frozen=True)
class LRSchedule:
    """Warm-up and decay steps around a base learning rate (dlrm's ``--lr-num-warmup-steps`` and friends)."""

    base_lr: float
    """The rate outside warm-up and decay (``--learning-rate``)."""
    warmup_steps: int = 0
    """``--lr-num-warmup-steps`` W: the rate ramps up linearly over the first W steps."""
    decay_start_step: int = 0
    """``--lr-decay-start-step`` S: where the quadratic decay starts (not before the warm-up ends)."""
    decay_steps: int = 0
    """``--lr-num-decay-steps`` N: how long it decays (0: no decay)."""

    def __post_init__(self) -> None:
        if not self.base_lr > 0:
            raise ValueError(f"--learning-rate must be positive, got {self.base_lr}")
        if min(self.warmup_steps, self.decay_start_step, self.decay_steps) < 0:
            raise ValueError(
                "--lr-num-warmup-steps, --lr-decay-start-step and --lr-num-decay-steps must be >= 0"
            )
        if self.decay_steps and self.decay_start_step < self.warmup_steps:
            raise ValueError(
                f"--lr-decay-start-step {self.decay_start_step} is inside the warm-up "
                f"(--lr-num-warmup-steps {self.warmup_steps}): the warm-up must finish before the decay starts"
            )

    @property
    def constant(self) -> bool:
        """Whether every step runs at ``base_lr``."""
        return self.warmup_steps <= 1 and self.decay_steps == 0

    def _warmup(self, c: int) -> float:
        return self.base_lr * c / self.warmup_steps

    def _decay(self, c: int) -> float:
        left = (self.decay_steps - (c - self.decay_start_step)) / self.decay_steps
        return max(MIN_DECAYED_LR, self.base_lr * left**2)

    def lr(self, step: int) -> float:
        """The learning rate of training step ``step`` (0 = the first step of the run)."""
        c = step + 1
        W, S, N = self.warmup_steps, self.decay_start_step, self.decay_steps
        if c < W:
            return self._warmup(c)
        if S <= c < S + N:
            return self._decay(c)
        if N == 0:
            return self.base_lr
        if c >= S + N:
            return self._decay(S + N - 1)  # frozen at the decay's last rate
        return self._warmup(W - 1) if W >= 2 else self.base_lr  # between warm-up and decay: its last rate
