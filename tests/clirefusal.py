"""The CLI's refusal contract, asserted one way by every test that checks it: exit 2, nothing
on stdout, one line on stderr starting ``jaxprice COMMAND: error:`` and holding every word."""

from jaxprice import cli


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
