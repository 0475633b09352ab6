"""The recordings an attempt trains and validates on: the configured SigMF globs, or the
synthetic default generated once into a shared, content-addressed cache."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from iqtrain.config.schema import expand_path
from iqtrain.config.sections import (
    SYNTH_MAX_SEED,
    SYNTH_VAL_SEED_OFFSET,
    DataConfig,
    ProbeConfig,
    SynthConfig,
)
from iqtrain.console import note
from iqtrain.data.dataset import IQDataset, ReadOptions, shown_path
from iqtrain.data.synth import synthesize, synthesize_labelled
from iqtrain.data.windows import LabelledSet, labelled_windows
from iqtrain.errors import (
    ConfigError,
    DataError,
    RecordingsRefused,
    StorageError,
    WindowTooLongError,
    as_config_error,
)
from iqtrain.storage import storage_error

__all__ = [
    "PROBE_WINDOWS_PER_ANNOTATION",
    "TrainVal",
    "ensure_synthetic",
    "ensure_synthetic_labelled",
    "ensure_synthetic_probe",
    "open_datasets",
    "open_labelled",
    "probe_patterns",
    "check_sample_rates",
    "format_rate",
    "report_dataset",
    "report_notes",
    "report_skipped",
    "validation_patterns",
]

#: The hint a refusal of training data ends with.
SKIP_HINT = "data.skip_invalid = true trains on the others"

#: Windows in each burst of a synthetic probe set (its bursts are this many windows long).
PROBE_WINDOWS_PER_ANNOTATION = 4

_Set = TypeVar("_Set")


class TrainVal(tuple[_Set, _Set]):
    """The training and validation sets of ``[data]``, a ``(train, val)`` pair, with the one
    sample rate of their recordings (``sample_rate``: :func:`check_sample_rates`' answer, the
    rate a model trained on them is trained at; None when none is recorded, or with
    ``data.sample_rate = "any"`` when they differ)."""

    sample_rate: float | None

    def __new__(cls, train: _Set, val: _Set, sample_rate: float | None) -> TrainVal[_Set]:
        pair = super().__new__(cls, (train, val))
        pair.sample_rate = sample_rate
        return pair

    def __getnewargs__(self) -> tuple[_Set, _Set, float | None]:
        return self[0], self[1], self.sample_rate


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def ensure_synthetic(s: SynthConfig) -> tuple[list[str], list[str]]:
    """Generate (once) the synthetic train/val recordings; return their glob patterns.

    The cache is keyed by the generator's arguments and written through a temporary directory
    and a rename, so concurrent first runs cannot see a half-written set. It lives outside any
    attempt because it is shared, immutable, content-addressed input, not evidence.
    """
    key = json.dumps(
        {
            "v": 1,
            "train": s.train_recordings,
            "val": s.val_recordings,
            "samples": s.samples,
            "datatype": s.datatype,
            "seed": s.seed,
        },
        sort_keys=True,
    )
    root = Path(expand_path(s.cache_dir)) / _sha256_bytes(key.encode())[:16]
    if not (root / "COMPLETE").is_file():

        def write(tmp: Path) -> None:
            for part, count, seed in (
                ("train", s.train_recordings, s.seed),
                ("val", s.val_recordings, s.seed + SYNTH_VAL_SEED_OFFSET),  # never the train set
            ):
                synthesize(
                    tmp / part, recordings=count, samples=s.samples, datatype=s.datatype, seed=seed
                )

        _generate(root, key, write)
    # The cache directory may hold glob characters of its own: only the file name is a pattern.
    escaped = glob.escape(os.fspath(root))
    return [os.path.join(escaped, "train", "*.sigmf-meta")], [
        os.path.join(escaped, "val", "*.sigmf-meta")
    ]


#: A labelled synthetic set's sizes that the config sets only in part (annotations, and bursts
#: of PROBE_WINDOWS_PER_ANNOTATION windows), each refused by synthesize_labelled as its argument:
#: said of the config key that asked for the set.
SYNTH_LABELLED = {
    "annotations": "annotations",
    "burst_samples": f"bursts of {PROBE_WINDOWS_PER_ANNOTATION} windows (burst_samples)",
}


def ensure_synthetic_probe(s: SynthConfig, annotations: int, window: int) -> list[str]:
    """Generate (once) the synthetic labelled probe set of ``[probe] synthetic_annotations``
    (:func:`~iqtrain.data.synth.synthesize_labelled`: bursts of
    :data:`PROBE_WINDOWS_PER_ANNOTATION` windows, classes spread evenly, a seed of its own);
    return its glob pattern. Cached beside the train/val set, written as it is."""
    seed = (s.seed + 2 * SYNTH_VAL_SEED_OFFSET) % (SYNTH_MAX_SEED + 1)  # neither train nor val
    burst = PROBE_WINDOWS_PER_ANNOTATION * window
    key = json.dumps(
        {"v": 1, "probe": annotations, "burst": burst, "datatype": s.datatype, "seed": seed},
        sort_keys=True,
    )
    root = Path(expand_path(s.cache_dir)) / _sha256_bytes(key.encode())[:16]
    if not (root / "COMPLETE").is_file():

        def write(tmp: Path) -> None:
            with as_config_error(SYNTH_LABELLED, prefix="probe.synthetic_annotations: "):
                synthesize_labelled(
                    tmp / "probe",
                    annotations=annotations,
                    burst_samples=burst,
                    datatype=s.datatype,
                    seed=seed,
                )

        _generate(root, key, write)
    return [os.path.join(glob.escape(os.fspath(root)), "probe", "*.sigmf-meta")]


def ensure_synthetic_labelled(s: SynthConfig, window: int) -> tuple[list[str], list[str]]:
    """Generate (once) the synthetic labelled train/val sets a fine-tune uses when
    data.train is empty: bursts of :data:`PROBE_WINDOWS_PER_ANNOTATION` windows, classes spread
    evenly, as many samples in bursts as the next-patch set holds (``samples *
    train_recordings``, ``samples * val_recordings``), each set with a seed of its own (neither
    the next-patch sets' nor the probe set's); their glob patterns."""
    burst = PROBE_WINDOWS_PER_ANNOTATION * window
    sets = []
    for part, recordings, k in (("train", s.train_recordings, 3), ("val", s.val_recordings, 4)):
        seed = (s.seed + k * SYNTH_VAL_SEED_OFFSET) % (SYNTH_MAX_SEED + 1)
        count = max(7, s.samples * recordings // burst)  # at least one burst per class
        key = json.dumps(
            {
                "v": 1,
                "labelled": part,
                "annotations": count,
                "burst": burst,
                "datatype": s.datatype,
                "seed": seed,
            },
            sort_keys=True,
        )
        root = Path(expand_path(s.cache_dir)) / _sha256_bytes(key.encode())[:16]
        if not (root / "COMPLETE").is_file():

            def write(tmp: Path, count: int = count, seed: int = seed, part: str = part) -> None:
                with as_config_error(SYNTH_LABELLED, prefix=f"data.synthetic ({part} set): "):
                    synthesize_labelled(
                        tmp / part,
                        annotations=count,
                        burst_samples=burst,
                        datatype=s.datatype,
                        seed=seed,
                    )

            _generate(root, key, write)
        sets.append([os.path.join(glob.escape(os.fspath(root)), part, "*.sigmf-meta")])
    return sets[0], sets[1]


def open_labelled(d: DataConfig) -> TrainVal[LabelledSet]:
    """A fine-tune's data (a labelled objective's): the windows of ``data.window``
    samples inside the annotations carrying ``data.label_key``, on a grid of ``data.stride``
    from each annotation's start (docs/design.md "Labelled windows for fine-tuning"). The training
    set's selected as a stream's dataset; the validation set's as well (every one once, in order),
    numbered by the training set's classes. No labelled window, one class, or a validation class the
    training set lacks: one DataError line naming the file (exit 2). Their sample rates are checked
    against ``data.sample_rate`` (:func:`check_sample_rates`), the answer kept as
    ``sample_rate``."""
    if d.is_synthetic and d.window * PROBE_WINDOWS_PER_ANNOTATION > d.synthetic.samples:
        raise ConfigError(
            f"data.seq_patches: a burst of {PROBE_WINDOWS_PER_ANNOTATION} windows of {d.window} "
            f"samples is longer than data.synthetic.samples ({d.synthetic.samples})"
        )
    train, val = (
        ensure_synthetic_labelled(d.synthetic, d.window) if d.is_synthetic else (d.train, d.val)
    )
    out: list[LabelledSet] = []
    classes = None
    for key, paths in (("data.train", train), ("data.val", val)):
        try:
            ls = labelled_windows(
                paths,
                d.window,
                stride=d.stride,
                key=d.label_key,
                classes=classes,
                select=True,
                read=ReadOptions(d.channel, d.skip_invalid),
            )
        except WindowTooLongError as exc:
            raise ConfigError(
                f"data.seq_patches: a window of {d.window} samples "
                f"(seq_patches x patch_len) is longer than every recording in {key} ({exc})"
            ) from None
        except RecordingsRefused as exc:
            raise exc.context(key, SKIP_HINT) from None
        except DataError as exc:  # the labels: said of the data list
            raise type(exc)(f"{key}: {exc}") from None
        classes = ls.classes
        out.append(ls)
    rate = check_sample_rates(
        d.sample_rate, {"data.train": out[0].dataset, "data.val": out[1].dataset}
    )
    return TrainVal(out[0], out[1], rate)


def probe_patterns(probe: ProbeConfig, d: DataConfig) -> list[str]:
    """The probe's labelled recordings: ``probe.data``; else, with synthetic data and
    ``probe.synthetic_annotations``, the synthetic probe set; else the validation recordings."""
    if probe.data:
        return list(probe.data)
    if d.is_synthetic and probe.synthetic_annotations:
        return ensure_synthetic_probe(d.synthetic, probe.synthetic_annotations, d.window)
    return validation_patterns(d)


def _generate(root: Path, key: str, write: Callable[[Path], None]) -> None:
    """``write`` the set into a temporary sibling of ``root`` and rename it into place; a
    failure (a full disk) leaves no partial set and names the file, as
    ``data.synthetic.cache_dir``."""

    tmp = root.parent / f".tmp-{root.name}-{os.getpid()}"
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        write(tmp)
        (tmp / "COMPLETE").write_text(key + "\n")
    except (OSError, StorageError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        reason = exc if isinstance(exc, StorageError) else storage_error(tmp, exc)
        raise ConfigError(f"data.synthetic.cache_dir: {reason}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        os.rename(tmp, root)
    except OSError:  # someone else finished first: theirs is identical
        shutil.rmtree(tmp, ignore_errors=True)


def open_datasets(d: DataConfig) -> TrainVal[IQDataset]:
    """The train and validation datasets of ``[data]`` (synthetic when data.train is empty),
    their sample rates checked against ``data.sample_rate`` (:func:`check_sample_rates`), the
    answer kept as ``sample_rate``.

    The config's paths are absolute already (resolved when it was built).
    """
    if d.is_synthetic and d.window > d.synthetic.samples:  # refuse before generating anything
        raise ConfigError(
            f"data.seq_patches: a window of {d.window} samples (seq_patches x patch_len) is "
            f"longer than every synthetic recording ({d.synthetic.samples} samples)"
        )
    train, val = ensure_synthetic(d.synthetic) if d.is_synthetic else (d.train, d.val)
    out = []
    for key, paths in (("data.train", train), ("data.val", val)):
        try:
            ds = IQDataset(
                paths,
                window=d.window,
                stride=d.stride,
                channel=d.channel,
                skip_invalid=d.skip_invalid,
            )
        except WindowTooLongError as exc:
            raise ConfigError(
                f"data.seq_patches: a window of {d.window} samples "
                f"(seq_patches x patch_len) is longer than every recording in {key} ({exc})"
            ) from None
        except RecordingsRefused as exc:
            raise exc.context(key, SKIP_HINT) from None
        out.append(ds)
    rate = check_sample_rates(d.sample_rate, {"data.train": out[0], "data.val": out[1]})
    return TrainVal(out[0], out[1], rate)


def format_rate(rate: float | None) -> str:
    """A sample rate as a person reads it (``2.4 MHz``; ``no core:sample_rate``)."""
    if rate is None:
        return "no core:sample_rate"
    for unit, scale in (("GHz", 1e9), ("MHz", 1e6), ("kHz", 1e3)):
        if rate >= scale:
            return f"{rate / scale:.9g} {unit}"
    return f"{rate:.9g} Hz"


def _rates(sets: dict[str, IQDataset]) -> dict[float | None, list[str]]:
    """Each sample rate (None: none recorded) -> the metadata paths of its recordings."""
    out: dict[float | None, list[str]] = {}
    for ds in sets.values():
        for rec in ds.recordings:
            out.setdefault(rec.sample_rate, []).append(os.fspath(rec.meta_path))
    return out


def check_sample_rates(rule: str | float, sets: dict[str, IQDataset]) -> float | None:
    """The one sample rate of every recording of ``sets`` (None when none records one, or with
    ``rule = "any"`` when they differ), or a DataError (exit 2) naming the rates, their counts
    and ``data.sample_rate``: with ``"same"`` the sets must share one rate (or all have none);
    with a number every recording must have exactly that rate."""
    rates = _rates(sets)
    where = " and ".join(sets)
    if isinstance(rule, float):
        wrong = {r: p for r, p in rates.items() if r != rule}
        if wrong:
            worst = max(wrong, key=lambda r: len(wrong[r]))
            raise DataError(
                f"{where}: data.sample_rate = {rule:g} but "
                + ", ".join(
                    f"{len(p)} recording(s) have {format_rate(r)}" for r, p in wrong.items()
                )
                + f" (e.g. {shown_path(wrong[worst][0])})"
            )
        return rule
    if len(rates) <= 1:
        return next(iter(rates), None)
    if rule == "any":
        return None
    listed = ", ".join(
        f"{format_rate(r)} ({len(p)}, e.g. {shown_path(p[0])})"
        for r, p in sorted(rates.items(), key=lambda kv: -len(kv[1]))
    )
    raise DataError(
        f"{where}: recordings at {len(rates)} sample rates: {listed}; a model sees samples, not "
        'seconds: set data.sample_rate = "any" to mix them, or a rate to keep to one'
    )


def report_dataset(
    key: str,
    ds: IQDataset,
    window: int,
    skip: str = "data.skip_invalid; recorded in attempt.json",
) -> None:
    """The notes on a dataset (rank 0's, in a run; every command that reads recordings gives
    the same): what the reader tolerated, the inputs it read past (``skip`` names the setting
    that did), and the recordings that yield no window of ``window`` samples."""
    report_notes(key, ds)
    if ds.refused:
        shown = "; ".join(line for _, line in ds.refused[:3])
        more = f" (+{len(ds.refused) - 3} more)" if len(ds.refused) > 3 else ""
        count = len(ds.refused)
        note(f"{key}: {count} input(s) cannot be read and are skipped ({skip}): {shown}{more}")
    report_skipped(key, ds, window)


def report_notes(key: str, ds: IQDataset) -> None:
    """One note per kind of tolerated departure from SigMF (field with indices as ``*``):
    how many recordings, the first message and file."""
    kinds: dict[str, tuple[set[str], str, str]] = {}
    for path, field, message in ds.notes:
        kind = re.sub(r"\[\d+\]", "[*]", field)
        paths, _, _ = kinds.setdefault(kind, (set(), message, path))
        paths.add(path)
    for kind, (paths, message, first) in list(kinds.items())[:10]:
        note(
            f"{key}: {kind}: {message} in {len(paths)} recording(s), e.g. {shown_path(first)} "
            "(read as sigmf-python reads it)"
        )
    if len(kinds) > 10:
        note(f"{key}: and {len(kinds) - 10} more kinds of notes")


def report_skipped(key: str, ds: IQDataset, window: int) -> None:
    skipped = ds.skipped
    if skipped:
        names = [shown_path(p) for p, _ in skipped]
        shown = ", ".join(names[:8]) + (f" (+{len(names) - 8} more)" if len(names) > 8 else "")
        note(
            f"{key}: {len(names)} recording(s) yield no window of {window} "
            f"samples (too short, or every capture segment is), skipped: {shown}"
        )


def validation_patterns(d: DataConfig) -> list[str]:
    """The validation recordings' globs: data.val, or the synthetic validation set (generated
    if it is not cached yet)."""
    return ensure_synthetic(d.synthetic)[1] if d.is_synthetic else list(d.val)
