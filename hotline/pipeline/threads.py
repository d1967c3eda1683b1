"""Background threads with bounded queues: the one utility every pipeline stage of Hotline runs on.

- :class:`Producer` runs a source iterator on a named thread up to ``depth`` items ahead of the caller (the
  Criteo reader, the look-ahead executor's prepare thread on 1 or N ranks).
- :class:`Worker` runs a function on each item the caller submits, in order, on a named thread (the
  executor's write-back, the Criteo pass-1 sink).

Both re-raise the thread's first exception on the caller, with the thread's traceback; both stop cleanly on
:meth:`close` (also on Ctrl-C or when the caller leaves a loop early): no thread outlives its owner. A thread
that runs Numba kernels sets its Numba thread count once, when it starts (Numba's count is per thread), and a
thread that issues CUDA work binds its device once, when it starts (:func:`bind_device`: CUDA's current
device is per thread too, and every new thread starts on GPU 0).

How a producer and torch share the cores is decided here too, and only here (:func:`compute_threads`,
:class:`CoreShare`): while a producer runs, torch's intra-op threads (and the main thread's Numba threads) are
the cores less the cores the producer and the writer were *measured* to keep busy over the last steps; they
are restored when the run ends. The cost model prices the look-ahead step with the same function.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager

POLL_S = 0.05
"""How often a blocked put or get looks at the stop flag."""

END = object()
"""Marks the end of a stream (a producer's source ran out, or a worker was told to finish)."""


class _Failure:
    """An exception raised on a pipeline thread, carried to the caller with its traceback."""

    def __init__(self, exc: BaseException):
        self.exc = exc


THREADS_PER_CORE = 4
"""At most this many torch/numba threads per core (``--threads``, ``--worker-threads``, ``--nproc``): more only
slows a run down, and tens of thousands crash the OpenMP runtime (a segfault, not an error)."""


def max_threads() -> int:
    """The most threads (or local ranks) a flag may ask for on this machine."""
    import os

    return THREADS_PER_CORE * (os.cpu_count() or 1)


def check_threads(threads: int, flag: str = "--threads", least: int = 0) -> int:
    """Returns ``threads`` if it is in [least, :func:`max_threads`], else raises ValueError naming ``flag``."""
    import os

    top = max_threads()
    if threads < least:
        raise ValueError(f"{flag} must be >= {least}{' (0: all cores)' if least == 0 else ''}, got {threads}")
    if threads > top:
        raise ValueError(
            f"{flag} must be at most {top} ({THREADS_PER_CORE} x this machine's {os.cpu_count() or 1} cores), "
            f"got {threads}"
        )
    return threads


def set_numba_threads(threads: int | None) -> None:
    """Sets this thread's Numba thread count (clipped to what Numba was started with); None leaves it."""
    if threads is None:
        return
    import numba

    numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))


@contextmanager
def numba_threads(threads: int) -> Iterator[int]:
    """This thread's Numba threads at ``threads`` (clipped to Numba's pool, at least one) inside; the count it
    had is restored after. Yields the count set."""
    import numba

    saved = numba.get_num_threads()
    n = max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(n)
    try:
        yield n
    finally:
        numba.set_num_threads(saved)


_bound = threading.local()


def bind_device(device) -> None:
    """Makes ``device`` the current device of the calling thread (``torch.cuda.set_device`` for a CUDA device
    with an index; nothing to set for the CPU) and records it (:func:`bound_device`). Every thread that issues
    CUDA work calls it when it starts, so that whatever still acts on "the current device" (current streams,
    events recorded without a stream, pinned allocations, NCCL) acts on this rank's GPU, not GPU 0."""
    if device is None:
        return
    import torch

    device = torch.device(device)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    _bound.device = device


def bound_device():
    """The device :func:`bind_device` last bound on this thread (None if it never ran here)."""
    return getattr(_bound, "device", None)


