"""The command line: `jaxprice <command> ...`.

Each command lives in its own module, jaxprice/_src/cli_<command>.py, exposing
``add_parser(subparsers)`` and ``run(args) -> int``. Bad input ends with one line naming the
file, field and value (exit status 2), never a traceback. Commands that compile kernels keep
them on disk across runs (jaxprice/_src/compile_cache.py: $JAXPRICE_CACHE_DIR, 'off' for none).
"""

from __future__ import annotations

import argparse
import importlib
import sys

class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is ONE line naming the command and pointing at --help (exit 2),
    not the whole usage block. Subparsers inherit the class (add_subparsers' parser_class)."""

    argv: list | None = None        # the words being parsed (main sets them): which options were given

    def error(self, message):
        text = " ".join(str(message).split())
        given = set(_Parser.argv or ())
        greedy = [a.option_strings[0] for a in self._actions if a.nargs in ("+", "*") and given & set(a.option_strings)]
        if text.startswith("the following arguments are required") and greedy:
            # `--coefficients f.yaml SCENARIO` reads SCENARIO as a second file: say how to write it
            text += (f"; an option taking several values ({', '.join(greedy)}) takes every word after it, so give "
                     "it after the positional arguments")
        self.exit(2, f"{self.prog}: error: {text} (see {self.prog} --help)\n")


COMMANDS = ("price", "sweep", "optimize", "fit", "accuracy", "size", "import-model", "import-bench", "serve",
            "cache")
# the commands that compile kernels: they keep them on disk across runs (compile_cache.py;
# accuracy's --cache-dir names the folder for one run)
COMPILING = ("price", "sweep", "optimize", "fit", "accuracy", "size", "serve")


def _version() -> str:
    """The installed distribution's version (pyproject.toml's), or 'unknown' for a source tree not installed."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("jaxprice")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv=None) -> int:
    parser = _Parser(prog="jaxprice", description="Price LLM serving steps.")
    parser.add_argument("--version", action="version", version=f"jaxprice {_version()}")   # else "COMMAND is required"
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = {}
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"jaxprice._src.cli_{name.replace('-', '_')}")
        except ModuleNotFoundError as err:
            if err.name != f"jaxprice._src.cli_{name.replace('-', '_')}":
                raise
            continue
        mod.add_parser(sub)
        modules[name] = mod
    _Parser.argv = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(argv)
    if extra:       # blamed on the command that was given, as its own parser would
        sub.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    from jaxprice import JaxpriceError
    try:
        if args.command in COMPILING and not getattr(args, "cache_dir", None):
            from jaxprice._src import compile_cache
            _folder, note = compile_cache.enable_default()
            if note:
                print(f"jaxprice: note: {note}", file=sys.stderr)
        status = int(modules[args.command].run(args) or 0)
        sys.stdout.flush()          # a closed pipe is found here, not in a traceback at exit
        return status
    except JaxpriceError as err:
        print(f"jaxprice {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader of standard output went away (`jaxprice sweep ... | head`): stop quietly, as
        # Unix tools do, with the shell's status for SIGPIPE, and let nothing flush to the closed pipe
        _quiet_stdout()
        return 141


def _quiet_stdout() -> None:
    """Point standard output at the null device, so that Python's flush at exit does not print
    a BrokenPipeError of its own."""
    import os
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):      # a stream with no descriptor (io.UnsupportedOperation)
        pass


if __name__ == "__main__":
    sys.exit(main())
