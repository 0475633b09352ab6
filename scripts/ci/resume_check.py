"""`.ci/dev resume-check IQTRAIN CONFIG [--set k=v ...]` (the GPU check's quickstart stage).

Runs CONFIG three ways and requires the same metric records (timing fields aside) and the
same final weights and optimizer state from all three: straight through; SIGTERM a third of
the way in, then `iqtrain resume` in a fresh process; and `iqtrain resume --from step_N` of a
checkpoint the straight run wrote. `iqtrain verify` must pass on all four attempts. Prints the
figures; leaves its attempts behind only on failure.
"""

from __future__ import annotations

import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from iqtrain.evidence.metrics import read_metrics, strip_timing

iq, config, *sets = sys.argv[1:]
root = Path(tempfile.mkdtemp(prefix="iqtrain-resume-check."))


def fail(msg):
    sys.exit(f"iqtrain: error: resume-check: {msg} (attempts kept in {root})")


def iqtrain(*args):
    start = time.perf_counter()
    proc = subprocess.run([iq, *map(str, args)], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        fail(f"iqtrain {' '.join(map(str, args))}: exit {proc.returncode}: {tail}")
    return proc, time.perf_counter() - start


def run_args(run_dir):
    return [
        config,
        *sets,
        "--set",
        f"run.dir={json.dumps(str(run_dir))}",
        "--set",
        "training.keep_last=0",
    ]


def train_steps(metrics):
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


def final_hashes(attempt, step):
    index = attempt / "checkpoints" / f"step_{step:08d}" / "checkpoint.json"
    index = json.loads(index.read_text())
    return {k: v["sha256"] for k, v in index["files"].items() if k.endswith(".safetensors")}


def same_as_straight(what, attempt):
    got = strip_timing(read_metrics(attempt / "metrics.jsonl"))
    if got != want:
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
        fail(f"{what}: its metric records differ from the straight run's")
    if final_hashes(attempt, last) != want_hashes:
        fail(f"{what}: its final weights or optimizer state differ from the straight run's")
    print(
        f"   {what}: {len(got)} records and the step {last} weights and optimizer state "
        "are identical to the straight run's"
    )


# 1. straight through
straight = root / "straight" / "attempts" / "0001"
_, wall = iqtrain("run", *run_args(root / "straight"))
records = read_metrics(straight / "metrics.jsonl")
want = strip_timing(records)
train = [r for r in records if r["kind"] == "train"]
val = [r for r in records if r["kind"] == "val"]
last = train[-1]["step"]
want_hashes = final_hashes(straight, last)
rate = statistics.median(r["samples_per_s"] for r in train)
print(
    f"   straight: {last} steps in {wall:.1f} s (with process start and validation), "
    f"median {rate:,.0f} samples/s"
)
if val:
    print(
        f"   final val loss {val[-1]['loss']:.5f} ({val[-1]['pred_snr_db']:.2f} dB), "
        f"best {min(r['loss'] for r in val):.5f}"
    )

# 2. SIGTERM a third of the way in, resume the interrupted attempt in a fresh process
parent = root / "interrupted" / "attempts" / "0001"
target = max(1, last // 3)
proc = subprocess.Popen(
    [iq, "run", *run_args(root / "interrupted")],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
)
while proc.poll() is None and train_steps(parent / "metrics.jsonl") < target:
    time.sleep(0.01)
proc.send_signal(signal.SIGTERM)
_, err = proc.communicate()
if proc.returncode == 0:
    fail(f"the run finished before SIGTERM landed; give it more steps than {last}")
if proc.returncode != 143 or "iqtrain resume --attempt" not in err:
    tail = (err.strip().splitlines() or ["(no output)"])[-1]
    fail(f"SIGTERM: expected exit 143 and the resume command, got exit {proc.returncode}: {tail}")
stopped = json.loads((parent / "attempt.json").read_text())
if stopped.get("status") != "interrupted":
    fail(f"{parent}: status {stopped.get('status')!r} after SIGTERM, expected 'interrupted'")
iqtrain("resume", "--attempt", parent)
print(f"   SIGTERM at step {stopped.get('final_step')}, resumed in a fresh process")
same_as_straight("interrupted + resumed", parent.parent / "0002")

# 3. resume the straight run from one of its own checkpoints
steps = sorted(int(p.name[5:]) for p in (straight / "checkpoints").glob("step_*"))
earlier = [s for s in steps if s < last]
if not earlier:
    fail(f"{straight}: no checkpoint before step {last} to resume from")
k = earlier[len(earlier) // 2]
iqtrain("resume", "--attempt", straight, "--from", f"step_{k}")
same_as_straight(f"resumed from step_{k}", straight.parent / "0002")

# 4. every attempt verifies
attempts = [straight, straight.parent / "0002", parent, parent.parent / "0002"]
for attempt in attempts:
    iqtrain("verify", attempt)
print(f"   iqtrain verify: {len(attempts)} attempts verified")
shutil.rmtree(root)
