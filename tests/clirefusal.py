"""The refusal contract, asserted one way by every test that checks it: for the CLI, exit 2,
nothing on stdout, one line on stderr starting ``jaxprice COMMAND: error:`` and holding every
word; for the library, one JaxpriceError of one line holding every word."""

import pytest

from jaxprice import JaxpriceError, cli


def assert_refused(capsys, argv, *words) -> str:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert rc == 2 and out == "", (rc, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"jaxprice {argv[0]}: error: "), lines[0]
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def refused(call, *words) -> str:
    """``call()`` raises one JaxpriceError, its message one line holding every word."""
    with pytest.raises(JaxpriceError) as info:
        call()
    msg = str(info.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, (w, msg)
    return msg


def share_deployment(monkeypatch, name, dep, modules):
    """Let the CLI commands in ``modules`` reuse one resolved deployment for scenario ``name``
    (their compiled kernels then too): each command's load_scenario_deployment, cached."""
    from jaxprice._src import cli_price
    original = cli_price.load_scenario_deployment

    def cached(scenario, pool=None, args=None):
        flags = ("chip",) + cli_price.LAYOUT_FLAGS       # a layout flag: the loader decides (builds or refuses)
        plain = args is None or all(getattr(args, k, None) is None for k in flags)
        return dep if scenario == name and pool is None and plain else original(scenario, pool, args)
    for mod in modules:
        monkeypatch.setattr(mod, "load_scenario_deployment", cached)


def import_refused(path, field, value, reason) -> str:
    """``import_result(path)`` (a config.json) refused in one line that starts with the file and
    names the field, the value (as repr shows it; None: not checked) and matches ``reason``."""
    import re

    from jaxprice._src.hf import import_result
    with pytest.raises(JaxpriceError) as info:
        import_result(path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(path)), msg
    assert f"field '{field}'" in msg, msg
    if value is not None:
        assert f"value {value!r}" in msg, msg
    assert re.search(reason, msg), msg
    return msg
