"""`jaxprice import-model CONFIG.json`: write a Hugging Face config as a model graph.

    jaxprice import-model testdata/hf/deepseek-ai--DeepSeek-V3 --out deepseek-v3.yaml
    jaxprice import-model config.json --quant-config hf_quant_config.json --out graph.yaml
    jaxprice import-model seed-oss/config.json --as LlamaForCausalLM --out seed-oss.yaml

CONFIG is a config.json or a folder holding one (an hf_quant_config.json beside it is read
too, unless --quant-config names another), or the name or repository id of a bundled one
(testdata/hf: ``jaxprice import-model deepseek-ai/DeepSeek-R1``). The graph is written in the project format
(``format: jaxprice-model/1``) with the config's sha256, its hf_repo and, as comments, what was
inferred (defaults taken, modules left unquantized, what is not priced). Without --out the
graph goes to stdout. A config.json path or folder is also accepted wherever a model graph
is (a scenario's ``model:``), so writing the file is optional.

--as ARCHITECTURE prices a config whose architecture the importer does not read (SmolLM3,
OLMo 2, Seed-OSS: Llama-shaped decoders) as a known architecture's layers, its keys read as
that architecture's are. It is never silent: the graph's notes (and the line import-model prints)
say what it was priced as and list the config keys that family did not read; a config whose
structure the family cannot price (routed experts under a dense family, linear-attention or
state-space layers under an attention-only one, MLA under KV-head attention) is refused. An
architecture the importer reads is read natively: --as naming another one is refused.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def add_parser(sub):
    p = sub.add_parser("import-model", help="write a Hugging Face config.json as a model graph",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("config", metavar="CONFIG.json",
                   help="a config.json, a folder holding one, or a bundled config's model name or repository id")
    p.add_argument("--quant-config", metavar="hf_quant_config.json", default=None,
                   help="the checkpoint's ModelOpt quantization file (default: one beside the config)")
    p.add_argument("--out", metavar="graph.yaml", default=None,
                   help="where to write the graph (default, or -: stdout)")
    p.add_argument("--name", default=None, help="the graph's name (default: the bundled name or the repo's)")
    p.add_argument("--hf-repo", default=None, help="the Hugging Face repository (default: from the path)")
    p.add_argument("--as", dest="as_architecture", metavar="ARCHITECTURE", default=None,
                   help="price an architecture the importer does not read as this known one's layers "
                        "(e.g. LlamaForCausalLM); the notes say so and list the keys it did not read")
    return p


def _refuse_out_onto_input(args) -> None:
    """--out naming the config.json (or the quantization file) being imported: the graph would overwrite it."""
    from .errors import refuse
    out = Path(args.out).expanduser().resolve()
    config = Path(args.config).expanduser()
    given = [config / "config.json" if config.is_dir() else config]
    if args.quant_config is not None:
        given.append(Path(args.quant_config).expanduser())
    elif config.exists():
        given.append((config if config.is_dir() else config.parent) / "hf_quant_config.json")
    for path in given:
        if path.exists() and out == path.resolve():
            refuse(f"is the config being imported ({path}); name another file for the graph", field="--out",
                   value=args.out)


def run(args) -> int:
    from .errors import refuse
    from .hf import graph_from_doc, graph_yaml, import_result
    from .outputs import check_output_file
    if not args.config.strip():         # "" would be read as the current folder
        refuse("an empty name; give a config.json, a folder holding one or a bundled config's name",
               field="CONFIG.json", value=args.config, has_value=True)
    for flag, value in (("--name", args.name), ("--hf-repo", args.hf_repo)):
        if value is not None and not value.strip():
            refuse(f"an empty {flag[2:].replace('-', ' ')}; leave {flag} out for the default", field=flag,
                   value=value, has_value=True)
    if args.hf_repo is not None and not _REPO_ID.fullmatch(args.hf_repo.strip()):
        # written into the graph and into size's `vllm serve REPO` line, where 'a b/c' cannot be fetched
        refuse("not a Hugging Face repository id (owner/name, or name: letters, digits, '-', '_', '.')",
               field="--hf-repo", value=args.hf_repo)
    as_arch = getattr(args, "as_architecture", None)
    if as_arch is not None:
        from .hf import check_as_architecture
        check_as_architecture(as_arch, field="--as")
    if args.out == "-":                 # stdout, as `jaxprice sweep --out -` (not a file named "-")
        args.out = None
    if args.out is not None:
        _refuse_out_onto_input(args)        # before the suffix check: "--out writes YAML, not JSON" missed the point
        check_output_file(args.out, flag="--out", what="model graph", writes="YAML")
    from .hf import bundled_config
    bundled = None if Path(args.config).exists() else bundled_config(args.config)   # a bundled one by name
    config = bundled or args.config
    res = import_result(config, args.quant_config, name=args.name, hf_repo=args.hf_repo, as_architecture=as_arch)
    graph = graph_from_doc(res.doc, res.config_path)          # validated as a graph file is
    text = graph_yaml(res)
    if res.priced_as is not None:       # said on the terminal as well as in the graph's comments
        for note in res.inferred[:2]:
            print(f"note: {note}", file=sys.stderr)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    out = Path(args.out)
    for given in (res.config_path, res.quant_path):      # would overwrite the input with YAML
        if given is not None and out.resolve() == Path(given).resolve():
            refuse(f"is the config being imported ({given}); name another file for the graph", field="--out",
                   value=args.out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except OSError as err:
        refuse(f"cannot write the graph ({err.strerror})", file=str(out))
    layers = len(graph.expanded_stack())
    cache = f", {graph.kv_cache_dtype} KV cache (calibrated)" if graph.kv_cache_dtype else ""
    arch = res.architecture if res.priced_as is None else f"{res.architecture} priced as {res.priced_as}"
    print(f"{out}: {graph.name} ({arch}, {layers} layers, {weights_summary(graph)}{cache}); "
          f"{len(res.inferred)} inferred notes as comments", file=sys.stderr)
    return 0


def weights_summary(graph) -> str:
    """The weight formats of a ModelGraph in words: its weight_dtype is the format of most non-expert
    weights (the default of every node that states none), so an NVFP4 checkpoint that keeps attention
    at bf16 reads 'weights nvfp4 for experts; bf16 for the rest', not 'weights bf16'."""
    from .layouts import held_formats
    held = held_formats(graph, graph.weight_dtype)
    return f"weights {held}; {graph.weight_dtype} for the rest" if held else f"weights {graph.weight_dtype}"