def check_concurrent_kernels() -> str:
    """Raises RuntimeError when Numba's threading layer cannot run parallel kernels from two threads at once
    (``workqueue`` aborts the process then), as the look-ahead worker and the main thread do; returns the
    layer's name."""
    from hotline.kernels.probe import threading_layer

    layer = threading_layer()
    if layer == "workqueue":
        raise RuntimeError(
            "Numba runs on its 'workqueue' threading layer, which aborts when two threads run parallel "
            "kernels at once (look-ahead does): install TBB (pip install tbb) or an OpenMP runtime, or "
            "train with --lookahead 0"
        )
    return layer


def configure_threads(threads: int) -> int:
    """Sets torch's and numba's thread counts on purpose (they share the cores, one after the other);
    0 means all cores. Returns the count."""
    import os

    import numba
    import torch

    n = check_threads(threads) or os.cpu_count() or 1
    torch.set_num_threads(n)
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    return n


def hold_threads(threads: int) -> Callable[[], None]:
    """Sets torch's and this thread's numba thread counts to ``threads`` (:func:`configure_threads`; 0 changes
    nothing) and returns what puts back the counts they had (once; later calls do nothing): a library object
    that applies its own thread setting gives the process's back when it is done."""
    if not threads:
        return lambda: None
    import numba
    import torch

    before = [(torch.get_num_threads(), numba.get_num_threads())]
    configure_threads(threads)

    def restore() -> None:
        if before:
            torch_threads, numba_threads_ = before.pop()
            torch.set_num_threads(torch_threads)
            numba.set_num_threads(numba_threads_)

    return restore


BUSY_CORE_SLACK = 0.25
"""Part of a core the producer may keep busy without taking it from torch (an idle fraction torch's threads
absorb at little cost; past it, a torch thread would lose its core and stall its parallel region)."""


BETWEEN_STEPS_THREADS = 1
"""Numba threads of the main thread's row copies between two look-ahead steps (:meth:`CoreShare.between_steps`).
Such copies are small (the refresh of stale rows: 2,600-10,200 rows of 256 bytes a step on emb-heavy at 85-70%,
0.3 ms of CPU) and run while the producer and the writer hold cores: a parallel copy then waits for its thread
that lost its core. Measured on the 2-core host (``bench_pipeline.py --config emb-heavy --modes hotline_k2``, two
runs each way, alternated): the copies took 0.38-0.40 ms a refresh on one thread against 0.82-0.97 on two,
the whole refresh 2.3-2.7 ms against 3.0-3.4. The copies' results do not depend on the count."""


def compute_threads(cores: int, worker_threads: int, busy_share: float) -> int:
    """torch's intra-op threads while a look-ahead producer runs: ``cores`` less the cores the producer keeps
    busy (``worker_threads`` Numba threads busy ``busy_share`` of the step, measured), rounded up once past
    :data:`BUSY_CORE_SLACK`; at least one. The one rule the executor applies and the cost model prices."""
    busy = worker_threads * min(max(float(busy_share), 0.0), 1.0)
    return int(max(1, min(cores, cores - math.ceil(busy - BUSY_CORE_SLACK))))


_spin_warned = False


def spinning_warning() -> str | None:
    """One line saying why this process's torch threads spin, or None when they wait passively.

    ``import hotline`` sets a short spin, then a passive wait (``OMP_WAIT_POLICY=PASSIVE``,
    ``GOMP_SPINCOUNT``: see ``hotline/__init__.py``), but torch's OpenMP runtime reads them only when torch loads.
    Imported before hotline, with no policy in the environment, torch's idle threads spin for libgomp's default
    after every parallel region (measured on the 2-core machine: 9-10 ms of CPU in a 20 ms pause after a
    matmul, against 0.1 ms), on the cores the look-ahead producer and writer need."""
    import hotline

    if not hotline._TORCH_SPINS:
        return None
    return (
        "torch was imported before hotline, so its OpenMP threads spin after each parallel region and take the "
        "cores the look-ahead threads need: import hotline first, or set OMP_WAIT_POLICY=PASSIVE "
        f"GOMP_SPINCOUNT={hotline._SPIN_COUNT} before starting Python"
    )


