"""jaxprice.fit: gradient-based calibration of registry coefficients against measurements.

Choose the free coefficients by name pattern and scope (``Free``), fit their log-multipliers
with optax Adam to measured mean TPOT or step times (``fit_coefficients``; the split for early
stopping is by deployment, ``split_by_deployment``) and write the result as a coefficient set
(``write_coefficient_set``) that ``load_deployment(..., extra_coefficient_files=[path])`` loads
like any other. ``fit_law`` fits the parameters of a small law (a GEMM efficiency ramp, an
HBM derate) the same way. The command line is ``jaxprice fit``.

The same names are exported from ``jaxprice`` itself (``jaxprice.fit_coefficients`` ...).
"""

from jaxprice._src.fit import (ESTIMATES, LOSSES, SCOPE_DIMS, TARGETS, WEIGHTINGS, FitResult, Free, LawFit,
                               Observations, apply_theta, deployment_dims, fit_coefficients, fit_law, is_fraction,
                               key_label, observations_from_groups, observations_from_measurements,
                               read_step_measurements, split_by_deployment, write_coefficient_set)

__all__ = [
    "ESTIMATES", "LOSSES", "SCOPE_DIMS", "TARGETS", "WEIGHTINGS",
    "Free", "Observations", "FitResult", "LawFit",
    "fit_coefficients", "fit_law", "write_coefficient_set", "split_by_deployment",
    "observations_from_measurements", "observations_from_groups", "read_step_measurements",
    "apply_theta", "deployment_dims", "is_fraction", "key_label",
]
