"""Output paths are checked before the work: each unwritable place refused in one line."""

import os

import pytest

from jaxprice._src.errors import JaxpriceError
from jaxprice._src.outputs import IMAGE_SUFFIXES, check_output_file, check_output_folder


@pytest.fixture
def place(tmp_path):
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("")
    return tmp_path


def _refused(fn, *args, **kw):
    with pytest.raises(JaxpriceError) as e:
        fn(*args, **kw)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_writable_files_pass_and_create_nothing(place):
    for name in ("x.png", "new/sub/x.png", "afile"):
        suffixes = IMAGE_SUFFIXES if name.endswith(".png") else None
        assert check_output_file(place / name, flag="--plot", suffixes=suffixes) == place / name
    assert sorted(os.listdir(place)) == ["adir", "afile"]       # no probe file, no folder left behind


@pytest.mark.parametrize("name, words", [
    ("adir", "is a folder"),
    ("x.txt", "unsupported image format .txt"),
    ("x", "(no suffix)"),
    ("afile/x.png", "is a file, not a folder"),
    ("", "empty name for the image"),
])
def test_bad_files_refused_naming_flag_and_path(place, name, words):
    path = "" if name == "" else place / name
    msg = _refused(check_output_file, path, flag="--plot", suffixes=IMAGE_SUFFIXES, what="image")
    assert "--plot" in msg and words in msg


def test_a_place_nothing_can_be_created_in_is_refused(place):
    ro = place / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        target = "/proc/x.png" if os.geteuid() == 0 else ro / "x.png"   # root writes anywhere but /proc
        assert "cannot write there" in _refused(check_output_file, target, flag="--plot", suffixes=IMAGE_SUFFIXES)
    finally:
        ro.chmod(0o700)


def test_folders(place):
    assert check_output_folder(place / "adir", flag="--out") == place / "adir"
    assert check_output_folder(place / "new" / "deeper", flag="--out") == place / "new" / "deeper"
    assert not (place / "new").exists()
    assert "is a file, not a folder" in _refused(check_output_folder, place / "afile", flag="--out")
    assert "is a file, not a folder" in _refused(check_output_folder, place / "afile" / "sub", flag="--out")
    assert "empty folder name" in _refused(check_output_folder, "  ", flag="--out")


def test_check_image_is_the_image_rule_or_nothing(place):
    from jaxprice._src.outputs import check_image
    assert check_image(None, "--plot") is None
    assert check_image(place / "x.svg", "--plot") == place / "x.svg"
    assert "unsupported image format .csv" in _refused(check_image, place / "x.csv", "--plot")


@pytest.mark.parametrize("writes, name, other", [
    ("CSV", "grid.png", "an image"), ("CSV", "grid.JSON", "JSON"), ("JSON", "r.yaml", "YAML"),
    ("YAML", "set.json", "JSON"), ("YAML", "set.csv", "CSV"), ("Markdown", "r.svg", "an image"),
])
def test_a_text_output_named_as_another_format_is_refused(place, writes, name, other):
    msg = _refused(check_output_file, place / name, flag="--out", what="x", writes=writes)
    assert f"--out writes {writes}, not {other}" in msg and name in msg
    assert not (place / name).exists()


@pytest.mark.parametrize("writes, name", [
    ("CSV", "grid.csv"), ("CSV", "grid.tsv"), ("CSV", "grid"), ("YAML", "set.yml"), ("YAML", "set.YAML"),
    ("JSON", "r.json"), ("Markdown", "r.md"), ("Markdown", "r.txt"),
])
def test_a_text_output_with_its_own_or_an_unknown_suffix_passes(place, writes, name):
    assert check_output_file(place / name, flag="--out", writes=writes) == place / name


def test_the_commands_refuse_a_text_output_named_as_an_image_before_any_work(tmp_path, capsys):
    from jaxprice.cli import main
    for argv in (["sweep", "deepseek-v3-h200-fp8-sglang-tp8", "--decode", "1", "--context", "64",
                  "--out", str(tmp_path / "g.png")],
                 ["serve", "deepseek-v3-h200-fp8-sglang-tp8", "--isl", "8", "--osl", "2", "--concurrency", "1",
                  "--csv", str(tmp_path / "r.png")],
                 ["size", "deepseek-v3", "--chip", "h200", "--gpus", "8", "--isl", "64", "--osl", "8",
                  "--json", str(tmp_path / "s.yaml")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "writes" in err and "not" in err, err
    assert os.listdir(tmp_path) == []
