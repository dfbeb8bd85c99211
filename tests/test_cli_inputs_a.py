"""Bad command-line input found by fuzzing price, sweep, serve and optimize: each is refused in ONE
line naming the flag (or file) and the value, exit status 2, before any pricing or simulation runs
(output paths, size caps, seeds, trace files, flag combinations, argparse usage errors).

Every case here is refused before the kernel runs; the deployment is loaded once per module.
"""

from __future__ import annotations

import pytest
from clirefusal import assert_refused, share_deployment

import jaxprice as jp
from jaxprice import cli
from jaxprice._src import cli_optimize, cli_price, cli_serve, cli_sweep
from jaxprice._src.client import MAX_RUN_REQUESTS, MAX_SEED, OpenLoop, Workload, load_trace

S = "deepseek-v3-h200-fp8-sglang-tp8"


@pytest.fixture(scope="module")
def dep():
    return jp.load_deployment(S)


@pytest.fixture(autouse=True)
def shared_deployment(monkeypatch, dep):
    share_deployment(monkeypatch, S, dep, (cli_price, cli_sweep, cli_serve, cli_optimize))


def files(tmp_path):
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile.csv").write_text("")
    head = "arrival_s,input_len,output_len\n"
    for name, text in {"long.csv": head + "0,64,16\n1,64,16,5\n",
                       "extra.csv": "arrival_s,input_len,output_len,user\n0,64,16,a\n",
                       "unsorted.csv": head + "1.0,64,16\n0.5,64,16\n",
                       "ok.csv": head + "0,64,16\n0.5,64,16\n"}.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def refused(capsys, tmp_path, argv, *words):
    """Run the CLI in tmp_path's fixture files ({d}); assert the one-line refusal (clirefusal)."""
    d = files(tmp_path)
    return assert_refused(capsys, [a.format(d=d) for a in argv], *words)


OUTPUTS = [
    (("price", S, "--decode", "1", "--plot", "/proc/x.png"), ("'--plot'", "/proc/x.png", "cannot write")),
    (("price", S, "--decode", "1", "--plot", "{d}/x.txt"), ("'--plot'", "x.txt", "unsupported image format")),
    (("price", S, "--decode", "1", "--plot", "{d}/adir"), ("'--plot'", "adir", "is a folder")),
    (("sweep", S, "--heatmap", "{d}/adir"), ("'--heatmap'", "adir", "is a folder")),
    (("sweep", S, "--heatmap", "{d}/h.txt"), ("'--heatmap'", "unsupported image format")),
    (("sweep", S, "--out", "{d}/adir"), ("'--out'", "adir", "is a folder")),
    (("sweep", S, "--out", "{d}/afile.csv/x.csv"), ("'--out'", "afile.csv is a file")),
    (("serve", S, "--plot", "{d}/adir"), ("'--plot'", "is a folder")),
    (("serve", S, "--timeline", "{d}/t.txt"), ("'--timeline'", "unsupported image format")),
    (("serve", S, "--timeline", "/proc/t.png"), ("'--timeline'", "cannot write")),
    (("serve", S, "--csv", "{d}/adir"), ("'--csv'", "is a folder; name the CSV file")),
    (("serve", S, "--csv", "/proc/x.csv"), ("'--csv'", "/proc/x.csv", "cannot write")),
    (("serve", S, "--csv", "{d}/afile.csv/x.csv"), ("'--csv'", "afile.csv is a file")),
]


@pytest.mark.parametrize("argv,words", OUTPUTS, ids=[" ".join(a[2:]) for a, _ in OUTPUTS])
def test_output_paths_checked_before_the_work(capsys, tmp_path, argv, words):
    refused(capsys, tmp_path, argv, *words)
    assert not (tmp_path / "adir.png").exists()


SIZES = [
    (("serve", S, "--concurrency", "100000000"), ("'--concurrency'", "100000000", "at most")),
    (("serve", S, "--concurrency", "1,100000000"), ("'--concurrency'", "at most")),
    (("serve", S, "--num-prompts", "1000000000", "--concurrency", "1"), ("'--num-prompts'", str(MAX_RUN_REQUESTS))),
    (("serve", S, "--num-prompts", "1000000000", "--rate", "1"), ("'--num-prompts'", str(MAX_RUN_REQUESTS))),
    (("price", S, "--ignore-limits", "--decode", "1000000000"), ("'--decode'", "1000000000", "1048576")),
    (("price", S, "--ignore-limits", "--decode", "1,2,...,100000"), ("'--decode'", "cap of 4194304 rows")),
    (("optimize", S, "--itl-ms", "50", "--iterations", "100000000"), ("'--iterations'", "at most 20000")),
    (("optimize", S, "--itl-ms", "50", "--restarts", "100000000"), ("'--restarts'", "at most 1024")),
    (("sweep", S, "--ignore-limits", "--decode", "1,2,...,3000", "--context", "1,2,...,3000"),
     ("3000 x 3000 x 1 = 9000000 points", "cap of 4194304")),
    (("sweep", S, "--ignore-limits", "--decode", "2000000", "--context", "10"), ("'--decode'", "2000000", "1048576")),
]


