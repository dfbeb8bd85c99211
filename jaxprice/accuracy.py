"""jaxprice.accuracy: predicted mean TPOT against measured serving latencies.

``evaluate_accuracy(csv)`` reads a measurement CSV in the layout of
``shared/measured/inferencex_vllm_dev.csv``, builds each point's deployment (its bundled scenario,
else from the columns), prices every mean-TPOT point by the anchor kernel's rule (a batch of C
decoding requests at context isl + osl // 2, decode threshold 8; TPOT = step estimate +
host_output_token; or, with ``batch_rule='capped'`` or ``'interleaved'``, the engine's resident
batch and the prefill chunks that keep it full: ``point_requests``) with one vmapped call per
deployment, and scores shape error and absolute
TPOT error per model and overall, for NoOverlap and Overlap. ``format_report``,
``write_points_csv`` and ``plot_sweeps`` present the ``AccuracyReport``. With
``batch_rule='simulate'`` each point's mean TPOT and mean TTFT come from the serving simulation
(``simulate_points``) with the engine settings of the published InferenceX recipe
(``engine_assumptions``; a point measured with speculative decoding with its recipe's draft
count, ``IX_SPEC_RECIPES``, and an assumed acceptance: ``speculation_assumptions``); the lower-level steps
(``read_measurements``, ``group_points``, ``predict_groups``, ``score``) let a fit reuse the same
points and batches. The command line is ``jaxprice accuracy``.

``evaluate_accuracy``, ``AccuracyReport`` and ``read_measurements`` are also exported from
``jaxprice`` itself.
"""

from jaxprice._src.accuracy import (BATCH_RULES, DECODE_THRESHOLD, ESTIMATES, AccuracyReport, DeploymentPoints,
                                    Point, build_deployment, check_batch_rule, evaluate_accuracy, format_report,
                                    group_points, host_output_token, kv_capacity_tokens, padding, plot_sweeps,
                                    point_requests, predict_groups, prefill_chunks, read_measurements,
                                    resident_batch, scenario_from_columns, score, shape_errors, summarize,
                                    upper_median, write_points_csv)
from jaxprice._src.accuracy import (CONCURRENCY_BUCKETS, IX_RECIPES, STATIC_BATCH_RULES, SimulatedPoints,
                                    assumptions_text, concurrency_bucket, engine_assumptions, format_assumptions,
                                    format_breakdowns, gpus_of, rank_tp, recipe_deployment, repeat_spread,
                                    simulate_points)
from jaxprice._src.accuracy import STATED_FIELDS, STATED_SOURCE, stated_settings
from jaxprice._src.accuracy import IX_SPEC_RECIPES, SPEC_FIELDS, check_speculation_inputs, speculation_assumptions
from jaxprice._src.accuracy import with_registry
from jaxprice._src.ix_recipes import IX_ENGINE_RECIPES

__all__ = [
    "BATCH_RULES", "DECODE_THRESHOLD", "ESTIMATES",
    "AccuracyReport", "DeploymentPoints", "Point",
    "evaluate_accuracy", "read_measurements", "build_deployment", "scenario_from_columns",
    "group_points", "padding", "predict_groups", "host_output_token", "score",
    "check_batch_rule", "point_requests", "resident_batch", "kv_capacity_tokens", "prefill_chunks",
    "shape_errors", "summarize", "upper_median",
    "format_report", "write_points_csv", "plot_sweeps",
    "STATIC_BATCH_RULES", "CONCURRENCY_BUCKETS", "IX_RECIPES", "SimulatedPoints", "engine_assumptions",
    "assumptions_text", "recipe_deployment", "simulate_points", "concurrency_bucket", "format_breakdowns",
    "format_assumptions", "rank_tp", "gpus_of", "repeat_spread",
    "STATED_FIELDS", "STATED_SOURCE", "stated_settings",
    "IX_SPEC_RECIPES", "SPEC_FIELDS", "speculation_assumptions", "check_speculation_inputs",
    "IX_ENGINE_RECIPES", "with_registry",
]
