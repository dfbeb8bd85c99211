"""jaxprice.fit: gradient-based calibration of registry coefficients against measurements.

Choose the free coefficients by name pattern and scope (``Free``), fit their log-multipliers
with optax Adam to measured mean TPOT or step times (``fit_coefficients``), under a prior that
pulls each toward its registry value (strength chosen by ``choose_prior`` / ``cross_validate``,
holding out whole models, chips or deployments: ``cv_folds``), physical bounds
(``physical_range``) and an identifiability check that freezes what the data cannot separate
(``identifiability``). Write the result as a coefficient set scoped to the chips and models it
was fitted on, chips, models and engines (``write_coefficient_set``; ``set_applies`` says what reaches a deployment, ``set_notes`` in words) that
``load_deployment(..., extra_coefficient_files=[path])`` loads like any other. ``fit_law`` fits
the parameters of a small law the same way. The command line is ``jaxprice fit``.

The same names are exported from ``jaxprice`` itself (``jaxprice.fit_coefficients`` ...).
"""

from jaxprice._src.fit import (DEFAULT_PRIORS, ESTIMATES, HOLDOUTS, LOSSES, MAX_STEPS, REGISTRY_KEPT, SCOPE_DIMS,
                               TARGETS,
                               WEIGHTINGS, CVResult,
                               FitResult, Fold, Free, Identifiability, LawFit, Observations, apply_theta, choose_prior,
                               cross_validate, cv_folds, deployment_dims, fit_coefficients, fit_law, identifiability,
                               is_fraction, key_label, observations_from_groups, observations_from_measurements,
                               physical_range, predict_observations, read_step_measurements, relative_error,
                               worst_ratio,
                               scheduler_names, score_points, set_applies, set_notes, split_by_deployment,
                               write_coefficient_set)
from jaxprice._src.fit import (SIM_TARGETS, SimObservations, SimRun, metric_weights,  # noqa: E402 (simulate rule)
                               observations_from_simulation, parse_targets, predict_simulated, score_simulated)

__all__ = [
    "DEFAULT_PRIORS", "REGISTRY_KEPT", "MAX_STEPS", "ESTIMATES", "HOLDOUTS", "LOSSES", "SCOPE_DIMS", "TARGETS", "WEIGHTINGS",
    "Free", "Observations", "FitResult", "LawFit", "Fold", "CVResult", "Identifiability",
    "fit_coefficients", "fit_law", "write_coefficient_set", "split_by_deployment", "set_applies", "set_notes",
    "scheduler_names",
    "cross_validate", "choose_prior", "cv_folds", "score_points", "relative_error", "worst_ratio", "identifiability",
    "physical_range", "predict_observations",
    "observations_from_measurements", "observations_from_groups", "read_step_measurements",
    "apply_theta", "deployment_dims", "is_fraction", "key_label",
    "SIM_TARGETS", "SimObservations", "SimRun", "metric_weights", "observations_from_simulation", "parse_targets",
    "predict_simulated", "score_simulated",
]
