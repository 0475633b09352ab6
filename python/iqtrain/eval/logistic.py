"""The probe's classifier: multinomial logistic regression on standardised features, many
independent fits side by side (docs/design.md "Linear probe", classifier).

Each fit standardises its training windows, starts from zeros and runs L-BFGS preconditioned by
their second moments with a backtracking line search; the fits of one call run as one padded
batch, every scalar per fit, so a fit's iterates depend on its own windows only.
Deterministic; no RNG. Offers :func:`fit_logistic` (one fit), :func:`fit_logistic_many` (a
batch of them) and the fitted :class:`LogisticProbe`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "BATCH_ELEMENTS",
    "L2",
    "LBFGS_ITERATIONS",
    "TOL_CHANGE",
    "TOL_GRAD",
    "LogisticProbe",
    "fit_logistic",
    "fit_logistic_many",
]

# L2 on the weights (not the bias), relative to the mean cross-entropy, on standardised
# features: small enough not to cost accuracy on separable data, large enough that the optimum
# is finite when a training fold is separable (it often is: dim >= 64 features, few windows).
L2 = 1e-3
# The most L-BFGS iterations of one fit. Preconditioned (see _Batch), cross-validation fits
# reach TOL_GRAD in tens of iterations, few-shot fits on separable windows in a few hundred;
# the cap only bounds the time a pathological set can take.
LBFGS_ITERATIONS = 1000
LBFGS_HISTORY = 20
# A fit stops when the largest component of its gradient is at most TOL_GRAD (the loss is a mean
# over windows of standardised features, so this is scale-free), when its loss or its step
# changes by at most TOL_CHANGE, or when no step along its direction lowers the loss.
TOL_GRAD = 1e-6
TOL_CHANGE = 1e-12
ARMIJO = 1e-4  # sufficient decrease of the backtracking line search
HALVINGS = 40  # backtracking halvings before a fit is declared stuck (a step of 2^-40)
# float64 elements of standardised features held at once by one batch of fits (256 MiB);
# fits beyond it go to the next batch.
BATCH_ELEMENTS = 1 << 25


@dataclass(frozen=True)
class LogisticProbe:
    """A fitted multinomial logistic regression with its standardisation (float64)."""

    mean: torch.Tensor
    std: torch.Tensor
    weight: torch.Tensor  # [dim, classes]
    bias: torch.Tensor  # [classes]

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        z = (features.double() - self.mean) / self.std
        return (z @ self.weight + self.bias).argmax(dim=1)


def fit_logistic(
    features: torch.Tensor,
    labels: torch.Tensor | np.ndarray,
    num_classes: int,
    *,
    l2: float = L2,
    iterations: int = LBFGS_ITERATIONS,
) -> LogisticProbe:
    """Fit softmax regression on ``features`` standardised by their own mean and std: one
    :func:`fit_logistic_many` fit over every row."""
    y = torch.as_tensor(labels).long().numpy()
    rows = [np.arange(len(features))]
    return fit_logistic_many(features, y, rows, num_classes, l2=l2, iterations=iterations)[0]


def fit_logistic_many(
    features: torch.Tensor,
    labels: np.ndarray,
    rows: Sequence[np.ndarray],
    num_classes: int,
    *,
    l2: float = L2,
    iterations: int = LBFGS_ITERATIONS,
) -> list[LogisticProbe]:
    """One softmax regression per entry of ``rows`` (the training windows of that fit), fitted
    side by side: independent problems in one batch, so the many small fits of cross-validation
    and of the few-shot draws cost a few large tensor operations instead of many small ones.

    Each fit: features standardised by its rows' mean and population std (std <= 1e-12 -> 1),
    float64; ``W [dim, classes]`` and ``b`` from zeros; loss mean cross-entropy
    + ``l2 / 2 * |W|^2``; L-BFGS (history 20) preconditioned by the rows' second moments, with a
    backtracking (Armijo) line search, until TOL_GRAD / TOL_CHANGE or ``iterations``. A fit's
    iterates depend on its own rows only. Deterministic; no RNG.
    """
    labels = np.asarray(labels, dtype=np.int64)
    fits: list[LogisticProbe] = []
    for chunk in _chunks(rows, features.shape[1]):
        batch = _Batch(features, labels, chunk, num_classes, l2)
        fits += batch.fits(_lbfgs(batch.loss_grad, batch.precondition, batch.start(), iterations))
    return fits


def _chunks(rows: Sequence[np.ndarray], dim: int) -> Iterator[list[np.ndarray]]:
    """``rows`` in order, cut into batches of at most BATCH_ELEMENTS padded elements (one fit
    per batch when a single one is larger)."""
    chunk: list[np.ndarray] = []
    longest = 0
    for r in rows:
        n = max(longest, len(r))
        if chunk and (len(chunk) + 1) * n * (dim + 1) > BATCH_ELEMENTS:
            yield chunk
            chunk, n = [], len(r)
        chunk.append(np.asarray(r))
        longest = n
    if chunk:
        yield chunk


class _Batch:
    """The standardised training windows of a batch of fits, padded to the longest: ``z``
    ``[P, n, dim + 1]`` (the last column ones: the bias), ``w`` ``[P, n]`` (1/rows of the fit,
    0 on padding), ``y`` ``[P, n]``. Parameters ``x [P, (dim + 1) * classes]``: ``[W; b]``."""

    def __init__(
        self,
        features: torch.Tensor,
        labels: np.ndarray,
        rows: list[np.ndarray],
        classes: int,
        l2: float,
    ):
        p, n, dim = len(rows), max(len(r) for r in rows), features.shape[1]
        self.classes, self.dim = classes, dim
        self.z = torch.zeros(p, n, dim + 1, dtype=torch.float64)
        self.z[:, :, dim] = 1.0
        self.w = torch.zeros(p, n, dtype=torch.float64)
        self.y = torch.zeros(p, n, dtype=torch.int64)
        self.mean, self.std = [], []
        for i, r in enumerate(rows):
            x = features[torch.from_numpy(r)].double()
            mean = x.mean(dim=0)
            std = x.std(dim=0, unbiased=False)
            std = torch.where(std > 1e-12, std, torch.ones_like(std))
            self.z[i, : len(r), :dim] = (x - mean) / std
            self.w[i, : len(r)] = 1.0 / len(r)
            self.y[i, : len(r)] = torch.from_numpy(labels[r])
            self.mean.append(mean)
            self.std.append(std)
        self.decay = torch.full((dim + 1, 1), l2, dtype=torch.float64)
        self.decay[dim] = 0.0  # the bias is not penalised
        # Preconditioner: the rows' weighted second moments (bias column included) plus a ridge,
        # which is about `classes` times the Hessian at the start (softmax curvature ~1/classes):
        # L-BFGS then steps as if the features were decorrelated, and fits of correlated model
        # features converge in tens of iterations instead of hundreds (the objective is the same).
        moments = torch.bmm(self.z.transpose(1, 2) * self.w.unsqueeze(1), self.z)
        ridge = max(classes * l2, 1e-9) * torch.eye(dim + 1, dtype=torch.float64)
        # Applied as an explicit inverse (one batched matmul per use; the matrix is SPD and at
        # worst as ill-conditioned as moments / ridge, which float64 holds comfortably).
        self._inverse = torch.cholesky_inverse(torch.linalg.cholesky(moments + ridge))

    def start(self) -> torch.Tensor:
        return torch.zeros(len(self.z), (self.dim + 1) * self.classes, dtype=torch.float64)

    def loss_grad(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss [P], gradient [P, params])`` of every fit at ``x``."""
        a = x.view(len(x), self.dim + 1, self.classes)
        logits = torch.bmm(self.z, a)
        lse = torch.logsumexp(logits, dim=2)
        picked = logits.gather(2, self.y.unsqueeze(2)).squeeze(2)
        reg = self.decay * a
        loss = (self.w * (lse - picked)).sum(dim=1) + 0.5 * (reg * a).sum(dim=(1, 2))
        g = torch.exp(logits - lse.unsqueeze(2))
        g.scatter_add_(2, self.y.unsqueeze(2), torch.full_like(picked, -1.0).unsqueeze(2))
        g = g * self.w.unsqueeze(2)
        return loss, (torch.bmm(self.z.transpose(1, 2), g) + reg).reshape(len(x), -1)

    def precondition(self, v: torch.Tensor) -> torch.Tensor:
        a = v.view(len(v), self.dim + 1, self.classes)
        return torch.bmm(self._inverse, a).reshape(len(v), -1)

    def fits(self, x: torch.Tensor) -> list[LogisticProbe]:
        a = x.view(len(x), self.dim + 1, self.classes)
        return [
            LogisticProbe(self.mean[i], self.std[i], a[i, : self.dim].clone(), a[i, -1].clone())
            for i in range(len(x))
        ]


