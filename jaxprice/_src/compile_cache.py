"""Compiled kernels kept on disk across command-line runs (JAX's persistent compilation cache).

Every ``jaxprice`` command is a fresh process, and most of a short run is compiling: the step
kernel per plan structure, the scheduler per shape bucket. With the cache, a command run again
(the same deployment structure, another concurrency, target or batch) loads them instead
(measured on 2 cores: ``jaxprice serve`` of DeepSeek-V3 at three concurrencies 12.5 s, then 4.8 s).
Results are unchanged: a cache hit is the same compiled program.

Where (``cache_dir``): ``$JAXPRICE_CACHE_DIR`` (``off`` or empty: jaxprice turns nothing on; JAX
itself still honours its own ``$JAX_COMPILATION_CACHE_DIR``), else that variable of JAX's, else
``$XDG_CACHE_HOME/jaxprice/xla/HOST``, else ``~/.cache/jaxprice/xla/HOST`` (``host_tag``);
``accuracy --cache-dir`` names one for that run. Past MAX_BYTES, the oldest entries are deleted when
a command starts (``prune``: JAX's own size limit needs the ``filelock`` package, a dependency for
ten lines). The Python API never turns the cache on by itself: a library leaves process-wide
settings to its caller.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import refuse

ENV = "JAXPRICE_CACHE_DIR"
OFF = ("", "off", "none", "0", "false", "no")
MAX_BYTES = 2 ** 30             # 1 GiB; a size search of DeepSeek-V3 leaves 1.8 MB
MIN_COMPILE_S = 0.1             # smaller compiles are not worth a file each


def cache_dir(environ=None) -> tuple[Path | None, str]:
    """(the folder the command line keeps compiled kernels in, or None for no cache; where that
    choice came from). The default folder has one subfolder per host kind (``host_tag``)."""
    env = os.environ if environ is None else environ
    if ENV in env:
        value = env[ENV].strip()
        return (None, ENV) if value.lower() in OFF else (Path(value).expanduser(), ENV)
    if env.get("JAX_COMPILATION_CACHE_DIR"):
        return Path(env["JAX_COMPILATION_CACHE_DIR"]).expanduser(), "JAX_COMPILATION_CACHE_DIR"
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base).expanduser() / "jaxprice" / "xla" / host_tag(), "default"


def host_tag() -> str:
    """What a compiled CPU kernel depends on beyond its program: the OS, the machine, jaxlib's
    version and the CPU's model and feature flags (hashed). A home folder mounted on several kinds
    of node so never hands one node's kernels to another (XLA's loader refuses them, with an
    error line per kernel, and compiles again: jax-ml/jax#38445 shows those lines), and a jaxlib
    changed in place starts afresh."""
    import hashlib
    import platform
    try:
        from jaxlib.version import __version__ as jaxlib_version
    except ImportError:
        jaxlib_version = "unknown"
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags", "Features", "CPU part"))]
        cpu = "".join(dict.fromkeys(lines))          # the first of each kind: one core's
    except OSError:
        pass
    digest = hashlib.sha1(f"{platform.system()}|{platform.machine()}|{jaxlib_version}|{cpu}".encode()).hexdigest()
    return f"{platform.system().lower()}-{platform.machine().lower()}-jaxlib{jaxlib_version}-{digest[:10]}"


def _usable(path: Path) -> str | None:
    """Why ``path`` cannot hold the cache (None: it can; it is created if missing)."""
    if path.exists() and not path.is_dir():
        return "is a file, not a folder"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return f"cannot create it ({err.strerror})"
    if not os.access(path, os.W_OK | os.X_OK):
        return "cannot write to it"
    return None


def enable(path, *, field: str) -> None:
    """Keep compiled kernels in ``path`` from now on in this process; a folder that cannot hold
    them is refused, naming ``field`` (the flag or variable that named it)."""
    path = Path(path)
    why = _usable(path)
    if why is not None:
        refuse(f"{why}: it would hold the compiled kernels", field=field, value=str(path))
    import jax
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_S)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _count_loads()
    prune(path)


_loads = {"n": 0, "listening": False}


def _count_loads() -> None:
    """Count the compiles the cache answers (JAX's monitoring event for a persistent-cache hit),
    once per process."""
    if _loads["listening"]:
        return
    from jax import monitoring

    def on_event(event, **_kwargs):
        if event == "/jax/compilation_cache/cache_hits":
            _loads["n"] += 1
    monitoring.register_event_listener(on_event)
    _loads["listening"] = True


def loaded() -> int:
    """Compiles answered from the cache so far in this process (0 while it is off): a command
    reports its compiles with how many of them were loads."""
    return _loads["n"]


def compiles_text(compiles: int, loaded_now: int, noun: str = "compiles") -> str:
    """'11 compiles' or '11 compiles, 9 of them loaded from the compile cache'."""
    return f"{compiles} {noun}" + (f", {loaded_now} of them loaded from the compile cache" if loaded_now else "")


ENTRY_SUFFIXES = ("-cache", "-atime")     # the files JAX's cache writes (jax/_src/lru_cache.py)


def entries(path) -> list:
    """(mtime, bytes, file) of each compiled-kernel file in ``path``: only JAX's cache entries, so
    a folder the user named that also holds other files never has those counted or deleted."""
    out = []
    try:
        listing = list(Path(path).iterdir())
    except OSError:
        return out
    for f in listing:
        if not f.name.endswith(ENTRY_SUFFIXES):
            continue
        try:
            st = f.stat()
        except OSError:
            continue
        if f.is_file():
            out.append((st.st_mtime, st.st_size, f))
    return out


def clear(path) -> tuple[int, int]:
    """Delete every compiled-kernel entry in ``path`` (the folder and anything else in it
    stay): (files deleted, bytes freed)."""
    files, freed = 0, 0
    for _, size, f in entries(path):
        try:
            f.unlink()
        except OSError:
            continue
        files, freed = files + 1, freed + size
    return files, freed


def prune(path: Path, max_bytes: int = MAX_BYTES) -> int:
    """Delete the least recently written entries of ``path`` until the rest hold at most 3/4 of
    ``max_bytes`` (nothing while they hold at most ``max_bytes``). An entry another process is
    reading meanwhile is a cache miss there, never an error. Returns the files deleted."""
    files = entries(path)
    total = sum(size for _, size, _ in files)
    if total <= max_bytes:
        return 0
    deleted = 0
    for _, size, f in sorted(files, key=lambda t: (t[0], str(t[2]))):
        if total <= 0.75 * max_bytes:
            break
        try:
            f.unlink()
        except OSError:
            continue
        total -= size
        deleted += 1
    return deleted


def enable_default(environ=None) -> tuple[Path | None, str | None]:
    """Turn on the command line's cache where ``cache_dir`` says: (the folder in use or None, a
    note for the user or None). A folder the user named that cannot hold it is refused; the
    default one, where it cannot be used, is skipped with a note (the run itself does not need
    it), which the caller prints."""
    path, source = cache_dir(environ)
    if path is None:
        return None, None
    if source != "default":
        enable(path, field=source)
        return path, None
    why = _usable(path) if _loads_safely() else "not used by default: jaxlib before 0.10 on macOS can crash loading it"
    if why is not None:
        return None, (f"no compile cache ({path} {why}); set {ENV} to a writable folder, or to 'off' to "
                      "silence this")
    enable(path, field=source)
    return path, None


def _loads_safely() -> bool:
    """False where loading a cached kernel is known to crash the process: macOS with jaxlib before
    0.10 (SIGBUS in deserialize_executable, uwplasma/vmex#142); there the default is off."""
    import platform
    if platform.system() != "Darwin":
        return True
    try:
        from jaxlib.version import __version__ as version
        return tuple(int(x) for x in version.split(".")[:2]) >= (0, 10)
    except (ImportError, ValueError):
        return False
