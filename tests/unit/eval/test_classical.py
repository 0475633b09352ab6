"""The classical AMC features: textbook values, invariances, degenerate windows, dtypes, and
separability through the probe's own cross-validation."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from iqtrain.eval.classical import FEATURE_NAMES, classical_features, labelled_classical_features

L = 1024  # samples per window
COL = {name: i for i, name in enumerate(FEATURE_NAMES)}
CUMULANTS = ["abs_c20", "abs_c40", "abs_c41", "abs_c42", "abs_c60", "abs_c63"]
LEVELS = np.array([-3.0, -1.0, 1.0, 3.0])


# --------------------------------------------------------------------------- signals


def constellation(rng, kind, n):
    """``n`` unit-power symbols of ``kind``."""
    if kind == "bpsk":
        return rng.choice([-1.0, 1.0], n) + 0j
    if kind == "qpsk":
        return (rng.choice([-1.0, 1.0], n) + 1j * rng.choice([-1.0, 1.0], n)) / math.sqrt(2)
    if kind == "8psk":
        return np.exp(2j * np.pi * rng.integers(0, 8, n) / 8)
    assert kind == "16qam"
    return (rng.choice(LEVELS, n) + 1j * rng.choice(LEVELS, n)) / math.sqrt(10)


def add_noise(rng, x, snr_db):
    if snr_db is None:
        return x
    sigma = math.sqrt(10 ** (-snr_db / 10) / 2)
    return x + sigma * (rng.standard_normal(x.shape) + 1j * rng.standard_normal(x.shape))


def linear(rng, kind, count, snr_db=None, f0=0.0):
    """Rectangular-pulse windows, 4-8 samples per symbol, random carrier phase, offset ``f0``."""
    rows = []
    for _ in range(count):
        sps = int(rng.integers(4, 9))
        s = np.repeat(constellation(rng, kind, L // sps + 1), sps)[:L]
        rows.append(s * np.exp(1j * (rng.uniform(0, 2 * np.pi) + 2 * np.pi * f0 * np.arange(L))))
    return add_noise(rng, np.stack(rows), snr_db)


def fm(rng, count, snr_db=None):
    """Constant envelope, frequency 0.05 x a smooth random message (cycles per sample)."""
    message = [np.convolve(rng.standard_normal(L), np.ones(64) / 8, "same") for _ in range(count)]
    phase = 2 * np.pi * np.cumsum(0.05 * np.stack(message), axis=1)
    return add_noise(rng, np.exp(1j * (phase + rng.uniform(0, 2 * np.pi, (count, 1)))), snr_db)


def noise(rng, count):
    return add_noise(rng, np.zeros((count, L), dtype=complex), 0.0)


def tone(freq=0.1, n=L):
    return np.exp(2j * np.pi * freq * np.arange(n))[None]


def iq(x, dtype=np.float32):
    return np.stack([x.real, x.imag], axis=-1).astype(dtype)


def mean_features(x):
    return dict(zip(FEATURE_NAMES, classical_features(iq(x)).mean(axis=0), strict=True))


# --------------------------------------------------------------------------- textbook values


@pytest.mark.parametrize(
    ("kind", "expected", "tol"),
    [
        ("bpsk", {"abs_c20": 1, "abs_c40": 2, "abs_c41": 2, "abs_c42": 2, "abs_c63": 16}, 0.06),
        ("qpsk", {"abs_c20": 0, "abs_c40": 1, "abs_c41": 0, "abs_c42": 1, "abs_c63": 4}, 0.06),
        ("8psk", {"abs_c20": 0, "abs_c40": 0, "abs_c41": 0, "abs_c42": 1, "abs_c63": 4}, 0.06),
        ("16qam", {"abs_c20": 0, "abs_c40": 0.68, "abs_c42": 0.68, "abs_c63": 2.08}, 0.1),
    ],
)
def test_cumulants_reach_their_textbook_values(kind, expected, tol):
    got = mean_features(linear(np.random.default_rng(1), kind, 32))
    for name, value in expected.items():
        # The estimate of a 0 is the magnitude of a mean over ~200 symbols: ~0.9 / sqrt(200).
        bound = tol * value if value else 0.15
        assert abs(got[name] - value) <= bound, (name, got[name], value)


def test_sixth_order_cumulants_of_bpsk_and_qpsk():
    rng = np.random.default_rng(2)
    bpsk, qpsk = mean_features(linear(rng, "bpsk", 32)), mean_features(linear(rng, "qpsk", 32))
    assert bpsk["abs_c60"] == pytest.approx(16, rel=0.1)  # centring biases 128-symbol windows
    assert qpsk["abs_c60"] < 1.5 < bpsk["abs_c60"] / 10


def test_gaussian_noise_has_no_higher_order_cumulants_and_a_rayleigh_envelope():
    got = mean_features(noise(np.random.default_rng(3), 32))
    for name in ["abs_c20", "abs_c40", "abs_c41", "abs_c42", "abs_c63"]:
        assert got[name] < 0.2, name
    assert got["envelope_var"] == pytest.approx(4 / math.pi - 1, abs=0.02)
    assert got["spectral_flatness"] == pytest.approx(math.exp(-np.euler_gamma), abs=0.03)


def test_cumulants_match_the_general_moment_to_cumulant_formula():
    # An asymmetric, non-circular signal: its odd moments (M30, M31) are far from 0, so every
    # term of C60 and C63 is exercised; the reference sums over all set partitions.
    rng = np.random.default_rng(4)
    z = rng.standard_normal((3, L)) + 0.4j * rng.standard_normal((3, L))
    x = z + 0.6 * z**2 + 0.3j
    y = x / np.sqrt(np.mean(np.abs(x) ** 2, axis=1, keepdims=True))
    y = y - y.mean(axis=1, keepdims=True)
    c21 = np.mean(np.abs(y) ** 2, axis=1)
    got = classical_features(iq(x, np.float64))
    for name, conj in [("abs_c20", 0), ("abs_c40", 0), ("abs_c41", 1), ("abs_c42", 2)]:
        order = int(name[-2])
        want = np.abs(partition_cumulant(y, order, conj)) / c21 ** (order // 2)
        np.testing.assert_allclose(got[:, COL[name]], want, rtol=1e-9, err_msg=name)
    for name, conj in [("abs_c60", 0), ("abs_c63", 3)]:
        want = np.abs(partition_cumulant(y, 6, conj)) / c21**3
        np.testing.assert_allclose(got[:, COL[name]], want, rtol=1e-9, err_msg=name)


def partition_cumulant(y, order, conj):
    """Joint cumulant of ``order - conj`` copies of y and ``conj`` of conj(y), per row, from
    sample moments: sum over set partitions of (-1)^(k-1) (k-1)! prod of block moments."""
    factors = [y] * (order - conj) + [y.conj()] * conj
    total = np.zeros(y.shape[0], dtype=complex)
    for blocks in set_partitions(list(range(order))):
        k = len(blocks)
        term = np.ones(y.shape[0], dtype=complex)
        for block in blocks:
            term *= np.prod([factors[i] for i in block], axis=0).mean(axis=1)
        total += (-1) ** (k - 1) * math.factorial(k - 1) * term
    return total


def set_partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in set_partitions(rest):
        for i in range(len(partition)):
            yield [*partition[:i], [first, *partition[i]], *partition[i + 1 :]]
        yield [[first], *partition]


def test_envelope_variance_is_zero_for_constant_envelopes_and_not_for_qam():
    rng = np.random.default_rng(5)
    for x in [linear(rng, "bpsk", 4), linear(rng, "qpsk", 4), linear(rng, "8psk", 4), fm(rng, 4)]:
        assert classical_features(iq(x, np.float64))[:, COL["envelope_var"]].max() < 1e-12
    qam = mean_features(linear(rng, "16qam", 16))["envelope_var"]
    # amplitudes sqrt(2/10), 1, sqrt(18/10) with probabilities 1/4, 1/2, 1/4
    mean_a = (math.sqrt(0.2) + 2 + math.sqrt(1.8)) / 4
    assert qam == pytest.approx(1 / mean_a**2 - 1, rel=0.15)


def test_spectral_lines_find_bpsk_in_x2_and_qpsk_in_x4_even_off_carrier():
    rng = np.random.default_rng(6)
    for f0 in [0.0, 0.0123]:  # an offset between bins: the padded FFT still finds the line
        bpsk, qpsk = (
            mean_features(linear(rng, "bpsk", 8, f0=f0)),
            mean_features(linear(rng, "qpsk", 8, f0=f0)),
        )
        assert bpsk["line_x2"] > 0.95 and qpsk["line_x2"] < 0.3
        assert qpsk["line_x4"] > 0.9 and bpsk["line_x4"] > 0.9
    # ... which is what the lines are for: a carrier offset spins C20 and C40 to ~0
    assert bpsk["abs_c20"] < 0.1 and qpsk["abs_c40"] < 0.1
    assert mean_features(noise(rng, 8))["line_x4"] < 0.3


def test_instantaneous_frequency_of_a_tone_fm_and_psk():
    rng = np.random.default_rng(7)
    t = classical_features(iq(tone(0.1), np.float64))[0]
    assert t[COL["freq_var"]] < 1e-20 and t[COL["freq_kurtosis"]] < 1e-6
    assert t[COL["spectral_flatness"]] < 0.01
    f = mean_features(fm(rng, 16))
    assert f["freq_var"] > 1e-3 and f["freq_kurtosis"] < 4  # a smooth, near-Gaussian message
    # PSK's frequency is 0 but for rare spikes at symbol changes: heavy-tailed
    assert mean_features(linear(rng, "qpsk", 16))["freq_kurtosis"] > 6


# --------------------------------------------------------------------------- invariances


def mixed_windows(seed=8):
    rng = np.random.default_rng(seed)
    parts = [linear(rng, k, 2, snr_db=10) for k in ["bpsk", "qpsk", "16qam"]]
    return np.concatenate([*parts, fm(rng, 2, snr_db=10), noise(rng, 2), tone()])


@pytest.mark.parametrize("gain", [1e-200, 1e-3, 0.5, 7.0, 3e4, 1e200])
def test_features_are_invariant_to_a_positive_gain(gain):
    x = mixed_windows()
    np.testing.assert_allclose(
        classical_features(iq(gain * x, np.float64)),
        classical_features(iq(x, np.float64)),
        rtol=1e-8,
        atol=1e-10,
    )


@pytest.mark.parametrize("angle", [0.3, math.pi / 2, 2.0, -math.pi])
def test_features_are_invariant_to_a_constant_phase_rotation(angle):
    x = mixed_windows()
    np.testing.assert_allclose(
        classical_features(iq(np.exp(1j * angle) * x, np.float64)),
        classical_features(iq(x, np.float64)),
        rtol=1e-8,
        atol=1e-10,
    )


# --------------------------------------------------------------------------- degenerate input


def test_degenerate_windows_give_finite_features():
    rng = np.random.default_rng(9)
    zeros = np.zeros((1, L, 2), dtype=np.int16)
    dc = np.broadcast_to(np.array([3, -4], dtype=np.int16), (1, L, 2))
    got = classical_features(np.concatenate([zeros, dc, iq(noise(rng, 1)), iq(tone())]))
    assert got.shape == (4, 12) and got.dtype == np.float64 and np.isfinite(got).all()
    assert (got[0] == 0).all()
    # a DC level: nothing is left after centring (moment features 0), nothing moves
    assert (got[1, [COL[n] for n in [*CUMULANTS, "line_x2", "line_x4"]]] == 0).all()
    assert got[1, COL["envelope_var"]] < 1e-30 and got[1, COL["freq_var"]] < 1e-30


def test_one_impulse_and_a_two_sample_window_are_finite():
    impulse = np.zeros((1, L, 2), dtype=np.int8)
    impulse[0, 17] = (5, 0)
    short = np.array([[[1.0, 0.0], [0.0, 1.0]]], dtype=np.float32)
    assert np.isfinite(classical_features(impulse)).all()
    assert np.isfinite(classical_features(short)).all()


def test_a_non_finite_sample_marks_its_own_row_only():
    x = iq(mixed_windows())
    x[3, 100, 1] = np.nan
    x[5, 0, 0] = np.inf
    got, want = classical_features(x), classical_features(iq(mixed_windows()))
    assert np.isnan(got[[3, 5]]).all()
    keep = [i for i in range(len(x)) if i not in (3, 5)]
    np.testing.assert_array_equal(got[keep], want[keep])


def test_an_empty_batch_and_the_batch_split_do_not_matter():
    assert classical_features(np.zeros((0, L, 2), dtype=np.int8)).shape == (0, 12)
    x = iq(np.concatenate([mixed_windows(seed) for seed in range(30)]))  # > one 256-row chunk
    assert len(x) > 256
    whole = classical_features(x)
    # to the last bits: a row's SIMD sums may start at a different alignment in another batch
    np.testing.assert_allclose(whole[:5], classical_features(x[:5]), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(whole[-3:], classical_features(x[-3:]), rtol=1e-13, atol=1e-15)


# --------------------------------------------------------------------------- dtypes and errors


@pytest.mark.parametrize(("dtype", "full_scale"), [(np.int16, 8000.0), (np.int8, 40.0)])
def test_integer_windows_match_their_float_equivalent(dtype, full_scale):
    x = mixed_windows()
    x = x / np.abs(x).max() * full_scale
    raw = np.clip(np.round(iq(x, np.float64)), np.iinfo(dtype).min, np.iinfo(dtype).max)
    np.testing.assert_allclose(
        classical_features(raw.astype(dtype)),
        classical_features(raw.astype(np.float32)),
        rtol=1e-12,
        atol=1e-14,
    )


def test_int16_quantisation_barely_moves_the_features():
    x = mixed_windows()[:8]  # signals, not the tone (whose lines sit on a knife edge)
    x = x / np.abs(x).max() * 20000
    got = classical_features(np.round(iq(x, np.float64)).astype(np.int16))
    np.testing.assert_allclose(got, classical_features(iq(x, np.float64)), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize(
    ("bad", "what"),
    [
        (np.zeros((4, 2), dtype=np.float32), "shape"),
        (np.zeros((2, L, 3), dtype=np.float32), "shape"),
        (np.zeros((2, 1, 2), dtype=np.float32), "at least 2 samples"),
        (np.zeros((2, L, 2), dtype=np.complex64), "dtype"),
        (np.zeros((2, L, 2), dtype=bool), "dtype"),
        ([[[0.0, 0.0], [1.0, 1.0]]], "numpy array"),
    ],
)
def test_bad_input_is_a_value_error_naming_the_argument(bad, what):
    with pytest.raises(ValueError, match=rf"^windows: .*{what}"):
        classical_features(bad)


# --------------------------------------------------------------------------- labelled sets


class FakeLabelled:
    """The part of a LabelledSet the helper uses: ``batches()`` in the storage dtype."""

    def __init__(self, windows, batch):
        self.windows, self.batch = windows, batch

    def batches(self):
        for lo in range(0, len(self.windows), self.batch):
            yield self.windows[lo : lo + self.batch]


def test_labelled_features_stack_the_batches_in_order():
    x = np.round(iq(mixed_windows()) * 1000).astype(np.int16)
    np.testing.assert_array_equal(
        labelled_classical_features(FakeLabelled(x, 3)), classical_features(x)
    )
    assert labelled_classical_features(FakeLabelled(x[:0], 3)).shape == (0, 12)


def test_labelled_features_of_a_real_labelled_set(tmp_path):
    from sigmf import SigMFFile

    from iqtrain.data.windows import labelled_windows

    rng = np.random.default_rng(10)
    sig = np.concatenate([linear(rng, "bpsk", 1)[0], linear(rng, "qpsk", 1)[0]])
    raw = np.round(iq(sig, np.float64) * 3000).astype("<i2")
    raw.tofile(tmp_path / "r.sigmf-data")
    meta = SigMFFile(data_file=tmp_path / "r.sigmf-data", global_info={"core:datatype": "ci16_le"})
    meta.add_capture(0)
    for start, label in [(0, "bpsk"), (L, "qpsk")]:
        meta.add_annotation(start, L, metadata={"core:label": label})
    meta.tofile(tmp_path / "r.sigmf-meta")
    labelled = labelled_windows(str(tmp_path / "r.sigmf-meta"), 256)
    assert labelled.classes == ("bpsk", "qpsk")
    got = labelled_classical_features(labelled)
    assert got.shape == (8, 12)
    windows = raw.reshape(-1, 256, 2)
    np.testing.assert_array_equal(got, classical_features(windows))


# --------------------------------------------------------------------------- separability


def noisy_set(seed, per_class, f0_max=0.0):
    """Noisy (10 dB) BPSK, QPSK, 16QAM and FM windows; random carrier offsets up to f0_max."""
    rng = np.random.default_rng(seed)
    windows, labels = [], []
    for label, kind in enumerate(["bpsk", "qpsk", "16qam"]):
        for _ in range(per_class):
            windows.append(linear(rng, kind, 1, snr_db=10, f0=rng.uniform(-f0_max, f0_max)))
            labels.append(label)
    windows.append(fm(rng, per_class, snr_db=10))
    labels += [3] * per_class
    return iq(np.concatenate(windows)), np.array(labels)


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("f0_max", [0.0, 0.02])
def test_classical_features_separate_noisy_modulations_under_the_probe(f0_max):
    import torch

    from iqtrain.eval.folds import cross_validate

    x, labels = noisy_set(11, 40, f0_max)
    features = torch.from_numpy(classical_features(x))
    result = cross_validate(
        features, labels, np.arange(len(labels)), 5, 0, classes=["bpsk", "qpsk", "16qam", "fm"]
    )
    assert result.accuracy > 0.8, result.to_dict()


def test_set_partitions_count_bell_numbers():
    # the reference cumulant above is only as good as its partitions
    assert [sum(1 for _ in set_partitions(list(range(n)))) for n in range(1, 7)] == [
        1,
        2,
        5,
        15,
        52,
        203,
    ]
    assert all(
        sorted(itertools.chain.from_iterable(p)) == list(range(4))
        for p in set_partitions(list(range(4)))
    )
