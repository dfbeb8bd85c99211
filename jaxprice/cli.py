"""The command line: `jaxprice <command> ...`.

Each command lives in its own module, jaxprice/_src/cli_<command>.py, exposing
``add_parser(subparsers)`` and ``run(args) -> int``. Bad input ends with one line naming the
file, field and value (exit status 2), never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ("price", "sweep", "optimize", "fit", "accuracy", "size", "import-model", "serve")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="jaxprice", description="Price LLM serving steps.")
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
    args = parser.parse_args(argv)
    from jaxprice import JaxpriceError
    try:
        return int(modules[args.command].run(args) or 0)
    except JaxpriceError as err:
        print(f"jaxprice {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
