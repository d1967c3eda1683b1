"""The ``hotline`` command line: a thin layer that parses flags and calls library functions."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys

# Sub-command -> module providing ``add_parser(subparsers)``. Modules are imported when the parser is built;
# they keep heavy imports (torch, torchrec) inside their ``run`` functions so ``hotline --help`` stays fast.
COMMANDS = {
    "data": "hotline.cli.data",
    "profile": "hotline.cli.profile",
    "train": "hotline.cli.train",
    "plan": "hotline.cli.plan",
    "evaluate": "hotline.cli.evaluate",
    "predict": "hotline.cli.predict",
    "export": "hotline.cli.export",
    "report": "hotline.cli.report",
    "calibrate": "hotline.cli.calibrate",
}


START_HERE = """where to start:
  hotline train                          train DLRM on the built-in data (the mode is chosen for you)
  hotline data synthetic --out D         make a skewed Criteo-like dataset (or: hotline data criteo FILES)
  hotline profile D --hbm-budget 4MiB --out p.npz
                                         find the popular rows and place them under a device budget
  hotline train D --mode hotline --placement p.npz
                                         train with the popular rows on the device, the rest on the host
'hotline COMMAND --help' lists a command's flags; docs/cli.md has them all."""


def build_parser() -> argparse.ArgumentParser:
    from hotline import __version__
    from hotline.cli.args import read_negative_values, use_help_formatter
    from hotline.cli.effects import unset_effect_flags

    parser = argparse.ArgumentParser(
        prog="hotline",
        description="Train recommendation models whose embedding tables do not fit in GPU memory.",
        epilog=START_HERE,
    )
    parser.add_argument("--version", action="version", version=f"hotline {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module_name in COMMANDS.values():
        importlib.import_module(module_name).add_parser(sub)
    unset_effect_flags(parser)  # a flag of FLAG_EFFECTS is given by being set at all
    use_help_formatter(parser)  # every flag's help shows its default
    read_negative_values(parser)  # --cold-cache -1KiB: refused by the size parser, not as a missing value
    return parser


# Optional packages -> what installs them (a missing one is a one-line error with this command).
EXTRAS = {
    "torchrec": 'pip install "hotline-dlrm[torchrec]" && pip install --no-deps torchrec==1.8.0',
    "fbgemm_gpu": 'pip install "hotline-dlrm[torchrec]" && pip install --no-deps torchrec==1.8.0',
    "pandas": "pip install pandas",
    "matplotlib": "pip install matplotlib",
}


def _command_name(args: argparse.Namespace | None) -> str:
    if args is None:
        return "hotline"
    parts = [getattr(args, "command", None), getattr(args, "data_command", None)]
    return " ".join(["hotline", *(p for p in parts if p)])


def _known_failure(e: BaseException) -> str | None:
    """The one-line message of a failure a user can cause, or None for a bug (which keeps its traceback)."""
    if isinstance(e, MemoryError):
        size = f" ({e.args[0]})" if e.args else ""
        return (
            f"out of memory{size}: use a smaller --mini-batch-size, fewer or smaller tables, or more memory"
        )
    if isinstance(e, ModuleNotFoundError):
        top = (e.name or "").split(".")[0]
        if top in EXTRAS:
            return f"this needs the optional package {top!r}: {EXTRAS[top]}"
        return None
    if isinstance(e, OSError):
        return str(e)  # carries the path: "[Errno 28] No space left on device: 'x'"
    if isinstance(e, (ValueError, IndexError)):  # DatasetError, PlacementError, CheckpointError, flags
        return str(e)
    if isinstance(e, RuntimeError) and any(w in str(e) for w in ("device", "CUDA", "numba", "NUMBA")):
        return str(e).splitlines()[0]  # an invalid device string, no CUDA, Numba thread limits
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hotline`` console script; returns the process exit status.

    Failures a user can cause (a bad input or flag, an unwritable or full output, no memory, a missing
    optional package) print one line ``hotline COMMAND: error: ...`` and exit 2; ``--debug`` (anywhere on the
    command line) or ``HOTLINE_DEBUG=1`` prints the traceback too. Ctrl-C exits 130 with one line."""
    in_process = argv is not None
    argv = list(sys.argv[1:] if argv is None else argv)
    saved, sigint = os.environ.get("HOTLINE_DEBUG"), signal.getsignal(signal.SIGINT)
    if "--debug" in argv:
        argv = [a for a in argv if a != "--debug"]
        os.environ["HOTLINE_DEBUG"] = "1"  # for this call only; ranks started by --nproc inherit it
    try:
        with contextlib.suppress(ValueError):  # not the main thread: Python's own Ctrl-C handling stays
            signal.signal(signal.SIGINT, _first_interrupt)
        return _main(argv)
    finally:
        if saved is None:
            os.environ.pop("HOTLINE_DEBUG", None)
        else:
            os.environ["HOTLINE_DEBUG"] = saved
        if in_process and sigint is not None and signal.getsignal(signal.SIGINT) is not sigint:
            signal.signal(signal.SIGINT, sigint)  # a Ctrl-C ignored the rest; the caller keeps its own


def _first_interrupt(signum, frame) -> None:
    """Ctrl-C: further presses are ignored from this instant (before the KeyboardInterrupt unwinds), so two
    quick presses cannot cut the clean-up short or print a traceback from inside the first one's handling."""
    from hotline.cli.args import ignore_further_interrupts

    ignore_further_interrupts()
    raise KeyboardInterrupt


def _claim(args: argparse.Namespace):
    """The command's outputs, judged by the one output policy and locked while it runs (before any work).

    Each command declares its outputs and inputs through ``declare(args)`` (set as a parser default); a rank
    that Hotline's ``--nproc`` launcher started (or a torchrun rank other than 0) writes under the claim of
    its launcher (of rank 0) and judges nothing again."""
    from hotline import outputs

    declare = getattr(args, "declare", None)
    if declare is None:
        return outputs.Claim({})
    declared, inputs = declare(args)
    if os.environ.get("HOTLINE_LAUNCHED") or os.environ.get("RANK", "0") != "0":
        return outputs.unclaimed(declared)
    return outputs.claim(declared, inputs, force=getattr(args, "force", False))


UNWIND_SECONDS = 10
"""Seconds a SIGTERM's clean-up may take before the process dies by the signal's default action."""


def _die_by_sigterm(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _say_without_blocking(line: str) -> None:
    """Writes ``line`` to stderr unless that would block (a pipe nobody reads is full): then it is dropped."""
    import fcntl

    try:
        fd = sys.stderr.fileno()
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        try:
            os.write(fd, line.encode())
        finally:
            fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    except (OSError, ValueError, AttributeError):  # full, closed, or not a real file (a test's capture)
        with contextlib.suppress(Exception):
            if not hasattr(sys.stderr, "fileno") or _not_a_file(sys.stderr):
                print(line, end="", file=sys.stderr)


def _not_a_file(stream) -> bool:
    try:
        stream.fileno()
    except (OSError, ValueError, AttributeError):
        return True
    return False


@contextlib.contextmanager
def _terminate_unwinds(name: str):
    """SIGTERM (``kill``, a scheduler's stop) unwinds the command as Ctrl-C does, so every ``finally`` runs
    (scratch folders, temporary files, locks removed): one line ``NAME: terminated``, exit status 143. Where
    signals cannot be set (not the main thread), and in a rank of ``--nproc`` (its launcher stops it, maybe
    inside a collective that would not unwind), the default stays."""

    fired = []

    def terminated(signum, frame) -> None:
        fired.append(signum)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM cannot cut the clean-up short
        signal.signal(signal.SIGALRM, _die_by_sigterm)  # a clean-up that cannot finish (a full stderr pipe
        signal.alarm(UNWIND_SECONDS)  # nobody reads) ends as SIGTERM always ended a run, within seconds
        _say_without_blocking(f"{name}: terminated\n")
        raise SystemExit(128 + signum)

    if os.environ.get("HOTLINE_LAUNCHED") or "LOCAL_RANK" in os.environ:
        yield
        return
    try:
        previous = signal.signal(signal.SIGTERM, terminated)
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if not fired:  # after a SIGTERM the watchdog stays: the exit's own flush may block too
            signal.alarm(0)


def _main(argv: list[str]) -> int:
    args = None
    try:
        args = build_parser().parse_args(argv)
        from hotline.cli.args import check_counts

        check_counts(args)  # every command's thread and process counts, bounded the same way
        with _terminate_unwinds(_command_name(args)), _claim(args) as args.claim:
            return int(args.func(args) or 0)
    except KeyboardInterrupt:
        from hotline.cli.args import ignore_further_interrupts

        ignore_further_interrupts()
        print(f"{_command_name(args)}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        message = _known_failure(e)
        if message is None:
            raise
        from hotline.cli.args import show_traceback

        show_traceback()
        print(f"{_command_name(args)}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