def warn_if_spinning() -> None:
    """Warns once per process (RuntimeWarning) with :func:`spinning_warning`'s line, if there is one."""
    global _spin_warned
    message = spinning_warning()
    if message is not None and not _spin_warned:
        _spin_warned = True
        import warnings

        warnings.warn(message, RuntimeWarning, stacklevel=3)


class CoreShare:
    """Applies :func:`compute_threads` to each step computed while a look-ahead producer runs, from measured
    busy time.

    The step's compute runs inside :meth:`lowered`: torch's intra-op threads (and this thread's Numba threads)
    are set by the rule, and restored when the step's compute ends (what the caller does between steps, an
    evaluation say, runs on every core). After each step :meth:`record` is given the seconds the producer and
    writer threads worked and the step's wall seconds. The share starts at 1 (the producer first fills its
    queue), and the first step's record, which holds that fill, is left out. From the second record on, the
    share is the mean of the records so far until there are ``1 / smoothing`` of them, then a running average
    with weight ``smoothing`` (one slow step does not flip it), so the rule follows the measurement from the
    second step instead of keeping the first steps on fewer cores while a share of 1 decays.

    With a CUDA ``device`` :meth:`lowered` changes nothing: the compute runs on the device, torch's host threads
    only launch its kernels, and setting their count twice a step would be work the step does not need.
    """

    def __init__(self, worker_threads: int, cores: int | None = None, smoothing: float = 0.15, device=None):
        import torch

        self.on_device = device is not None and torch.device(device).type == "cuda"
        """The compute runs on a CUDA device: torch's threads are left as they are."""

        warn_if_spinning()  # a producer is about to share the cores with torch
        self.worker_threads = int(worker_threads)
        self.cores = int(cores or torch.get_num_threads())
        self.smoothing = float(smoothing)
        self.busy_share = 1.0
        """Running share of the step's wall time the producer and writer threads worked."""
        self.records = 0
        """Steps recorded so far (the first, the queue's fill, is not folded in)."""

    @property
    def threads(self) -> int:
        """torch's intra-op threads for the next step's compute."""
        return compute_threads(self.cores, self.worker_threads, self.busy_share)

    def record(self, busy_s: float, step_s: float) -> None:
        """Folds one step's measured busy seconds (producer + writer) over its wall seconds into the share."""
        if step_s <= 0:
            return
        self.records += 1
        if self.records == 1:  # the producer prepared the first K + 1 steps during it: not a step's share
            return
        share = min(1.0, max(0.0, busy_s / step_s))
        weight = max(self.smoothing, 1.0 / (self.records - 1))  # the mean of the records, then a running one
        self.busy_share += weight * (share - self.busy_share)

    @contextmanager
    def lowered(self) -> Iterator[int]:
        """torch (and this thread's Numba) on :attr:`threads` threads inside; restored after. Yields the count."""
        import torch

        saved = torch.get_num_threads()
        if self.on_device:
            yield saved
            return
        n = self.threads
        # Numba's count first: the call that starts Numba's OpenMP pool resets torch's count (measured)
        with numba_threads(n):
            torch.set_num_threads(n)
            try:
                yield n
            finally:
                torch.set_num_threads(saved)

    @staticmethod
    def between_steps() -> AbstractContextManager[int]:
        """The main thread's own row copies between two steps while the producer and writer run (the refresh of
        stale rows) on :data:`BETWEEN_STEPS_THREADS` Numba threads; restored after."""
        return numba_threads(BETWEEN_STEPS_THREADS)


