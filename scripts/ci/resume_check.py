"""`.ci/dev resume-check IQTRAIN CONFIG [--set k=v ...] [--gpu-stage]` (`.ci/dev gpu`'s resume
stage).

Runs CONFIG three ways and requires the same metric records (timing fields aside) and the
same final weights and optimizer state from all three: straight through; SIGTERM a third of
the way in, then `iqtrain resume` in a fresh process; and `iqtrain resume --from step_N` of a
checkpoint the straight run wrote. `iqtrain verify` must pass on all four attempts. The second
and third ways run at once (both only read what the straight run left), and so do the four
verifies. Prints the figures, and one ``{"kind": "resume"}`` line to ``$IQTRAIN_GPU_SUMMARY``
when set; leaves its attempts behind only on failure.

``--gpu-stage`` adds GPU_STAGE: the quickstart on CUDA in bf16, compiled and deterministic,
with dropout (so a resumed process must restore the CUDA generator too) and a probe at every
validation (the probe must not touch the training RNG), shortened to 150 steps at batch 256
with three checkpoints and less synthetic data, so the stage fits its limit.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from iqtrain.evidence.metrics import read_metrics, strip_timing

GPU_STAGE = [
    "training.device=cuda",
    "training.precision=bf16",
    "training.compile=true",
    "training.deterministic=true",
    "model.dropout=0.1",
    "training.max_steps=150",
    "schedule.warmup_steps=10",
    "schedule.decay_steps=45",
    "training.eval_every=50",
    "training.checkpoint_every=50",
    "data.batch_size=256",
    "data.val_batch_size=256",
    "probe.every=1",
    "probe.folds=2",
    "probe.synthetic_annotations=70",
    "data.synthetic.train_recordings=8",
    "data.synthetic.val_recordings=2",
]


class Failed(Exception):
    """One line for the stage's error."""


