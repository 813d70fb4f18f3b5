"""L2-regularised logistic regression by Newton's method: deterministic, seconds on these
cores. Every verifier model and head of the cache is fitted with it."""

import numpy as np

from gateway.cache.verifier import LogisticModel

L2 = 1.0


def fit_logistic(
    x: np.ndarray, y: np.ndarray, sample: np.ndarray, l2: float = L2, steps: int = 50
) -> LogisticModel:
    """L2-regularised logistic regression by Newton's method; the classes weigh the same."""
    mean, scale = x.mean(axis=0), x.std(axis=0)
    # a spread the artifact's 6 decimals would round to 0 counts as none: else a new value
    # of that feature would be divided by 0
    scale[scale < 1e-6] = 1.0
    z = np.hstack([(x - mean) / scale, np.ones((len(x), 1))])
    pos, neg = (sample * y).sum(), (sample * (1 - y)).sum()
    weight = sample * np.where(y == 1, 0.5 / max(pos, 1e-9), 0.5 / max(neg, 1e-9)) * len(y)
    w = np.zeros(z.shape[1])
    penalty = np.full(z.shape[1], l2)
    penalty[-1] = 0.0  # the bias is not shrunk
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(z @ w)))
        grad = z.T @ (weight * (p - y)) + penalty * w
        hess = (z * (weight * p * (1 - p))[:, None]).T @ z + np.diag(penalty)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-10:
            break
    r = lambda v: [round(float(t), 6) for t in v]  # noqa: E731
    return LogisticModel(r(mean), r(scale), r(w[:-1]), round(float(w[-1]), 6))