class _Thread:
    """A named daemon thread, a bounded queue, a stop flag and the first error of the thread; ``device``: the
    compute device the thread binds when it starts (None: a thread that issues no device work)."""

    def __init__(self, name: str, depth: int, numba_threads: int | None, device=None):
        self.name = name
        self.numba_threads = numba_threads
        self.device = device
        self.queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    @property
    def stopping(self) -> bool:
        """True once :meth:`close` was called or the thread failed."""
        return self._stop.is_set()

    def _start(self, target) -> None:
        def run():
            set_numba_threads(self.numba_threads)
            bind_device(self.device)
            target()

        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()

    def put(self, item) -> bool:
        """Puts ``item`` on the queue, waiting for room; False if the stage was stopped meanwhile."""
        while not self._stop.is_set():
            try:
                self.queue.put(item, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def raise_error(self) -> None:
        """Re-raises the thread's exception on the caller (with the thread's traceback), if it had one."""
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Stops the thread and waits for it to end."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Producer(_Thread):
    """Runs ``source`` on a thread, at most ``depth`` items ahead; iterate it for the items, in order.

    ``run_to_end``: after :meth:`close`, keep running the source to its end (discarding what it yields)
    instead of abandoning it; for sources that must take part in a collective to stop (the look-ahead
    thread of N ranks ends when all ranks agree), which read :attr:`stopping` themselves.
    """

    def __init__(self, name: str, depth: int, numba_threads: int | None = None, device=None):
        super().__init__(name, depth, numba_threads, device)

    def start(self, source: Iterable, run_to_end: bool = False) -> Producer:
        def produce():
            try:
                for item in source:
                    if not self.put(item) and not run_to_end:
                        return
                    if self.stopping and not run_to_end:
                        return
                self.put(END)
            except BaseException as e:  # noqa: BLE001 - carried to the caller
                self.error = e
                self.put(_Failure(e))

        self._start(produce)
        return self

    def get(self, check: Callable[[], None] | None = None):
        """The next item, or :data:`END`; re-raises the source's exception. ``check()`` runs while waiting
        (to surface another stage's error); a stopped producer returns END."""
        while True:
            try:
                item = self.queue.get(timeout=POLL_S)
            except queue.Empty:
                if check is not None:
                    check()
                if self.stopping:
                    return END
                if self._thread is not None and not self._thread.is_alive() and self.queue.empty():
                    raise RuntimeError(f"thread {self.name} ended without a result") from None
                continue
            if isinstance(item, _Failure):
                raise item.exc
            return item

    def __iter__(self) -> Iterator:
        while (item := self.get()) is not END:
            yield item


class Worker(_Thread):
    """Runs ``fn(item)`` on a thread for each :meth:`submit`-ted item, in order, ``depth`` items queued at most.

    ``done(item)`` (optional) runs on the thread after each item; an exception of ``fn`` stops the worker
    and is re-raised on the caller by the next :meth:`submit`, :meth:`raise_error` or :meth:`finish`.
    """

    def __init__(
        self,
        name: str,
        fn: Callable,
        depth: int,
        numba_threads: int | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        device=None,
    ):
        super().__init__(name, depth, numba_threads, device)
        self.fn = fn
        self.on_error = on_error
        self._start(self._work)

    def _work(self) -> None:
        while True:
            try:
                item = self.queue.get(timeout=POLL_S)
            except queue.Empty:
                if self.stopping:
                    return
                continue
            if item is END:
                return
            try:
                self.fn(item)
            except BaseException as e:  # noqa: BLE001 - carried to the caller
                self.error = e
                self._stop.set()
                if self.on_error is not None:
                    self.on_error(e)
                return

    def submit(self, item) -> None:
        """Queues ``item`` (waits while the queue is full); raises the worker's error if it failed."""
        self.raise_error()
        if not self.put(item):
            self.raise_error()

    def finish(self) -> None:
        """Lets the worker do everything submitted, then ends it; re-raises its error."""
        if self.put(END) and self._thread is not None:
            self._thread.join()
        self.raise_error()
