"""A small Gaussian process over a model's log-error, so that measurements correct a prior.

For a config x with prior prediction p(x) and measured time t(x), the GP models
`log t(x) - log p(x) = b + g(x)`: an offset b shared by every config of the problem (the
model's scale is off) and a smooth correction g over the config's coordinates (a region
runs slower or faster than modelled). Kernel: `offset_var + signal_var * exp(-d²/2)`, with d
the distance in coordinates divided by the length scales; `noise_var` is the measurement
noise in log units. Exact inference with a Cholesky factor: the problems here have at most a
few hundred points.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GpSettings:
    lengthscales: tuple[float, ...]
    signal_var: float = 0.04  # variance of the correction g (log units²)
    offset_var: float = 1.0  # variance of the shared offset b
    noise_var: float = 0.02**2


class ResidualGp:
    def __init__(self, settings: GpSettings) -> None:
        self.settings = settings
        self._x = np.zeros((0, len(settings.lengthscales)))
        self._y = np.zeros(0)
        self._chol: np.ndarray | None = None
        self._alpha: np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self._y)

    def fit(self, xs: Sequence[Sequence[float]], ys: Sequence[float]) -> None:
        self._x = np.asarray(xs, dtype=float).reshape(len(ys), len(self.settings.lengthscales))
        self._y = np.asarray(ys, dtype=float)
        self._chol = self._alpha = None
        if self.n:
            cov = self._kernel(self._x, self._x) + self.settings.noise_var * np.eye(self.n)
            self._chol = np.linalg.cholesky(cov)
            self._alpha = np.linalg.solve(self._chol.T, np.linalg.solve(self._chol, self._y))

    def predict(self, xs: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation of the log-error at each point."""
        x = np.asarray(xs, dtype=float).reshape(len(xs), len(self.settings.lengthscales))
        prior_var = self.settings.offset_var + self.settings.signal_var
        if self._chol is None or self._alpha is None:
            return np.zeros(len(x)), np.full(len(x), np.sqrt(prior_var))
        cross = self._kernel(x, self._x)
        mean = cross @ self._alpha
        v = np.linalg.solve(self._chol, cross.T)
        var = np.maximum(prior_var - np.sum(v * v, axis=0), 1e-12)
        return mean, np.sqrt(var)

    def _kernel(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        scale = np.asarray(self.settings.lengthscales, dtype=float)
        d = (a[:, None, :] - b[None, :, :]) / scale
        return self.settings.offset_var + self.settings.signal_var * np.exp(-0.5 * np.sum(d * d, axis=-1))