@pytest.mark.parametrize("argv,words", SIZES, ids=[" ".join(a[2:]) for a, _ in SIZES])
def test_sizes_past_the_caps_are_refused_stating_the_cap(capsys, tmp_path, argv, words):
    refused(capsys, tmp_path, argv, *words)


SERVE = [
    (("--seed", "99999999999999999999"), ("'--seed'", "99999999999999999999", str(MAX_SEED))),
    (("--seed", str(MAX_SEED + 1)), ("'--seed'", str(MAX_SEED))),
    (("--seed", "-1"), ("'--seed', value -1", f"[0, {MAX_SEED}]")),
    (("--concurrency", ""), ("'--concurrency'", "value ''", "list of integers")),
    (("--rate", ""), ("'--rate'", "value ''")),
    (("--rate", "-1"), ("'--rate'", "value -1", "> 0")),
    (("--rate", "0"), ("'--rate'", "value 0", "> 0")),
    (("--trace", "{d}/long.csv"), ("long.csv:3", "'row'", "1,64,16,5", "extra value '5'")),
    (("--trace", "{d}/extra.csv"), ("extra.csv:1", "'header'", "unknown column 'user'")),
    (("--trace", "{d}/unsorted.csv"), ("unsorted.csv:3", "'arrival_s'", "'0.5'", "must not decrease", "refused")),
    (("--trace", "{d}/adir"), ("adir", "is a folder, not a trace file")),
    (("--trace", "{d}/ok.csv", "--isl", "64"), ("'--isl'", "cannot be combined with --trace")),
    (("--trace", "{d}/ok.csv", "--osl", "16"), ("'--osl'", "cannot be combined with --trace")),
    (("--trace", "{d}/ok.csv", "--range-ratio", "1"), ("'--range-ratio'", "cannot be combined with --trace")),
    (("--trace", "{d}/ok.csv", "--num-prompts", "5"), ("'--num-prompts'", "cannot be combined with --trace")),
    (("--trace", "{d}/ok.csv", "--seed", "5"), ("'--seed'", "cannot be combined with --trace")),
]


@pytest.mark.parametrize("argv,words", SERVE, ids=[" ".join(a) for a, _ in SERVE])
def test_serve_refusals(capsys, tmp_path, argv, words):
    refused(capsys, tmp_path, ("serve", S) + argv, *words)


OPTIMIZE = [
    (("--prefill-budget", "99999999"), ("'--prefill-budget', value 99999999", "max_model_len")),
    (("--prefix", "99999999"), ("'--prefix', value 99999999", "max_model_len")),
    (("--temperature", "-1"), ("'--temperature'", "> 0")),
    (("--temperature", "0"), ("'--temperature'", "> 0")),
    (("--tokens-per-decode", "nan"), ("'--tokens-per-decode'", "value nan", "> 0")),
    (("--tokens-per-decode", "0"), ("'--tokens-per-decode'", "> 0")),
    (("--itl-ms", "nan"), ("'--itl-ms', value nan", "> 0")),
]


@pytest.mark.parametrize("argv,words", OPTIMIZE, ids=[" ".join(a) for a, _ in OPTIMIZE])
def test_optimize_refusals_name_the_right_flag_and_limit(capsys, tmp_path, argv, words):
    line = refused(capsys, tmp_path, ("optimize", S, "--itl-ms", "50") + argv, *words)
    assert ">= 0" not in line


USAGE = [
    ((), "jaxprice: error: the following arguments are required: COMMAND (see jaxprice --help)"),
    (("nosuch",), "jaxprice: error: argument COMMAND: invalid choice: 'nosuch'"),
    (("price",), "jaxprice price: error: the following arguments are required: SCENARIO "
                 "(see jaxprice price --help)"),
    (("price", "a", "b"), "jaxprice price: error: unrecognized arguments: b (see jaxprice price --help)"),
    (("serve", S, "--scheduler", "foo"), "jaxprice serve: error: argument --scheduler: invalid choice: 'foo'"),
    (("price", S, "--nosuchflag"), "jaxprice price: error: unrecognized arguments: --nosuchflag"),
]


