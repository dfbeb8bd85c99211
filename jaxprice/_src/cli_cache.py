"""`jaxprice cache`: the folder the commands keep compiled kernels in, what it holds, and clearing it.

    jaxprice cache             # the folder, where its name came from, entries and size
    jaxprice cache --clear     # delete the compiled kernels (the folder and anything else in it stay)
    jaxprice cache --json

The folder is ``$JAXPRICE_CACHE_DIR`` (``off``: none), else JAX's ``$JAX_COMPILATION_CACHE_DIR``,
else ``~/.cache/jaxprice/xla/HOST`` (see jaxprice/_src/compile_cache.py).
"""

from __future__ import annotations

import json


def add_parser(sub):
    p = sub.add_parser("cache", help="show or clear the compiled kernels the commands keep on disk",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--clear", action="store_true", help="delete the compiled kernels")
    p.add_argument("--json", action="store_true", help="print the folder's account as JSON")
    p.set_defaults(command="cache")
    return p


def run(args) -> int:
    import os
    from . import compile_cache as cc
    path, source = cc.cache_dir()
    why = None if path is None else cc._usable(path)
    if why is not None:      # was listed as an enabled, empty cache while every command refused or skipped it
        from .errors import refuse
        refuse(f"{why}: no command can keep compiled kernels there" + (
            "" if source != "default" else f" (they skip it; set {cc.ENV} to a folder, or to 'off')"),
            field=source if source != "default" else "folder", value=str(path))
    out = {"folder": None if path is None else str(path), "source": source, "enabled": path is not None}
    if path is not None and args.clear:
        out["cleared_entries"], out["cleared_bytes"] = cc.clear(path)
    if path is not None:
        found = cc.entries(path)
        out.update(entries=len(found), bytes=sum(size for _, size, _ in found), max_bytes=cc.MAX_BYTES)
    if args.json:
        print(json.dumps(out, indent=2))
    elif path is None:
        print(f"compile cache off ({cc.ENV}={os.environ.get(cc.ENV, '')!r}): every command compiles its kernels "
              "afresh")
    else:
        where = "the default" if source == "default" else f"from ${source}"
        cleared = (f"; cleared {out['cleared_entries']} file(s), {out['cleared_bytes'] / 2 ** 20:.1f} MiB"
                   if args.clear else "")
        print(f"compile cache: {path} ({where}): {out['entries']} file(s), {out['bytes'] / 2 ** 20:.1f} MiB (the "
              f"oldest deleted past {cc.MAX_BYTES / 2 ** 30:.0f} GiB){cleared}")
    return 0