class Check:
    """The three runs of CONFIG under ``root`` with the iqtrain executable ``iq``."""

    def __init__(self, iq: str, config: str, sets: list[str], root: Path) -> None:
        self.iq, self.config, self.sets, self.root = iq, config, sets, root
        self.want: list[dict[str, Any]] = []
        self.want_hashes: dict[str, str] = {}
        self.last = 0
        self.figures: dict[str, Any] = {"kind": "resume"}
        self.logs: dict[int, Path] = {}  # pid -> its output

    def run_args(self, run_dir: Path) -> list[str]:
        return [
            self.config,
            *self.sets,
            "--set",
            f"run.dir={json.dumps(str(run_dir))}",
            "--set",
            "training.keep_last=0",
        ]

    def start(self, *args: object) -> subprocess.Popen[bytes]:
        """``iqtrain ARGS`` in the background, its output to a file under ``root/logs`` (a
        pipe nobody reads while it runs would stall it once full)."""
        logs = self.root / "logs"
        logs.mkdir(exist_ok=True)
        path = logs / f"{len(self.logs):02d}-{args[0]}.log"
        with open(path, "wb") as log:
            proc = subprocess.Popen([self.iq, *map(str, args)], stdout=log, stderr=log)
        self.logs[proc.pid] = path
        return proc

    def finish(self, proc: subprocess.Popen[bytes], ok: int = 0) -> str:
        """Waits for ``proc``: its output, or :class:`Failed` with its last line unless it
        exits ``ok``."""
        proc.wait()
        text = self.logs[proc.pid].read_text(errors="replace")
        if proc.returncode != ok:
            tail = (text.strip().splitlines() or ["(no output)"])[-1]
            args = " ".join(map(str, proc.args[1:])) if isinstance(proc.args, list) else ""
            raise Failed(f"iqtrain {args}: exit {proc.returncode}: {tail}")
        return text

    def iqtrain(self, *args: object) -> float:
        start = time.perf_counter()
        self.finish(self.start(*args))
        return time.perf_counter() - start

    def straight(self) -> Path:
        """1. straight through: the records and hashes the other two must reproduce."""
        attempt = self.root / "straight" / "attempts" / "0001"
        wall = self.iqtrain("run", *self.run_args(self.root / "straight"))
        records = read_metrics(attempt / "metrics.jsonl")
        self.want = strip_timing(records)
        train = [r for r in records if r["kind"] == "train"]
        val = [r for r in records if r["kind"] == "val"]
        self.last = train[-1]["step"]
        self.want_hashes = final_hashes(attempt, self.last)
        rate = statistics.median(r["samples_per_s"] for r in train)
        print(
            f"   straight: {self.last} steps in {wall:.1f} s (with process start, compile and "
            f"validation), median {rate:,.0f} samples/s"
        )
        self.figures.update(steps=self.last, straight_s=round(wall, 1), samples_per_s=rate)
        if val:
            print(
                f"   final val loss {val[-1]['loss']:.5f} ({val[-1]['pred_snr_db']:.2f} dB), "
                f"best {min(r['loss'] for r in val):.5f}"
            )
            self.figures["val_loss"] = val[-1]["loss"]
        return attempt

    def interrupted(self) -> Path:
        """2. SIGTERM a third of the way in; resume the attempt in a fresh process."""
        parent = self.root / "interrupted" / "attempts" / "0001"
        target = max(1, self.last // 3)
        proc = self.start("run", *self.run_args(self.root / "interrupted"))
        while proc.poll() is None and train_steps(parent / "metrics.jsonl") < target:
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        proc.wait()
        if proc.returncode == 0:
            raise Failed(f"the run finished before SIGTERM landed; give it more than {self.last}")
        err = self.finish(proc, ok=proc.returncode)
        if proc.returncode != 143 or "iqtrain resume --attempt" not in err:
            tail = (err.strip().splitlines() or ["(no output)"])[-1]
            raise Failed(
                f"SIGTERM: expected exit 143 and the resume command, got exit "
                f"{proc.returncode}: {tail}"
            )
        stopped = json.loads((parent / "attempt.json").read_text())
        if stopped.get("status") != "interrupted":
            raise Failed(f"{parent}: status {stopped.get('status')!r} after SIGTERM")
        self.iqtrain("resume", "--attempt", parent)
        print(f"   SIGTERM at step {stopped.get('final_step')}, resumed in a fresh process")
        self.figures["sigterm_step"] = stopped.get("final_step")
        return parent.parent / "0002"

    def same_as_straight(self, what: str, attempt: Path) -> None:
        got = strip_timing(read_metrics(attempt / "metrics.jsonl"))
        if got != self.want:
            explain(what, self.want, got)
            raise Failed(f"{what}: its metric records differ from the straight run's")
        if final_hashes(attempt, self.last) != self.want_hashes:
            raise Failed(f"{what}: its final weights or optimizer state differ from the straight's")
        print(
            f"   {what}: {len(got)} records and the step {self.last} weights and optimizer "
            "state are identical to the straight run's"
        )
        self.figures["records"] = len(got)

    def run(self) -> dict[str, Any]:
        start = time.perf_counter()
        straight = self.straight()
        steps = sorted(int(p.name[5:]) for p in (straight / "checkpoints").glob("step_*"))
        earlier = [s for s in steps if s < self.last]
        if not earlier:
            raise Failed(f"{straight}: no checkpoint before step {self.last} to resume from")
        k = earlier[len(earlier) // 2]
        # 3. resume the straight run from one of its own checkpoints, while 2 runs.
        from_step = self.start("resume", "--attempt", straight, "--from", f"step_{k}")
        try:
            resumed = self.interrupted()
        except Failed:
            from_step.kill()
            raise
        self.finish(from_step)
        self.same_as_straight("interrupted + resumed", resumed)
        self.same_as_straight(f"resumed from step_{k}", straight.parent / "0002")
        self.figures["resumed_from"] = k
        # 4. every attempt verifies.
        attempts = [straight, straight.parent / "0002", resumed.parent / "0001", resumed]
        for proc in [self.start("verify", a) for a in attempts]:
            self.finish(proc)
        print(f"   iqtrain verify: {len(attempts)} attempts verified")
        wall = time.perf_counter() - start
        f = self.figures
        f.update(verified=len(attempts), wall_s=round(wall, 1))
        f["line"] = (
            f"{self.last} steps straight in {f['straight_s']} s ({f['samples_per_s']:,.0f} "
            f"samples/s); SIGTERM at step {f.get('sigterm_step')} then resume, and resume --from "
            f"step_{k}: {f.get('records')} metric records and the final weights and optimizer "
            f"state identical to the straight run's; {len(attempts)} attempts verified; "
            f"{wall:.0f} s in all"
        )
        return f


def train_steps(metrics: Path) -> int:
    try:
        lines = metrics.read_bytes().splitlines()
    except FileNotFoundError:
        return 0
    steps = [0]
    for line in lines[-3:]:
        try:
            rec = json.loads(line)
        except ValueError:  # a record still being written
            continue
        if rec.get("kind") == "train":
            steps.append(rec["step"])
    return max(steps)


def final_hashes(attempt: Path, step: int) -> dict[str, str]:
    index = attempt / "checkpoints" / f"step_{step:08d}" / "checkpoint.json"
    doc = json.loads(index.read_text())
    return {k: v["sha256"] for k, v in doc["files"].items() if k.endswith(".safetensors")}


def explain(what: str, want: list[dict[str, Any]], got: list[dict[str, Any]]) -> None:
    """Where ``got``'s records first differ from ``want``'s, and the largest loss difference."""
    i = next(
        (i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b),
        min(len(want), len(got)),
    )
    losses = [
        abs(a["loss"] - b["loss"]) / abs(a["loss"])
        for a, b in zip(want, got, strict=False)
        if a.get("kind") == b.get("kind") == "train" and a["loss"]
    ]
    print(f"   {what}: {i} of {len(want)} records equal; first difference:", file=sys.stderr)
    print(f"     straight: {json.dumps(want[i]) if i < len(want) else 'none'}", file=sys.stderr)
    print(f"     {what}: {json.dumps(got[i]) if i < len(got) else 'none'}", file=sys.stderr)
    print(
        f"     largest relative train-loss difference {max(losses, default=0):.3g}",
        file=sys.stderr,
    )


def _record(figures: dict[str, Any]) -> None:
    summary = os.environ.get("IQTRAIN_GPU_SUMMARY")
    if summary:
        with open(summary, "a") as f:
            f.write(json.dumps(figures) + "\n")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        sys.exit("usage: resume_check.py IQTRAIN CONFIG [--set k=v ...] [--gpu-stage]")
    iq, config, *rest = argv
    root = Path(tempfile.mkdtemp(prefix="iqtrain-resume-check."))
    sets = [a for a in rest if a != "--gpu-stage"]
    if "--gpu-stage" in rest:
        # One synthetic data cache for the three runs: generated once, by the straight run.
        cache = f"data.synthetic.cache_dir={json.dumps(str(root / 'synth'))}"
        sets += [arg for s in [*GPU_STAGE, cache] for arg in ("--set", s)]
    try:
        figures = Check(iq, config, sets, root).run()
    except Failed as exc:
        _record({"kind": "resume", "error": str(exc)})
        print(f"iqtrain: error: resume-check: {exc} (attempts kept in {root})", file=sys.stderr)
        return 1
    _record(figures)
    shutil.rmtree(root)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
