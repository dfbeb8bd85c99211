"""The command line's on-disk compile cache (jaxprice/_src/compile_cache.py): where it lives,
how it is turned off, refused or skipped, pruned, and that a command run with it writes its
kernels there and prints what it prints without it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxprice._src import compile_cache as cc
from jaxprice.cli import main

SCENARIO = "gpt-oss-120b-h100-fp4-vllm-tp2"
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("env,expected,source", [
    ({"JAXPRICE_CACHE_DIR": "off", "JAX_COMPILATION_CACHE_DIR": "/j"}, None, "JAXPRICE_CACHE_DIR"),
    ({"JAXPRICE_CACHE_DIR": ""}, None, "JAXPRICE_CACHE_DIR"),
    ({"JAXPRICE_CACHE_DIR": " OFF "}, None, "JAXPRICE_CACHE_DIR"),
    ({"JAXPRICE_CACHE_DIR": "/c/k", "JAX_COMPILATION_CACHE_DIR": "/j"}, "/c/k", "JAXPRICE_CACHE_DIR"),
    ({"JAX_COMPILATION_CACHE_DIR": "/j", "XDG_CACHE_HOME": "/x"}, "/j", "JAX_COMPILATION_CACHE_DIR"),
    ({"XDG_CACHE_HOME": "/x", "HOME": "/h"}, f"/x/jaxprice/xla/{cc.host_tag()}", "default"),
    ({"XDG_CACHE_HOME": "", "HOME": "/h"}, f"/h/.cache/jaxprice/xla/{cc.host_tag()}", "default"),
])
def test_the_folder_comes_from_the_environment_in_order(env, expected, source):
    path, where = cc.cache_dir(env)
    assert (None if path is None else str(path)) == expected
    assert where == source


def test_a_named_folder_that_cannot_hold_it_is_refused_in_one_line(capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    os.environ["JAXPRICE_CACHE_DIR"] = str(afile)
    try:
        code = main(["price", SCENARIO, "--decode", "1"])
    finally:
        os.environ["JAXPRICE_CACHE_DIR"] = "off"
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "JAXPRICE_CACHE_DIR" in err and "is a file, not a folder" in err and str(afile) in err


def test_an_unusable_default_folder_is_skipped_with_a_note(capsys, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.write_text("not a folder")                       # so HOME/.cache cannot be created
    monkeypatch.setattr(cc, "enable", lambda *a, **k: pytest.fail("enabled an unusable folder"))
    folder, note = cc.enable_default({"HOME": str(home)})
    assert folder is None and "no compile cache" in note and "JAXPRICE_CACHE_DIR" in note and "\n" not in note
    # the command prints it in one line and goes on (here to refuse a scenario, compiling nothing)
    for var in ("JAXPRICE_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(home))
    assert main(["price", "no-such-scenario", "--decode", "1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith("jaxprice: note: no compile cache") and "no-such-scenario" in err[1]


def test_a_usable_default_folder_is_created_and_enabled(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(cc, "enable", lambda path, field: calls.append((Path(path), field)))
    folder = tmp_path / "jaxprice" / "xla" / cc.host_tag()
    assert cc.enable_default({"XDG_CACHE_HOME": str(tmp_path)}) == (folder, None)
    assert calls == [(folder, "default")]
    assert folder.is_dir()


def test_the_host_tag_names_the_platform_and_jaxlib_and_is_stable():
    import platform
    from jaxlib.version import __version__
    tag = cc.host_tag()
    assert tag == cc.host_tag()
    assert tag.startswith(f"{platform.system().lower()}-{platform.machine().lower()}-jaxlib{__version__}-")


def test_the_default_stays_off_where_loading_is_known_to_crash(tmp_path, monkeypatch):
    import platform
    import jaxlib.version
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    monkeypatch.setattr(jaxlib.version, "__version__", "0.9.2")
    monkeypatch.setattr(cc, "enable", lambda *a, **k: pytest.fail("enabled where loading crashes"))
    folder, note = cc.enable_default({"XDG_CACHE_HOME": str(tmp_path)})
    assert folder is None and "jaxlib before 0.10 on macOS" in note
    monkeypatch.setattr(jaxlib.version, "__version__", "0.10.2")
    calls = []
    monkeypatch.setattr(cc, "enable", lambda path, field: calls.append(field))
    assert cc.enable_default({"XDG_CACHE_HOME": str(tmp_path)})[0] is not None and calls == ["default"]


def test_prune_deletes_the_oldest_entries_down_to_three_quarters_and_nothing_else(tmp_path):
    for i in range(10):                                   # 10 entries of 100 bytes, entry 0 the oldest
        f = tmp_path / f"jit_f-{i}-cache"
        f.write_bytes(b"x" * 100)
        os.utime(f, (1000 + i, 1000 + i))
    mine = tmp_path / "notes.txt"                         # not JAX's: never counted nor deleted
    mine.write_bytes(b"y" * 5000)
    os.utime(mine, (1, 1))
    assert cc.prune(tmp_path, max_bytes=1000) == 0        # at the limit: nothing
    assert cc.prune(tmp_path, max_bytes=800) == 4         # 1000 -> 600 <= 0.75 x 800
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"jit_f-{i}-cache" for i in range(4, 10)] + ["notes.txt"]
    assert cc.clear(tmp_path) == (6, 600)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_compiles_text_says_how_many_were_loads():
    assert cc.compiles_text(11, 0) == "11 compiles"
    assert cc.compiles_text(11, 9) == "11 compiles, 9 of them loaded from the compile cache"


def test_a_command_keeps_its_kernels_there_loads_them_again_and_prints_the_same(capsys, tmp_path):
    argv = ["sweep", SCENARIO, "--decode", "1,4", "--context", "2048", "--quiet"]
    assert main(argv) == 0                                # in process, cache off (conftest)
    expected = capsys.readouterr().out
    env = dict(os.environ, JAXPRICE_CACHE_DIR=str(tmp_path / "xla"))
    runs = [subprocess.run([sys.executable, "-m", "jaxprice", *argv], capture_output=True, text=True, env=env,
                           cwd=ROOT, timeout=300) for _ in range(2)]
    for out in runs:
        assert out.returncode == 0, out.stderr
        assert out.stdout == expected                     # the same numbers, compiled or loaded
    assert any(p.name.startswith("jit_") for p in (tmp_path / "xla").iterdir())
    assert "loaded from the compile cache" not in runs[0].stderr
    assert "1 kernel compile(s), 1 of them loaded from the compile cache" in runs[1].stderr


def test_the_cache_command_shows_and_clears_only_the_kernels(capsys, tmp_path, monkeypatch):
    import json
    for i in range(3):
        (tmp_path / f"jit_f-{i}-cache").write_bytes(b"x" * 1000)
    (tmp_path / "mine.txt").write_text("kept")
    monkeypatch.setenv("JAXPRICE_CACHE_DIR", str(tmp_path))
    assert main(["cache", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["folder"] == str(tmp_path) and shown["source"] == "JAXPRICE_CACHE_DIR"
    assert (shown["entries"], shown["bytes"]) == (3, 3000)
    assert main(["cache", "--clear"]) == 0
    out = capsys.readouterr().out
    assert "0 file(s)" in out and "cleared 3 file(s)" in out
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]
    monkeypatch.setenv("JAXPRICE_CACHE_DIR", "off")
    assert main(["cache", "--clear"]) == 0 and "compile cache off" in capsys.readouterr().out
