"""jaxprice: a differentiable cost model, in JAX, for one forward pass of an LLM serving engine.

Data flow: load (formats, hf) -> resolve (deployment -> Plan, in NumPy) -> price (jitted laws and
composition; stack: many deployments of one structure on one vmapped axis) -> serve (the
benchmark client and the engine's scheduler simulated, every step priced) -> fit / search /
size / sweep / accuracy. Importing jaxprice enables float64 in JAX: prices are compared to the
discrete model to the last digit.
"""

import jax as _jax

_jax.config.update("jax_enable_x64", True)

from jaxprice._src.accuracy import AccuracyReport, evaluate_accuracy, read_measurements
from jaxprice._src.batchfile import DEFAULT_DECODE_THRESHOLD, load_batch
from jaxprice._src.benchfile import BenchImport, import_bench
from jaxprice._src.errors import JaxpriceError
from jaxprice._src.figures import plot_step_curve, plot_sweep_heatmaps
from jaxprice._src.fit import (FitResult, Free, LawFit, Observations, fit_coefficients, fit_law,
                               observations_from_measurements, read_step_measurements, split_by_deployment,
                               write_coefficient_set)
from jaxprice._src.formats import (Registry, load_coefficient_set, load_model_graph, load_scenario)
from jaxprice._src.hf import import_hf_config
from jaxprice._src.plan import RESOURCES, Batch, Coefficients, Plan
from jaxprice._src.resolve import Deployment, load_deployment, resolve, scenario_path
from jaxprice._src.search import (Composition, GridResult, OptimizeResult, grid_search,
                                 optimize_batch)
from jaxprice._src.size import SizeResult, size
from jaxprice._src.step import StepResult, price, price_many, step_time
from jaxprice._src.client import ClosedLoop, OpenLoop, Trace, Workload, load_trace
from jaxprice._src.serve import (Schedule, ServingResult, build_schedule, schedule_metrics, simulate,
                                 simulate_sweep)
from jaxprice._src.sweep import (batch_mesh, price_coefficient_sets, price_sharded, random_batches,
                                stack_coefficients)
from jaxprice._src.stack import (PlanStack, Structure, group_by_structure, kernel_compiles, price_deployments,
                                price_plans, stack_plans, structure_of)
from jaxprice._src.stack import stack_coefficients as stack_deployment_coefficients

__all__ = [
    "JaxpriceError",
    "accuracy",
    "evaluate_accuracy",
    "AccuracyReport",
    "read_measurements",
    "import_bench",
    "BenchImport",
    "fit",
    "Free",
    "Observations",
    "FitResult",
    "LawFit",
    "fit_coefficients",
    "fit_law",
    "write_coefficient_set",
    "split_by_deployment",
    "observations_from_measurements",
    "read_step_measurements",
    "Registry",
    "load_coefficient_set",
    "load_model_graph",
    "import_hf_config",
    "load_scenario",
    "RESOURCES",
    "Batch",
    "Coefficients",
    "Plan",
    "Deployment",
    "load_deployment",
    "resolve",
    "scenario_path",
    "StepResult",
    "Workload",
    "ClosedLoop",
    "OpenLoop",
    "Trace",
    "load_trace",
    "simulate",
    "simulate_sweep",
    "ServingResult",
    "Schedule",
    "build_schedule",
    "schedule_metrics",
    "price",
    "price_many",
    "step_time",
    "batch_mesh",
    "price_coefficient_sets",
    "price_sharded",
    "random_batches",
    "stack_coefficients",
    "PlanStack",
    "Structure",
    "stack_plans",
    "structure_of",
    "group_by_structure",
    "price_deployments",
    "price_plans",
    "stack_deployment_coefficients",
    "kernel_compiles",
    "DEFAULT_DECODE_THRESHOLD",
    "load_batch",
    "plot_step_curve",
    "plot_sweep_heatmaps",
    "optimize_batch",
    "grid_search",
    "OptimizeResult",
    "GridResult",
    "Composition",
    "size",
    "SizeResult",
]

from jaxprice import fit  # noqa: E402  (public module: jaxprice.fit, re-exporting the names above)
from jaxprice import accuracy  # noqa: E402  (public module: jaxprice.accuracy, the full accuracy API)
