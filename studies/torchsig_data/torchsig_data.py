"""Labelled held-out SigMF recordings from TorchSig (a generator independent of ``iqtrain synth``).

Venv: its own, NOT the project's (TorchSig and its dependencies stay out of it). It needs only
``torchsig`` (2.x; tested with 2.2.0), ``numpy`` and the standard library (no ``sigmf``: the
metadata JSON is written by hand; no iqtrain)::

    python3 -m venv TSVENV && TSVENV/bin/pip install -r studies/torchsig_data/requirements.txt
    TSVENV/bin/python studies/torchsig_data/torchsig_data.py OUT_DIR --seed 1 \\
        --per-class 64 --samples 4096

Data: none read; it writes the labelled sets the other studies probe and fine-tune on (seed 1:
the select set and fine-tuning pool, seed 2: the report set). Nothing it writes is committed.

What one example is: one ``torchsig.datasets.datasets.TorchSigIterableDataset`` sample with exactly
one component signal that fills the whole buffer (``num_signals_min = num_signals_max = 1``,
``signal_duration_in_samples_min = _max = L``, ``num_iq_samples_dataset = L``). TorchSig builds the
isolated baseband signal of the class (random bandwidth, uniform integer Hz in
[fs/4, fs/3], TorchSig's own default range; symbol rate / subcarrier spacing / FM deviation
follow from it), scales it to a random SNR, shifts it to a random centre frequency (uniform in
[-fs/4, +fs/4]) and adds it onto a complex AWGN floor. No TorchSig impairments are applied (the
``Impairments`` level-0 "perfect" setting: AWGN + frequency offset only).

SNR (``torchsig:snr_db``, drawn by TorchSig uniform in [--snr-min, --snr-max], rounded to 0.1 dB) is
TorchSig's definition (``torchsig.utils.dsp.update_signal_snr_bandwidth``): the peak bin of the
signal's time-averaged FFT power spectrum over the noise floor's mean FFT-bin power, i.e. an
IN-BAND (per-bin PSD) SNR, not the SNR over the sampled bandwidth that ``iqtrain synth`` annotates.
Each annotation also carries the measured SNR over the whole sampled bandwidth
(``torchsig:snr_fullband_db`` = 10 log10(signal power / noise power), from the component signal
and the noise TorchSig actually added), comparable with ``iqtrain:snr_db`` of ``iqtrain synth``.

Each example is then scaled to unit mean power (signal + noise; the project normalises per window
anyway). Examples are laid back to back, all classes shuffled together with a seeded permutation,
``--per-recording`` examples per recording (``torchsig_NNNN.sigmf-{meta,data}``, cf32_le), one
annotation per example with ``core:label`` (the project's spelling: BPSK QPSK 8PSK 16QAM 64QAM
2GFSK OFDM-64 FM) and the TorchSig class name in ``torchsig:class_name``. ``OUT_DIR/torchsig.json``
records the TorchSig version, seed, classes, ranges and counts.

Determinism: class k draws only from its own dataset seeded with
``SeedSequence([seed, k]).generate_state(2, uint64)`` (first word), and the shuffle from
``SeedSequence([seed, 1_000_003])``; same torchsig/numpy versions give identical bytes.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
import warnings

import numpy as np
import torchsig
from torchsig.datasets.datasets import TorchSigIterableDataset

#: TorchSig generator name -> label written to core:label.
CLASSES = {
    "bpsk": "BPSK",
    "qpsk": "QPSK",
    "8psk": "8PSK",
    "16qam": "16QAM",
    "64qam": "64QAM",
    "2gfsk": "2GFSK",
    "ofdm-64": "OFDM-64",
    "fm": "FM",
}
SAMPLE_RATE = 10_000_000  # TorchSig's default sample rate (Hz)
FFT_SIZE = 128  # TorchSig's PSD estimate for SNR setting / bandwidth labels (32 frames at L=4096)
EXT = {"name": "torchsig", "version": "1.0.0", "optional": True}


def dataset_metadata(samples: int, snr_min: float, snr_max: float) -> dict:
    fs = SAMPLE_RATE
    return {
        "num_iq_samples_dataset": samples,
        "num_signals_min": 1,
        "num_signals_max": 1,
        "fft_size": FFT_SIZE,
        "fft_stride": FFT_SIZE,
        "sample_rate": fs,
        "noise_power_db": 0.0,
        "snr_db_min": snr_min,
        "snr_db_max": snr_max,
        "cochannel_overlap_probability": 0.0,
        "signal_duration_in_samples_min": samples,
        "signal_duration_in_samples_max": samples,
        "bandwidth_min": fs // 4,  # TorchSig default 2.5 MHz
        "bandwidth_max": fs // 3,  # TorchSig default 3.333 MHz
        "signal_center_freq_min": -fs // 4,
        "signal_center_freq_max": fs // 4,
        # Edges stay inside Nyquist (|fc| + bw/2 <= 5/12 fs), so TorchSig never applies its
        # anti-aliasing cut (its default +-fs/4 limit would chop most offset signals).
        "frequency_min": -fs // 2,
        "frequency_max": fs // 2 - 1,
    }


def class_seed(seed: int, k: int) -> int:
    return int(np.random.SeedSequence([seed, k]).generate_state(2, np.uint64)[0] >> np.uint64(1))


def generate_class(name: str, k: int, args: argparse.Namespace) -> list[dict]:
    md = dataset_metadata(args.samples, args.snr_min, args.snr_max)
    ds = TorchSigIterableDataset(
        signal_generators=[name], metadata=md, seed=class_seed(args.seed, k), target_labels=None
    )
    out = []
    for _ in range(args.per_class):
        s = next(ds)
        (comp,) = s.component_signals
        x = np.asarray(s.data, dtype=np.complex128)
        assert x.shape == (args.samples,) and comp.start_in_samples == 0
        assert comp.duration_in_samples == args.samples and comp.class_name == name
        sig = np.asarray(comp.data, dtype=np.complex128)
        p_sig = float(np.mean(np.abs(sig) ** 2))
        p_noise = float(np.mean(np.abs(x - sig) ** 2))
        p_tot = float(np.mean(np.abs(x) ** 2))
        out.append(
            {
                "x": x / np.sqrt(p_tot),
                "label": CLASSES[name],
                "class_name": name,
                "snr_db": float(comp.snr_db),
                "snr_fullband_db": round(10 * np.log10(p_sig / p_noise), 3),
                "center_freq_hz": round(float(comp.center_freq), 1),
                "bandwidth_hz": round(float(comp.bandwidth), 1),
            }
        )
    return out


def write_recording(out: pathlib.Path, i: int, examples: list[dict], args) -> None:
    L = args.samples
    inter = np.empty(2 * L * len(examples), dtype="<f4")
    anns = []
    for j, e in enumerate(examples):
        inter[2 * j * L : 2 * (j + 1) * L : 2] = e["x"].real
        inter[2 * j * L + 1 : 2 * (j + 1) * L : 2] = e["x"].imag
        anns.append(
            {
                "core:sample_start": j * L,
                "core:sample_count": L,
                "core:label": e["label"],
                "torchsig:class_name": e["class_name"],
                "torchsig:snr_db": e["snr_db"],
                "torchsig:snr_fullband_db": e["snr_fullband_db"],
                "torchsig:center_freq_hz": e["center_freq_hz"],
                "torchsig:bandwidth_est_hz": e["bandwidth_hz"],
            }
        )
    meta = {
        "global": {
            "core:datatype": "cf32_le",
            "core:sample_rate": float(SAMPLE_RATE),
            "core:version": "1.0.0",
            "core:description": f"TorchSig {torchsig.__version__} narrowband, seed {args.seed}",
            "core:extensions": [EXT],
        },
        "captures": [{"core:sample_start": 0}],
        "annotations": anns,  # already sorted by sample_start
    }
    stem = out / f"torchsig_{i:04d}"
    stem.with_suffix(".sigmf-data").write_bytes(inter.tobytes())
    stem.with_suffix(".sigmf-meta").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", type=pathlib.Path)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--per-class", type=int, default=64)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--per-recording", type=int, default=64)
    p.add_argument("--snr-min", type=float, default=-2.0)
    p.add_argument("--snr-max", type=float, default=30.0)
    args = p.parse_args(argv)
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("torchsig_*.sigmf-*")):
        old.unlink()  # never mix two runs in one directory

    t0 = time.perf_counter()
    examples: list[dict] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for k, name in enumerate(CLASSES):
            examples += generate_class(name, k, args)
    t_gen = time.perf_counter() - t0
    order = np.random.default_rng(np.random.SeedSequence([args.seed, 1_000_003])).permutation(
        len(examples)
    )
    examples = [examples[i] for i in order]
    chunks = [
        examples[i : i + args.per_recording] for i in range(0, len(examples), args.per_recording)
    ]
    for i, chunk in enumerate(chunks):
        write_recording(out, i, chunk, args)

    snr = np.array([e["snr_db"] for e in examples])
    full = np.array([e["snr_fullband_db"] for e in examples])
    side = {
        "torchsig_version": torchsig.__version__,
        "numpy_version": np.__version__,
        "seed": args.seed,
        "classes": CLASSES,
        "sample_rate": SAMPLE_RATE,
        "samples_per_example": args.samples,
        "per_class": args.per_class,
        "examples": len(examples),
        "recordings": len(chunks),
        "per_recording": args.per_recording,
        "snr_db_range": [args.snr_min, args.snr_max],
        "snr_definition": "torchsig in-band: peak FFT-bin PSD of signal over mean noise FFT-bin "
        f"power (fft_size {FFT_SIZE}), uniform, rounded to 0.1 dB; torchsig:snr_fullband_db is "
        "measured signal/noise power over the whole sample rate",
        "snr_fullband_db_observed": [float(full.min()), float(full.max())],
        "snr_db_observed": [float(snr.min()), float(snr.max())],
        "bandwidth_hz_range": [SAMPLE_RATE // 4, SAMPLE_RATE // 3],
        "center_freq_hz_range": [-SAMPLE_RATE // 4, SAMPLE_RATE // 4],
        "impairments": "none (AWGN + frequency offset only)",
        "normalisation": "each example scaled to unit mean power",
        "dataset_metadata": dataset_metadata(args.samples, args.snr_min, args.snr_max),
        "generation_seconds": round(t_gen, 2),
    }
    (out / "torchsig.json").write_text(json.dumps(side, indent=2) + "\n")
    print(
        f"{out}: {len(examples)} examples in {len(chunks)} recordings, "
        f"generated in {t_gen:.1f}s (torchsig {torchsig.__version__})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
