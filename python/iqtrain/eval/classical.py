"""Classical automatic-modulation-classification (AMC) features: the linear probe's
hand-made baseline.

A pretrained model's probe accuracy means little without the textbook features a radio
engineer would compute from the same windows, scored by the same grouped folds and the same
logistic regression. :func:`classical_features` computes twelve of them per window, numpy only
(no torch), vectorised over the batch, in float64; :func:`labelled_classical_features` does it
for every window of a :class:`~iqtrain.data.windows.LabelledSet`.

Normalisation. A window ``x[n] = I[n] + jQ[n]`` (n = 0..L-1) is first divided by
``sqrt(mean |x|^2)`` (after its peak, so squares stay in float64's range): unit mean power, so
that no feature depends on the receiver's gain (an all-zero window gets all-zero features).
The moment features (cumulants and spectral lines) use the *centred* window ``y = x -
mean(x)``, since cumulants are defined on zero-mean signals and a DC offset would otherwise put
a spurious line at zero frequency in y^2 and y^4; the envelope, instantaneous-frequency and
spectrum features use ``x`` as recorded. A window whose centred power ``C21`` is under
``DEGENERATE`` (a DC level: nothing left after centring) gets zero for the moment features. A
window holding a non-finite sample gets NaN features, so a caller's finiteness check finds it
(as :func:`~iqtrain.eval.probe.probe_features` does).

The features. ``M_pq = mean(y^(p-q) conj(y)^q)`` are the sample moments of the centred window,
``C21 = M21``, and the cumulants follow from the zero-mean moment-to-cumulant formulas (Swami &
Sadler 2000, "Hierarchical digital modulation classification using cumulants", IEEE Trans.
Commun. 48(3)); textbook values of unit-power constellations in brackets, all 0 for complex
Gaussian noise:

- ``abs_c20 = |C20| / C21``, ``C20 = M20``  (BPSK 1, QPSK/8PSK/16QAM 0)
- ``abs_c40 = |C40| / C21^2``, ``C40 = M40 - 3 M20^2``  (BPSK 2, QPSK 1, 8PSK 0, 16QAM 0.68)
- ``abs_c41 = |C41| / C21^2``, ``C41 = M41 - 3 M20 M21``  (BPSK 2, QPSK/8PSK/16QAM 0)
- ``abs_c42 = |C42| / C21^2``, ``C42 = M42 - |M20|^2 - 2 M21^2``  (BPSK 2, PSK 1, 16QAM 0.68)
- ``abs_c60 = |C60| / C21^3``, ``C60 = M60 - 15 M40 M20 - 10 M30^2 + 30 M20^3``  (BPSK 16,
  QPSK/8PSK/16QAM 0)
- ``abs_c63 = |C63| / C21^3``, ``C63 = M63 - 6 Re(M20 conj(M41)) - 9 M21 M42 - |M30|^2
  - 9 |M31|^2 + 12 M21^3 + 18 M21 |M20|^2``  (BPSK 16, QPSK/8PSK 4, 16QAM 2.08)

Envelope, instantaneous frequency and spectrum:

- ``envelope_var = var(|x|) / mean(|x|)^2``  (constant envelope 0, Gaussian noise 4/pi - 1)
- ``freq_var``: weighted variance of ``f[n] = angle(z[n]) / 2pi`` (cycles per sample),
  ``z[n] = x[n+1] conj(x[n])``, weights ``|z[n]|``  (a tone 0)
- ``freq_kurtosis``: the same weighted ``E[(f - Ef)^4] / (var(f)^2 + 1e-24)``  (a tone 0)
- ``spectral_flatness = geomean(P) / mean(P)``, ``P = |FFT(x)|^2`` floored at 1e-12 of its
  mean  (a periodogram of white noise exp(-0.5772) = 0.56, a tone ~0)
- ``line_x2 = max_k |FFT_4L(y^2)[k]| / sum |y|^2``  (BPSK 1, QPSK ~0)
- ``line_x4 = max_k |FFT_4L(y^4)[k]| / sum |y|^4``  (BPSK and QPSK 1, 16QAM 0.68 / 1.32)

The cumulants are magnitudes (hence invariant to a constant phase rotation), each normalised by
the power of its order, and the sixth-order ones keep the third-moment terms (M30, M31) that
vanish only for symmetric constellations. C20, C40, C41 and C60 carry unequal numbers of
conjugates, so a carrier-frequency offset spins them to ~0 over a window; C42 and C63 are
offset-proof. The squared and fourth-power spectral lines are the offset-proof versions of
|C20| and |C40| (a BPSK carrier at f0 puts y^2's line at 2 f0, QPSK's y^4 at 4 f0; the classic
carrier-recovery and symbol-rate-detection statistics): ``FFT_4L`` is zero-padded to 4L so a
line between bins loses at most 3% (sinc(1/8)), and each is normalised by its bound (triangle
inequality), so both lie in [0, 1].

The envelope and instantaneous-frequency features follow Azzouz & Nandi (1996), "Automatic
Modulation Recognition of Communication Signals" (Kluwer) and "Procedure for automatic
recognition of analogue and digital modulations" (IEE Proc. Commun. 143(5)): ``envelope_var``
is the variance of their normalised-centred amplitude ``a_cn = |x| / mean|x| - 1`` (their
sigma_a squared: 0 for PSK and FM, positive for QAM, ASK and noise); ``freq_var`` and
``freq_kurtosis`` are their sigma_f squared and mu_42^f, in cycles per sample (no symbol rate
is known here), with each phase difference weighted by ``|x[n+1] x[n]|`` instead of their hard
weak-sample threshold: weak samples' phases are noise, and a weight keeps the feature
continuous in the signal. Spectral flatness (Wiener entropy; e.g. Gray & Markel 1974, "A
spectral-flatness measure for studying the autocorrelation method of linear prediction of
speech analysis", IEEE Trans. ASSP 22(3)) of the window's periodogram separates noise-like
from line-like spectra. Every feature is invariant to a positive gain and to a constant phase
rotation.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import numpy as np

__all__ = [
    "DEGENERATE",
    "Batched",
    "FEATURE_NAMES",
    "LINE_PAD",
    "classical_features",
    "labelled_classical_features",
]

FEATURE_NAMES: tuple[str, ...] = (
    "abs_c20",
    "abs_c40",
    "abs_c41",
    "abs_c42",
    "abs_c60",
    "abs_c63",
    "envelope_var",
    "freq_var",
    "freq_kurtosis",
    "spectral_flatness",
    "line_x2",
    "line_x4",
)

# Centred power (of a unit-power window) below which nothing but a DC level is left: its
# normalised cumulants would be ratios of rounding errors, so they are defined as 0.
DEGENERATE = 1e-12
# Zero-padding factor of the spectral-line FFTs: a line halfway between bins of the length-4L
# transform keeps sinc(1/8) = 97% of its height (64% at worst without padding).
LINE_PAD = 4
# Rows per internal chunk: bounds the memory of the padded FFTs. Rows never interact, so a
# window's features do not depend on its batch (beyond the last bit of a SIMD sum's alignment).
_CHUNK = 256
# The kurtosis guard on var^2 (cycles^4): negligible beside any real frequency spread
# (var >= 1e-9) and sends a pure tone's ratio of rounding errors to 0.
_KURTOSIS_EPS = 1e-24
# The spectral-flatness floor, relative to the mean periodogram: an exact spectral null would
# otherwise send the geometric mean to log(0).
_FLATNESS_FLOOR = 1e-12


def _complex_windows(windows: np.ndarray) -> np.ndarray:
    """``[B, L]`` complex128 of interleaved ``[B, L, 2]`` I/Q; a bad argument is a ValueError."""
    if not isinstance(windows, np.ndarray):
        raise ValueError(f"windows: must be a numpy array, got {type(windows).__name__}")
    if windows.ndim != 3 or windows.shape[2] != 2:
        raise ValueError(
            f"windows: must have shape [batch, length, 2] (interleaved I, Q), got "
            f"{list(windows.shape)}"
        )
    if windows.shape[1] < 2:
        raise ValueError(
            f"windows: need at least 2 samples per window (instantaneous frequency), got "
            f"{windows.shape[1]}"
        )
    kind = windows.dtype
    if not (np.issubdtype(kind, np.integer) or np.issubdtype(kind, np.floating)):
        raise ValueError(f"windows: must be integer or floating point, got dtype {kind}")
    w = windows.astype(np.float64)
    return w[..., 0] + 1j * w[..., 1]


def _safe_ratio(num: np.ndarray, den: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """``num / den`` where ``ok``, else 0 (no division is evaluated where it is not ok)."""
    return np.divide(num, den, out=np.zeros(np.shape(num)), where=ok)


def _cumulants(y: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """``[B, 6]``: |C20|/C21, |C40|/C21^2, |C41|/C21^2, |C42|/C21^2, |C60|/C21^3, |C63|/C21^3
    of centred windows ``y`` (0 where not ``ok``)."""
    y2, a2 = y * y, (y * y.conj()).real
    m20, m21 = y2.mean(axis=1), a2.mean(axis=1)
    m30, m31 = (y2 * y).mean(axis=1), (a2 * y).mean(axis=1)
    m40, m41, m42 = (y2 * y2).mean(axis=1), (a2 * y2).mean(axis=1), (a2 * a2).mean(axis=1)
    m60, m63 = (y2 * y2 * y2).mean(axis=1), (a2 * a2 * a2).mean(axis=1)
    c40 = m40 - 3 * m20**2
    c41 = m41 - 3 * m20 * m21
    c42 = m42 - np.abs(m20) ** 2 - 2 * m21**2
    c60 = m60 - 15 * m40 * m20 - 10 * m30**2 + 30 * m20**3
    c63 = (
        m63
        - 6 * (m20 * m41.conj()).real
        - 9 * m21 * m42
        - np.abs(m30) ** 2
        - 9 * np.abs(m31) ** 2
        + 12 * m21**3
        + 18 * m21 * np.abs(m20) ** 2
    )
    orders = [(m20, 1), (c40, 2), (c41, 2), (c42, 2), (c60, 3), (c63, 3)]
    return np.stack([_safe_ratio(np.abs(c), m21**k, ok) for c, k in orders], axis=1)


def _lines(y: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """``[B, 2]``: the squared and fourth-power spectral lines of centred windows ``y``."""
    n = LINE_PAD * y.shape[1]
    y2 = y * y
    a2 = (y * y.conj()).real
    line2 = np.abs(np.fft.fft(y2, n=n, axis=1)).max(axis=1)
    line4 = np.abs(np.fft.fft(y2 * y2, n=n, axis=1)).max(axis=1)
    # sum |y|^4 >= (sum |y|^2)^2 / L > 0 wherever ok
    return np.stack(
        [_safe_ratio(line2, a2.sum(axis=1), ok), _safe_ratio(line4, (a2 * a2).sum(axis=1), ok)],
        axis=1,
    )


def _envelope_var(x: np.ndarray) -> np.ndarray:
    a = np.abs(x)
    mean = a.mean(axis=1)
    return _safe_ratio(a.var(axis=1), mean**2, mean > 0)


def _frequency(x: np.ndarray) -> np.ndarray:
    """``[B, 2]``: weighted variance and kurtosis of the instantaneous frequency (cycles/sample)."""
    z = x[:, 1:] * x[:, :-1].conj()
    f = np.angle(z) / (2 * np.pi)
    w = np.abs(z)
    total = w.sum(axis=1, keepdims=True)
    w = _safe_ratio(w, total, total > 0)  # a window of zeros has no weight: both features 0
    fc = f - (w * f).sum(axis=1, keepdims=True)
    var = (w * fc**2).sum(axis=1)
    kurtosis = (w * fc**4).sum(axis=1) / (var**2 + _KURTOSIS_EPS)
    return np.stack([var, kurtosis], axis=1)


def _spectral_flatness(x: np.ndarray) -> np.ndarray:
    p = np.abs(np.fft.fft(x, axis=1)) ** 2
    mean = p.mean(axis=1, keepdims=True)
    # The absolute tiny term only keeps the log finite for an all-zero window (zeroed later).
    p = p + (_FLATNESS_FLOOR * mean + np.finfo(np.float64).tiny)
    return np.exp(np.log(p).mean(axis=1)) / p.mean(axis=1)


def _chunk_features(x: np.ndarray) -> np.ndarray:
    """``[b, 12]`` of finite complex windows ``x`` (the order of FEATURE_NAMES)."""
    # Peak first, then power: squares of float64 samples beyond 1e154 (or below 1e-154) would
    # overflow (underflow) before the power normalisation could take them out.
    peak = np.maximum(np.abs(x.real), np.abs(x.imag)).max(axis=1, initial=0.0)
    live = peak > 0
    x = x * _safe_ratio(np.ones_like(peak), peak, live)[:, None]
    power = (x * x.conj()).real.mean(axis=1)
    x = x * _safe_ratio(np.ones_like(power), np.sqrt(power), live)[:, None]
    y = x - x.mean(axis=1, keepdims=True)
    ok = (y * y.conj()).real.mean(axis=1) > DEGENERATE
    out = np.concatenate(
        [
            _cumulants(y, ok),
            _envelope_var(x)[:, None],
            _frequency(x),
            _spectral_flatness(x)[:, None],
            _lines(y, ok),
        ],
        axis=1,
    )
    out[~live] = 0.0
    return out


def classical_features(windows: np.ndarray) -> np.ndarray:
    """``[B, 12]`` float64 AMC features (columns in the order of :data:`FEATURE_NAMES`).

    ``windows``: ``[B, L, 2]`` interleaved I/Q, integer (int8, int16: the raw loader dtypes)
    or floating point, ``L >= 2``; anything else is a ValueError naming ``windows``. Finite
    for every finite window (all-zero windows give zeros); a window holding a non-finite
    sample gives a row of NaN. Invariant to a positive gain and a constant phase rotation.
    """
    x = _complex_windows(windows)
    finite = np.isfinite(x).all(axis=1)
    x = np.where(finite[:, None], x, 0)  # compute on zeros, then mark the row (no warnings)
    out = np.empty((x.shape[0], len(FEATURE_NAMES)), dtype=np.float64)
    for lo in range(0, x.shape[0], _CHUNK):
        out[lo : lo + _CHUNK] = _chunk_features(x[lo : lo + _CHUNK])
    out[~finite] = np.nan
    return out


class Batched(Protocol):
    """What :func:`labelled_classical_features` reads: a :class:`~iqtrain.data.windows.LabelledSet`
    (typed structurally: probe.py imports this module, never the other way round)."""

    def batches(self) -> Iterator[np.ndarray]: ...


def labelled_classical_features(labelled: Batched) -> np.ndarray:
    """``[len(labelled), 12]``: :func:`classical_features` of every labelled window, in order.

    Reads the windows batch by batch (``labelled.batches()``, raw storage dtype), never all at
    once.
    """
    parts = [classical_features(raw) for raw in labelled.batches()]
    if not parts:
        return np.empty((0, len(FEATURE_NAMES)), dtype=np.float64)
    return np.concatenate(parts)
