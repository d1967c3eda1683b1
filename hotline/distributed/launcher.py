"""Starting the ranks of a data-parallel run: torch's elastic launcher for ``hotline train --nproc N`` and a
process-group join for ``torchrun -m hotline train`` (tests and benchmarks spawn ranks with tests/ranks.py).

The backend follows the compute device (:func:`~hotline.distributed.comm.backend_for`): gloo on the CPU,
NCCL (with a gloo group beside it for host tensors) on CUDA, where each process binds its own GPU first."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from hotline.distributed.comm import EXIT_PEER_LOST, Comm, backend_for


def _init_process_group(*args, **kwargs) -> None:
    """``dist.init_process_group``, after importing the torch modules that would otherwise pin the group.

    ``torch.distributed.nn.functional`` takes ``group.WORLD`` as default arguments, bound when it is first
    imported; torch._dynamo imports it, and the first torch optimizer imports torch._dynamo. Imported after
    the group exists, it holds the default group for the life of the process: ``destroy_process_group()``
    then frees nothing, and the group's gloo threads live on into interpreter shutdown. A gloo worker that
    drops a finished collective's tensors late (a loaded machine) then takes the GIL of a finalizing
    interpreter, which ends the thread through a noexcept frame: "terminate called without an active
    exception", SIGABRT, exit -6, after the run had finished. Imported first, it binds None (no group yet).
    """
    import torch.distributed as dist
    import torch.distributed.nn.functional  # noqa: F401 - see above: must precede init_process_group

    dist.init_process_group(*args, **kwargs)


# Start-up failures that a second try usually gets past: a busy machine's sockets (EAGAIN on gloo's connect,
# a peer that reset or refused the connection), a port taken between being chosen and being bound.
TRANSIENT = (
    "Resource temporarily unavailable",
    "Connection reset by peer",
    "Connection refused",
    "Address already in use",
    "Broken pipe",
)
EXIT_TRANSIENT = 75
"""A rank's exit status when it could not join the group for a transient reason (BSD's EX_TEMPFAIL): the
``--nproc`` launcher starts every rank again, up to :data:`START_ATTEMPTS` times."""
START_ATTEMPTS = 3
LAUNCHER_PID = "HOTLINE_LAUNCHER_PID"
"""Environment variable: the pid of the ``--nproc`` launcher, whose ranks die with it."""


class StartError(RuntimeError):
    """The ranks could not form their process group; ``transient`` when trying again may succeed."""

    def __init__(self, message: str, transient: bool):
        super().__init__(message)
        self.transient = transient


def init_from_env(device: str = "cpu") -> Comm:
    """Joins the process group torchrun described in the environment (RANK, WORLD_SIZE, MASTER_*), with the
    backend of ``device`` (this rank's compute device, bound to the process first: NCCL needs it). A failure
    is a :class:`StartError` with the backend's first line (``transient`` for the errors of :data:`TRANSIENT`)."""
    import torch.distributed as dist

    from hotline.pipeline.threads import bind_device

    bind_device(device)
    if not dist.is_initialized():
        backend = backend_for(device)
        try:
            _init_process_group(backend)
        except (RuntimeError, OSError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            transient = any(t in str(e) for t in TRANSIENT)
            raise StartError(f"the ranks could not form their {backend} group: {first}", transient) from e
    return Comm.from_process_group()


def die_with_launcher() -> None:
    """Makes this rank die with the ``--nproc`` launcher that started it (Linux: the parent-death signal,
    SIGKILL, through prctl); a rank whose launcher is already gone exits now. Elsewhere it does nothing: the
    elastic agent stops its ranks whenever it ends normally."""
    launcher = os.environ.get(LAUNCHER_PID)
    if launcher is None or not sys.platform.startswith("linux"):
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # not allowed here (a seccomp sandbox): the elastic agent's own clean-up still applies
    if os.getppid() != int(launcher):  # it died before the signal was armed
        os._exit(128 + signal.SIGKILL)


def worker_threads(threads: int) -> int:
    """Threads per rank: ``threads`` if given, else this machine's cores shared by the local ranks."""
    if threads:
        return threads
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, (os.cpu_count() or 1) // max(1, local))


def _killed_line(command: str, rank: int, signum: int) -> str:
    """The one line for a rank that a signal killed (the launcher then stops the others)."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    return (
        f"hotline {command}: error: rank {rank} was killed by {name} (not by Hotline: out of memory, or a kill "
        f"from outside); the other ranks were stopped. The last complete checkpoint in --checkpoint-dir is "
        f"intact (a checkpoint counts only once every rank's file and its commit marker are written): "
        f"--resume continues from it"
    )


def launch(nproc: int, argv: list[str]) -> int:
    """Starts ``python -m hotline <argv>`` on ``nproc`` local ranks through torch's elastic launcher (torchrun).

    The ranks die with this process (:func:`die_with_launcher`). A start-up that fails for a transient
    reason (a rank exits :data:`EXIT_TRANSIENT`) is tried again with every rank, on a fresh port, up to
    :data:`START_ATTEMPTS` times; then it is one line and exit 2."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    launcher_args = get_args_parser().parse_args(
        ["--standalone", "--nproc-per-node", str(nproc), "--module", "hotline", *argv]
    )
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default; we set threads per rank ourselves
    for name in ["torch.distributed.elastic", *logging.root.manager.loggerDict]:  # each sets its own level
        if name.startswith("torch.distributed.elastic"):  # a failed rank, a signal: our one line, no log
            logging.getLogger(name).setLevel(logging.CRITICAL)
    # The elastic agent turns SIGINT/SIGTERM into a SignalException here (and leaves its handlers behind);
    # the ranks see HOTLINE_LAUNCHED and leave the one "interrupted" line to this process.
    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
    handlers = {s: signal.getsignal(s) for s in handled}
    saved = {k: os.environ.get(k) for k in ("HOTLINE_LAUNCHED", LAUNCHER_PID)}
    os.environ["HOTLINE_LAUNCHED"] = "1"
    os.environ[LAUNCHER_PID] = str(os.getpid())
    try:
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                run(launcher_args)
                break
            except ChildFailedError as e:
                codes = [f.exitcode for f in e.failures.values()]
                # the rank a signal killed (not the agent's SIGTERM that stops the others after it)
                killed = sorted(
                    (-f.exitcode == signal.SIGTERM, f.timestamp, f.local_rank, -f.exitcode)
                    for f in e.failures.values()
                    if f.exitcode < 0
                )
                own = [c for c in codes if c > 0 and c != EXIT_PEER_LOST]  # the others lost it: a consequence
                if killed and not own:  # a rank's own error (exit 2) says itself
                    print(_killed_line(argv[0], *killed[0][2:]), file=sys.stderr)
                    return 128 + killed[0][3]
                if EXIT_TRANSIENT not in codes:
                    return next(iter(own), 2 if EXIT_PEER_LOST in codes else 1)
                if attempt == START_ATTEMPTS:
                    print(
                        f"hotline {argv[0]}: error: the ranks could not form their process group after "
                        f"{START_ATTEMPTS} tries (a transient error each time; see the ranks' lines above): "
                        "try again, or with fewer --nproc on a busy machine",
                        file=sys.stderr,
                    )
                    return 2
    except SignalException as e:
        # climbs a layer: a second Ctrl-C follows the CLI's one rule (docs/architecture.md, Layers)
        from hotline.cli.args import ignore_further_interrupts

        ignore_further_interrupts()
        print(
            f"hotline {argv[0]}: {'interrupted' if e.sigval == signal.SIGINT else 'terminated'}",
            file=sys.stderr,
        )
        return 130 if e.sigval == signal.SIGINT else 128 + int(e.sigval)
    finally:
        for s, h in handlers.items():
            if h is not None and not (s == signal.SIGINT and signal.getsignal(s) == signal.SIG_IGN):
                signal.signal(s, h)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return 0


def launcher_argv(
    parser: argparse.ArgumentParser, args: argparse.Namespace, drop: tuple[str, ...]
) -> list[str]:
    """The command line that reproduces ``args`` for ``parser`` (without the options in ``drop``)."""
    out: list[str] = []
    positional: list[str] = []
    for action in parser._actions:
        if (
            isinstance(action, argparse._HelpAction)
            or action.dest in drop
            or action.help == argparse.SUPPRESS
        ):
            continue
        value = getattr(args, action.dest, None)
        if not action.option_strings:
            if value is not None:
                positional.append(str(value))
            continue
        flag = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):
            if value:
                out.append(flag)
        elif value is not None and value != action.default:
            out += [flag, str(value)]
    return positional + out