@pytest.mark.parametrize("argv,want", USAGE, ids=[" ".join(a) or "(none)" for a, _ in USAGE])
def test_usage_errors_are_one_line(capsys, argv, want):
    with pytest.raises(SystemExit) as exc:
        cli.main(list(argv))
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(want), err


@pytest.mark.parametrize("argv", [("--help",), ("price", "--help")])
def test_help_is_still_the_full_help(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        cli.main(list(argv))
    out, _ = capsys.readouterr()
    assert exc.value.code == 0
    assert out.startswith("usage: jaxprice") and len(out.splitlines()) > 5


def test_seeds_wrap_and_are_bounded():
    # seed + 7919 (the arrivals' stream) wraps into RandomState's range instead of raising
    assert OpenLoop(rate=1.0, num_prompts=3, seed=MAX_SEED).arrivals().shape == (3,)
    for bad in (-1, MAX_SEED + 1):
        with pytest.raises(jp.JaxpriceError, match="seed"):
            OpenLoop(rate=1.0, num_prompts=3, seed=bad).arrivals()
        with pytest.raises(jp.JaxpriceError, match="seed"):
            Workload(64, 16, 0.5, seed=bad).lengths(2)


def test_load_trace_accepts_sorted_and_equal_arrivals(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,input_len,output_len\n0,64,16\n0,32,8\n0.5,64,16\n")
    tr = load_trace(p)
    assert tr.arrival_s == (0.0, 0.0, 0.5) and tr.input_len == (64, 32, 64)


def test_figures_save_refuses_in_one_line(tmp_path, monkeypatch):
    """The library API: a folder, a bad suffix or a failing savefig is a JaxpriceError, not a
    matplotlib or OS traceback (and no "adir.png" is written beside a folder "adir")."""
    from jaxprice._src.figures import _pyplot, _save
    plt = _pyplot()
    (tmp_path / "adir").mkdir()
    for path, words in ((tmp_path / "adir", "is a folder"), (tmp_path / "x.txt", "unsupported image format")):
        fig = plt.figure()
        with pytest.raises(jp.JaxpriceError, match=words):
            _save(fig, path, False, 50)
    assert not (tmp_path / "adir.png").exists()
    fig = plt.figure()

    def full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(fig, "savefig", full)
    with pytest.raises(jp.JaxpriceError, match="cannot write the figure: No space left on device") as exc:
        _save(fig, tmp_path / "ok.png", False, 50)
    assert "\n" not in str(exc.value)


def test_sweep_lowers_chunk_past_the_rows_per_call_cap(capsys, tmp_path, monkeypatch):
    """Points per call x rows per step above MAX_CALL_ROWS: --chunk is lowered, said on stderr,
    and the grid is still complete (a tiny cap stands in for 2**22 rows)."""
    monkeypatch.setattr(cli_sweep, "MAX_CALL_ROWS", 16)
    out = tmp_path / "sub" / "g.csv"          # a missing folder is created
    rc = cli.main(["sweep", S, "--decode", "4,8", "--context", "512,1024", "--quiet", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 0 and "--chunk lowered to 2 grid points per call: steps of 8 rows" in err
    assert len(out.read_text().splitlines()) == 1 + 4


def test_trace_past_the_request_cap_is_refused(tmp_path, monkeypatch):
    from jaxprice._src import client
    monkeypatch.setattr(client, "MAX_RUN_REQUESTS", 2)
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,input_len,output_len\n0,64,16\n1,64,16\n2,64,16\n")
    with pytest.raises(jp.JaxpriceError, match=r"t.csv:4.*more than 2 requests"):
        load_trace(p)


def two_pools(tmp_path):
    """The base scenario split into a prefill pool (tp8) and a decode pool (tp4)."""
    import copy

    import yaml
    scen, dep = yaml.safe_load_all(jp.scenario_path(S).read_text())
    second = copy.deepcopy(dep["pools"][0])
    second["role"], second["parallel"]["tp"] = "decode", 4
    dep["pools"][0]["role"] = "prefill"
    dep["pools"].append(second)
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump_all([scen, dep], sort_keys=False))
    return str(path)


@pytest.mark.parametrize("argv", [("price", "--decode", "1"), ("sweep",), ("optimize", "--itl-ms", "50"),
                                  ("serve",)])
def test_every_command_that_prices_a_scenario_takes_pool(capsys, tmp_path, argv):
    """A two-pool scenario is refused naming --pool; --pool past the pools or not a number is refused
    naming it (each command passes --pool to the loader: without it the refusal would be the first)."""
    path = two_pools(tmp_path)
    cmd, rest = argv[0], list(argv[1:])
    assert_refused(capsys, [cmd, path, *rest], "COVERAGE LIMIT [one-pool]", "2 pools (prefill, decode)",
                   "--pool 0..1")
    assert_refused(capsys, [cmd, path, "--pool", "2", *rest], "pool index out of range", "Deployment.pools", "2")
    assert_refused(capsys, [cmd, path, "--pool", "-1", *rest], "'--pool'", "-1")
    assert_refused(capsys, [cmd, path, "--pool", "one", *rest], "'--pool'", "one", "expected an integer")


def test_pool_picks_the_pool(tmp_path):
    path = two_pools(tmp_path)
    decode = cli_price.load_scenario_deployment(path, "1")
    assert decode.resolution["tp"] == 4 and decode.scenario.pool_index == 1
    prefill = cli_price.load_scenario_deployment(path, "0")
    assert prefill.resolution["tp"] == 8
    assert decode.resolution == jp.load_deployment(path, pool_index=1).resolution
    assert "(pool 1 of 2, decode), tp4" in cli_price.describe_deployment(decode)
    assert "pool" not in cli_price.describe_deployment(jp.load_deployment(S))


MODEL = "llama-3.1-8b-instruct"


@pytest.mark.parametrize("argv,words", [
    (("price", S, "--tp", "2", "--decode", "1"), ("'--tp'", "needs --chip")),
    (("serve", S, "--weights", "fp8"), ("'--weights'", "needs --chip")),
    (("price", MODEL, "--chip", "h999", "--decode", "1"), ("'--chip'", "h999", "unknown chip")),
    (("serve", MODEL, "--chip", "h200", "--weights", "nvfp4"),
     ("'--weights'", "nvfp4", "not a format vLLM serves llama-3.1-8b-instruct in on h200", "bf16, fp8")),
    (("sweep", MODEL, "--chip", "h200", "--tp", "16"), ("'--tp'", "spans 2 nodes of 8 GPUs", "--fabric")),
    (("optimize", MODEL, "--chip", "h200", "--tp", "0", "--itl-ms", "50"), ("'--tp'", "at least 1")),
    (("serve", MODEL, "--chip", "h200", "--pool", "1"), ("'--pool'", "one pool")),
    (("price", MODEL, "--chip", "h200", "--fabric", "x", "--decode", "1"), ("'--fabric'", "unknown fabric")),
    (("price", "no-such-model", "--chip", "h200", "--decode", "1"), ("'model'", "no bundled config.json")),
    (("price", MODEL, "--chip", "h200", "--weights", "", "--decode", "1"), ("'--weights'", "not a format")),
    (("price", MODEL, "--chip", "h200", "--tp", "", "--decode", "1"), ("'--tp'", "expected an integer")),
    (("price", MODEL, "--chip", "h200", "--ep", "--tp", "2", "--decode", "1"), ("'--ep'", "has no MoE layer")),
    (("price", "gpt-oss-120b", "--chip", "h200", "--ep", "--decode", "1"), ("'--ep'", "over one GPU")),
])
def test_a_deployment_from_a_model_refuses_bad_layouts(capsys, tmp_path, argv, words):
    refused(capsys, tmp_path, argv, *words)


def test_a_model_and_a_chip_build_the_deployment_a_scenario_states():
    """--chip reads SCENARIO as a model and builds the deployment as size builds a candidate: the
    same weights and KV cache per GPU as the bundled scenario of that layout (Llama-3.1-70B, fp8,
    tp2 on H200, fp8 cache); the engine settings size searches are left to vLLM's defaults."""
    dep = cli_price.load_scenario_deployment("llama-3.1-70b-instruct", None,
                                             dict_args(chip="h200", tp="2", weights="fp8"))
    assert (dep.resolution["tp"], dep.resolution["dp"]) == (2, 1) and dep.resolution["served_dtype"] == "fp8"
    assert dep.scenario.name == "llama-3.1-70b-instruct-h200-fp8-tp2" and dep.scenario.engine["cache_dtype"] == "fp8"
    assert not {"max_num_seqs", "max_num_batched_tokens", "max_model_len", "cudagraph_mode"} & set(dep.scenario.engine)
    bundled = jp.load_deployment("llama-3.1-70b-instruct-h200-fp8-vllm-tp2")
    for k in ("weights_bytes", "kv_bytes_per_token"):
        assert dep.plan.memory[k] == bundled.plan.memory[k], k
    bf16 = cli_price.load_scenario_deployment(MODEL, None, dict_args(chip="h200"))
    assert bf16.resolution["served_dtype"] == "bf16" and bf16.scenario.engine["cache_dtype"] == "auto"


def dict_args(**kw):
    import argparse
    base = dict(chip=None, tp=None, dp=None, ep=None, weights=None, gpus_per_node=None, fabric=None)
    return argparse.Namespace(**{**base, **kw})