_LossGrad = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _lbfgs(
    loss_grad: _LossGrad,
    precondition: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    iterations: int,
) -> torch.Tensor:
    """Preconditioned L-BFGS on a batch of independent problems (rows of ``x``); every scalar
    (step, curvature pair, stopping test) is per problem, so a problem's iterates never depend
    on the others'. A problem that has stopped keeps its parameters."""
    f, g = loss_grad(x)
    active = g.abs().amax(dim=1) > TOL_GRAD
    memory = _Memory(precondition, len(x), x.dtype)
    for _ in range(iterations):
        if not bool(active.any()):
            break
        d = memory.direction(g)
        gtd = (g * d).sum(dim=1)
        active &= gtd < -TOL_CHANGE  # not a descent direction any more: at the optimum
        x_new, f_new, g_new, t, moved = _armijo(loss_grad, x, f, gtd, d, active)
        keep = moved.unsqueeze(1)
        memory.push(torch.where(keep, x_new - x, 0.0), torch.where(keep, g_new - g, 0.0))
        small = (
            (g_new.abs().amax(dim=1) <= TOL_GRAD)
            | ((f - f_new).abs() <= TOL_CHANGE)
            | ((t.unsqueeze(1) * d).abs().amax(dim=1) <= TOL_CHANGE)
        )
        x, f, g = (
            torch.where(keep, x_new, x),
            torch.where(moved, f_new, f),
            torch.where(keep, g_new, g),
        )
        active &= moved & ~small
    return x


def _armijo(
    loss_grad: _LossGrad,
    x: torch.Tensor,
    f: torch.Tensor,
    gtd: torch.Tensor,
    d: torch.Tensor,
    active: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backtracking from a step of 1, halving until the loss falls by ARMIJO of the slope:
    ``(x, f, g at the accepted steps, the steps, which problems moved)``."""
    t = torch.ones_like(f)
    pending = active.clone()
    x_new, f_new, g_new = x.clone(), f.clone(), torch.zeros_like(x)
    for _ in range(HALVINGS):
        xt = x + t.unsqueeze(1) * d
        ft, gt = loss_grad(xt)
        ok = pending & (ft <= f + ARMIJO * t * gtd)  # NaN compares False: a shorter step
        x_new[ok], f_new[ok], g_new[ok] = xt[ok], ft[ok], gt[ok]
        pending &= ~ok
        if not bool(pending.any()):
            break
        t = torch.where(pending, 0.5 * t, t)
    return x_new, f_new, g_new, t, active & ~pending


class _Memory:
    """The last LBFGS_HISTORY curvature pairs of every problem (a pair with ``s·y <= 1e-10``,
    or of a problem that did not move, is stored as a no-op: ``rho = 0``)."""

    def __init__(
        self, precondition: Callable[[torch.Tensor], torch.Tensor], p: int, dtype: torch.dtype
    ):
        self.precondition = precondition
        self.pairs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.gamma = torch.ones(p, dtype=dtype)

    def push(self, s: torch.Tensor, y: torch.Tensor) -> None:
        sy = (s * y).sum(dim=1)
        good = sy > 1e-10
        rho = torch.where(good, 1.0 / torch.where(good, sy, 1.0), 0.0)
        y_hy = (y * self.precondition(y)).sum(dim=1)
        self.gamma = torch.where(
            good & (y_hy > 0), sy / torch.where(y_hy > 0, y_hy, 1.0), self.gamma
        )
        self.pairs.append((s, y, rho))
        if len(self.pairs) > LBFGS_HISTORY:
            self.pairs.pop(0)

    def direction(self, g: torch.Tensor) -> torch.Tensor:
        """The two-loop recursion: ``-H g`` with ``H0 = gamma * M^-1``."""
        q, alphas = -g, []
        for s, y, rho in reversed(self.pairs):
            a = rho * (s * q).sum(dim=1)
            q = q - a.unsqueeze(1) * y
            alphas.append(a)
        r = self.gamma.unsqueeze(1) * self.precondition(q)
        for (s, y, rho), a in zip(self.pairs, reversed(alphas), strict=True):
            b = rho * (y * r).sum(dim=1)
            r = r + (a - b).unsqueeze(1) * s
        return r
