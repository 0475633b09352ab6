"""prepare_iq_input: the PyTorch reference (the specification) and the Triton kernel against it.

Without a GPU, conftest.py sets TRITON_INTERPRET=1 and the kernel runs in the Triton interpreter
on CPU tensors; with one, the CUDA tests run the compiled kernel over the same grid.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import os
from pathlib import Path

import pytest
import torch

from iqtrain.model import prepare
from iqtrain.model.prepare import prepare_iq_input, prepare_iq_input_reference

REPO = Path(__file__).resolve().parents[3]
HAVE_TRITON = importlib.util.find_spec("triton") is not None
HAVE_CUDA = torch.cuda.is_available()

needs_triton = pytest.mark.skipif(
    not HAVE_TRITON, reason="needs triton (a dependency on Linux x86_64 only)"
)


def _interpreter_on() -> bool:
    if not HAVE_TRITON:
        return False
    from iqtrain.kernels import normalize_patch

    return normalize_patch.interpreted()


needs_interpreter = pytest.mark.skipif(
    not _interpreter_on(),
    reason="needs the Triton interpreter (TRITON_INTERPRET=1, set by conftest.py without a GPU)",
)

BATCHES = (1, 3, 8)
LENGTHS = (16, 48, 1024, 4096)
PATCH_LENS = (1, 4, 16, 32)
IN_DTYPES = (torch.int8, torch.int16, torch.float32)
NORMS = ("window", "prefix")
_OUT_DTYPES = (torch.float32, torch.bfloat16)
# Every (L, P) with P dividing L: 14 pairs. The full product with B, dtype and norm is 252 cases;
# the whole file runs in about 10 s on 2 CPU cores with the interpreter, so nothing is trimmed.
GRID = [
    pytest.param(b, length, p, dtype, norm, id=f"B{b}-L{length}-P{p}-{str(dtype)[6:]}-{norm}")
    for length, p in itertools.product(LENGTHS, PATCH_LENS)
    if length % p == 0
    for b, dtype, norm in itertools.product(BATCHES, IN_DTYPES, NORMS)
]


def make_raw(batch: int, length: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """A raw batch spanning the dtype's range (float32: Gaussian with a per-window level)."""
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.float32:
        level = torch.logspace(-3, 3, batch)[:, None, None]
        return torch.randn(batch, length, 2, generator=gen) * level
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max + 1, (batch, length, 2), generator=gen, dtype=dtype)


def prefix_for(length: int, patch_len: int) -> int:
    # 3 patches where the window has them: a prefix span that is not a power of two exercises the
    # masked tail of the kernel's first pass.
    return min(3, length // patch_len)


def assert_matches(got, want) -> None:
    patches, scale = got
    want_patches, want_scale = want
    assert patches.shape == want_patches.shape
    assert patches.dtype == want_patches.dtype
    assert scale.shape == want_scale.shape and scale.dtype == torch.float32
    # Only the summation order differs (blocked lanes vs torch's reduction): a few fp32 ulps.
    torch.testing.assert_close(scale.cpu(), want_scale.cpu(), rtol=2e-6, atol=0)
    if patches.dtype == torch.float32:
        torch.testing.assert_close(patches.cpu(), want_patches.cpu(), rtol=2e-6, atol=1e-6)
    else:
        # A one-ulp fp32 difference can flip a bf16 rounding: allow one bf16 ulp (2^-7 relative).
        torch.testing.assert_close(
            patches.cpu().float(), want_patches.cpu().float(), rtol=2**-7, atol=1e-6
        )


# --------------------------------------------------------------------------------------------
# Reference: the specification itself


def test_reference_layout_hand_built() -> None:
    # Six samples, P = 2: three patches. Every sample has |s|^2 = 25 in the first patch and 2500
    # afterwards, so the scales are round numbers.
    samples = [(3, 4), (0, -5), (30, 40), (-50, 0), (0, 50), (-40, 30)]
    raw = torch.tensor([samples], dtype=torch.int16)

    patches, scale = prepare_iq_input_reference(raw, 2)
    window_scale = math.sqrt((2 * 25 + 4 * 2500) / 6)
    expected = torch.tensor(
        [[[3, 4, 0, -5], [30, 40, -50, 0], [0, 50, -40, 30]]], dtype=torch.float32
    ) / torch.tensor(window_scale)
    assert patches.shape == (1, 3, 4) and patches.dtype == torch.float32
    torch.testing.assert_close(scale, torch.tensor([window_scale]), rtol=1e-7, atol=0)
    torch.testing.assert_close(patches, expected, rtol=1e-6, atol=0)

    patches, scale = prepare_iq_input_reference(raw, 2, norm="prefix", prefix_patches=1)
    torch.testing.assert_close(scale, torch.tensor([5.0]), rtol=1e-7, atol=0)
    expected = torch.tensor(
        [[[0.6, 0.8, 0.0, -1.0], [6.0, 8.0, -10.0, 0.0], [0.0, 10.0, -8.0, 6.0]]]
    )
    torch.testing.assert_close(patches, expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("factor", [1e-3, 0.37, 2.0, 5e4])
def test_reference_scale_invariance(norm: str, factor: float) -> None:
    # Unit-power windows, so eps (1e-12) stays negligible next to the power even at factor 1e-3.
    raw = torch.randn(4, 256, 2, generator=torch.Generator().manual_seed(1))
    patches, scale = prepare_iq_input_reference(raw, 16, norm=norm)
    scaled_patches, scaled_scale = prepare_iq_input_reference(raw * factor, 16, norm=norm)
    torch.testing.assert_close(scaled_patches, patches, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(scaled_scale, scale * factor, rtol=1e-5, atol=0)


def test_reference_int8_and_int16_agree_exactly() -> None:
    # Scaling by 256 is exact in fp32, so the same signal stored as int8 and as int16 << 8 must
    # give bit-identical patches: the input dtype changes nothing but the stored level.
    raw8 = make_raw(3, 128, torch.int8, seed=2)
    raw16 = raw8.to(torch.int16) * 256
    patches8, scale8 = prepare_iq_input_reference(raw8, 8)
    patches16, scale16 = prepare_iq_input_reference(raw16, 8)
    assert torch.equal(patches8, patches16)
    assert torch.equal(scale8 * 256, scale16)


def test_reference_scale_is_exact_for_integer_input() -> None:
    # The power is an exact integer sum in float64, so the scale does not depend on the order
    # of summation (what makes the compiled reference bit-identical to the eager one): a
    # permutation of the samples leaves it bit-identical, and it equals the exact value
    # computed with Python integers, rounded once.
    raw = make_raw(4, 4096, torch.int16, seed=3)
    perm = torch.randperm(4096, generator=torch.Generator().manual_seed(0))
    _, scale = prepare_iq_input_reference(raw, 16)
    _, scale_perm = prepare_iq_input_reference(raw[:, perm], 16)
    assert torch.equal(scale, scale_perm)
    for b in range(4):
        power = sum(int(v) ** 2 for v in raw[b].flatten().tolist())
        exact = math.sqrt(power / 4096 + 1e-12)  # fp64 of the exact integer sum
        assert scale[b].item() == torch.tensor(exact, dtype=torch.float32).item()


def test_reference_prefix_ignores_later_samples() -> None:
    raw = make_raw(2, 64, torch.float32, seed=3)
    patch_len, prefix = 4, 3
    edited = raw.clone()
    edited[:, prefix * patch_len :, :] = 1e6  # everything after the prefix, changed wildly
    edited[1, -1, 0] = float("nan")
    patches, scale = prepare_iq_input_reference(
        raw, patch_len, norm="prefix", prefix_patches=prefix
    )
    e_patches, e_scale = prepare_iq_input_reference(
        edited, patch_len, norm="prefix", prefix_patches=prefix
    )
    assert torch.equal(e_scale, scale)
    assert torch.equal(e_patches[:, :prefix], patches[:, :prefix])
    # ...but whole-window normalisation does see them.
    _, w_scale = prepare_iq_input_reference(edited, patch_len, norm="window")
    assert w_scale[0] > 1e5 and torch.isnan(w_scale[1])


def test_reference_window_defaults_ignore_prefix_patches() -> None:
    # L/P = 1 patch is fewer than the default prefix_patches=4: fine, it only matters for "prefix".
    patches, _ = prepare_iq_input_reference(make_raw(2, 16, torch.int16), 16)
    assert patches.shape == (2, 1, 32)


def test_reference_traces_without_graph_breaks() -> None:
    # fullgraph=True fails on any graph break (e.g. Python branching on tensor values). The
    # "eager" backend traces with dynamo only, skipping inductor's ~30 s code generation.
    compiled = torch.compile(prepare_iq_input_reference, backend="eager", fullgraph=True)
    raw = make_raw(2, 64, torch.int16)
    for norm in NORMS:
        got = compiled(raw, 8, norm=norm, prefix_patches=2, out_dtype=torch.bfloat16)
        want = prepare_iq_input_reference(
            raw, 8, norm=norm, prefix_patches=2, out_dtype=torch.bfloat16
        )
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# --------------------------------------------------------------------------------------------
# Behaviour every backend shares


def _backends() -> list:
    triton_param = pytest.param("triton", marks=needs_interpreter)
    return ["torch", triton_param]


@pytest.mark.parametrize("backend", _backends())
def test_all_zero_window_gives_finite_zeros(backend: str) -> None:
    raw = make_raw(3, 64, torch.int16)
    raw[1] = 0
    for norm in NORMS:
        patches, scale = prepare_iq_input(raw, 8, norm=norm, backend=backend)
        assert torch.isfinite(patches).all() and torch.isfinite(scale).all()
        assert torch.equal(patches[1], torch.zeros_like(patches[1]))
        assert scale[1].item() == pytest.approx(1e-6, rel=1e-6)  # sqrt(eps)


@pytest.mark.parametrize("backend", _backends())
def test_int16_extremes_are_exact(backend: str) -> None:
    # (-32768, -32768) has I^2 + Q^2 = 2^31: past int32, so any integer accumulation would wrap.
    # Every partial sum of powers of two is exact in fp32, so scale and patches have exactly one
    # correct value each, which both backends must hit bit for bit.
    lo, hi = -32768, 32767
    raw = torch.full((2, 1024, 2), lo, dtype=torch.int16)
    raw[1, 1::2] = hi  # window 1 alternates the two extremes: sums no longer exact in fp32
    for norm in NORMS:
        patches, scale = prepare_iq_input(raw, 16, norm=norm, backend=backend)
        want_scale = torch.sqrt(torch.tensor(2.0**31) + 1e-12)
        assert scale[0] == want_scale
        assert torch.equal(patches[0], torch.full_like(patches[0], lo) * (1 / want_scale))
        assert (patches[0] < 0).all()  # no sign flip from an int16 negation
        # Window 1 against float64 arithmetic: fp32 accumulation of values ~2^31 stays tight.
        exact = raw[1].double()
        n = exact.shape[0] if norm == "window" else 4 * 16
        scale64 = torch.sqrt(exact[:n].square().sum() / n + 1e-12)
        assert scale[1].double().item() == pytest.approx(scale64.item(), rel=1e-6)
        torch.testing.assert_close(
            patches[1].double(), (exact / scale64).reshape(64, 32), rtol=2e-6, atol=0
        )
        assert_matches((patches, scale), prepare_iq_input_reference(raw, 16, norm=norm))


@pytest.mark.parametrize("backend", _backends())
def test_nan_propagates(backend: str) -> None:
    raw = make_raw(3, 256, torch.float32)
    raw[1, 5, 1] = float("nan")
    raw[2, 200, 0] = float("nan")  # after a 4x16-sample prefix
    patches, scale = prepare_iq_input(raw, 16, backend=backend)
    assert torch.isfinite(patches[0]).all() and torch.isfinite(scale[0])
    assert torch.isnan(patches[1]).all() and torch.isnan(scale[1])
    assert torch.isnan(patches[2]).all()

    patches, scale = prepare_iq_input(raw, 16, norm="prefix", prefix_patches=4, backend=backend)
    assert torch.isnan(patches[1]).all() and torch.isnan(scale[1])
    # The prefix scale of window 2 never sees its NaN; only the NaN sample itself stays NaN.
    assert torch.isfinite(scale[2])
    assert torch.isnan(patches[2]).sum() == 1 and torch.isnan(patches[2, 200 // 16]).any()


@pytest.mark.parametrize("backend", _backends())
def test_empty_batch(backend: str) -> None:
    patches, scale = prepare_iq_input(torch.zeros(0, 64, 2, dtype=torch.int8), 8, backend=backend)
    assert patches.shape == (0, 8, 16) and scale.shape == (0,)


def test_auto_uses_reference_for_cpu_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_triton(*args: object, **kwargs: object) -> None:
        raise AssertionError("auto must not pick Triton for a CPU tensor")

    monkeypatch.setattr(prepare, "_triton_launcher", no_triton)
    raw = make_raw(2, 64, torch.int16)
    got = prepare_iq_input(raw, 8)
    want = prepare_iq_input_reference(raw, 8)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# --------------------------------------------------------------------------------------------
# Errors: ValueError naming the argument


BAD_ARGS = [
    ([[1, 2]], {}, "raw"),
    (torch.zeros(4, 2, dtype=torch.int16), {}, "raw"),
    (torch.zeros(1, 4, 3, dtype=torch.int16), {}, "raw"),
    (torch.zeros(1, 4, 2, 1, dtype=torch.int16), {}, "raw"),
    (torch.zeros(1, 4, 2, dtype=torch.uint8), {}, "raw"),
    (torch.zeros(1, 4, 2, dtype=torch.int32), {}, "raw"),
    (torch.zeros(1, 4, 2, dtype=torch.float64), {}, "raw"),
    (torch.zeros(1, 4, 2, dtype=torch.bfloat16), {}, "raw"),
    (torch.zeros(1, 0, 2, dtype=torch.int16), {}, "raw"),
    (None, {"patch_len": 0}, "patch_len"),
    (None, {"patch_len": -4}, "patch_len"),
    (None, {"patch_len": 4.0}, "patch_len"),
    (None, {"patch_len": True}, "patch_len"),
    (torch.zeros(1, 48, 2, dtype=torch.int16), {"patch_len": 32}, "patch_len"),
    (None, {"norm": "rms"}, "norm"),
    (None, {"norm": "prefix", "prefix_patches": 5}, "prefix_patches"),  # 16 / 4 = 4 patches
    (None, {"norm": "prefix", "prefix_patches": 0}, "prefix_patches"),
    (None, {"norm": "prefix", "prefix_patches": 2.0}, "prefix_patches"),
    (None, {"eps": 0.0}, "eps"),
    (None, {"eps": -1e-12}, "eps"),
    (None, {"eps": float("nan")}, "eps"),
    (None, {"eps": "1e-12"}, "eps"),
    (None, {"out_dtype": torch.float16}, "out_dtype"),
    (None, {"out_dtype": torch.int16}, "out_dtype"),
    (None, {"backend": "cuda"}, "backend"),
    (None, {"backend": "Triton"}, "backend"),
]


@pytest.mark.parametrize(
    ("raw", "kwargs", "name"), BAD_ARGS, ids=[f"{i}-{case[2]}" for i, case in enumerate(BAD_ARGS)]
)
# Validation precedes dispatch, so "triton" raises the same errors even where triton is missing.
@pytest.mark.parametrize("backend", ["torch", "auto", "triton"])
def test_bad_argument_raises_value_error_naming_it(raw, kwargs, name, backend) -> None:
    if raw is None:
        raw = torch.zeros(2, 16, 2, dtype=torch.int16)
    kwargs = {"patch_len": 4, "backend": backend, **kwargs}
    patch_len = kwargs.pop("patch_len")
    with pytest.raises(ValueError, match=rf"^{name}: "):
        prepare_iq_input(raw, patch_len, **kwargs)
    if name != "backend" and backend == "torch":
        kwargs.pop("backend")
        with pytest.raises(ValueError, match=rf"^{name}: "):
            prepare_iq_input_reference(raw, patch_len, **kwargs)


@needs_triton
def test_triton_on_cpu_without_interpreter_names_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    from iqtrain.kernels import normalize_patch

    monkeypatch.setattr(normalize_patch, "interpreted", lambda: False)
    with pytest.raises(ValueError, match=r"^backend: .*TRITON_INTERPRET=1"):
        prepare_iq_input(torch.zeros(1, 16, 2, dtype=torch.int16), 4, backend="triton")


@needs_triton
@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"raw": torch.zeros(1, 16, 3)}, "raw"),
        ({"raw": torch.zeros(1, 16, 2, dtype=torch.float64)}, "raw"),
        ({"patch_len": 5}, "patch_len"),
        ({"norm": "prefix", "prefix_patches": 9}, "prefix_patches"),
        ({"norm": "l2"}, "norm"),
        ({"out_dtype": torch.float16}, "out_dtype"),
    ],
)
def test_kernel_launcher_validates(kwargs: dict, name: str) -> None:
    from iqtrain.kernels.normalize_patch import normalize_patch

    args = {
        "raw": torch.zeros(1, 16, 2),
        "patch_len": 4,
        "norm": "window",
        "prefix_patches": 4,
        "eps": 1e-12,
        "out_dtype": torch.float32,
        **kwargs,
    }
    raw, patch_len = args.pop("raw"), args.pop("patch_len")
    with pytest.raises(ValueError, match=rf"^{name}: "):
        normalize_patch(raw, patch_len, **args)


# --------------------------------------------------------------------------------------------
# Packaging: the kernel ships as iqtrain.kernels.normalize_patch


def test_package_kernel_is_a_file_symlink_to_kernels_dir() -> None:
    link = REPO / "python" / "iqtrain" / "kernels" / "normalize_patch.py"
    # A file symlink, because maturin follows those into the wheel and skips directory ones.
    assert link.is_symlink()
    assert link.resolve() == (REPO / "kernels" / "normalize_patch.py").resolve()


@needs_triton
def test_imported_kernel_module_is_the_kernels_source() -> None:
    import iqtrain.kernels.normalize_patch as module

    source = (REPO / "kernels" / "normalize_patch.py").read_bytes()
    assert Path(module.__file__).read_bytes() == source
    assert module.__name__ == "iqtrain.kernels.normalize_patch"


# --------------------------------------------------------------------------------------------
# Triton interpreter (CPU) against the reference


@needs_interpreter
@pytest.mark.parametrize(("batch", "length", "patch_len", "dtype", "norm"), GRID)
def test_interpreted_kernel_matches_reference(batch, length, patch_len, dtype, norm) -> None:
    raw = make_raw(batch, length, dtype, seed=length + patch_len)
    kwargs = {"norm": norm, "prefix_patches": prefix_for(length, patch_len)}
    got = prepare_iq_input(raw, patch_len, backend="triton", **kwargs)
    assert_matches(got, prepare_iq_input_reference(raw, patch_len, **kwargs))


@needs_interpreter
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize(("length", "patch_len"), [(16, 1), (48, 16), (1024, 32), (4096, 4)])
def test_interpreted_kernel_multi_block_loops(
    monkeypatch: pytest.MonkeyPatch, length: int, patch_len: int, norm: str
) -> None:
    # The grid's windows fit one block (cap 8192 elements); a 32-element cap makes both passes
    # loop over many blocks with a masked tail (L=48 prefix: 3 x 16 x 2 = 96 values, 3 blocks).
    from iqtrain.kernels import normalize_patch

    monkeypatch.setattr(normalize_patch, "_MAX_BLOCK", 32)
    raw = make_raw(3, length, torch.int16, seed=5)
    kwargs = {"norm": norm, "prefix_patches": prefix_for(length, patch_len)}
    got = prepare_iq_input(raw, patch_len, backend="triton", **kwargs)
    assert_matches(got, prepare_iq_input_reference(raw, patch_len, **kwargs))


@needs_interpreter
@pytest.mark.parametrize("norm", NORMS)
def test_interpreted_kernel_long_window_bf16_and_non_contiguous(norm: str) -> None:
    # 65,536 samples: 16 blocks per pass. The input is a transposed view, so the launcher has to
    # make it contiguous; bf16 output checks the cast in the store.
    planar = make_raw(2, 65536, torch.int16, seed=7).transpose(1, 2).contiguous()  # [B, 2, L]
    raw = planar.transpose(1, 2)
    assert not raw.is_contiguous()
    for out_dtype in _OUT_DTYPES:
        kwargs = {"norm": norm, "prefix_patches": 1000, "out_dtype": out_dtype}
        got = prepare_iq_input(raw, 16, backend="triton", **kwargs)
        assert_matches(got, prepare_iq_input_reference(raw, 16, **kwargs))


# --------------------------------------------------------------------------------------------
# CUDA: the compiled kernel against the reference


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", _OUT_DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize(("batch", "length", "patch_len", "dtype", "norm"), GRID)
def test_cuda_kernel_matches_reference(batch, length, patch_len, dtype, norm, out_dtype) -> None:
    raw = make_raw(batch, length, dtype, seed=length + patch_len)
    kwargs = {"norm": norm, "prefix_patches": prefix_for(length, patch_len), "out_dtype": out_dtype}
    got = prepare_iq_input(raw.cuda(), patch_len, backend="triton", **kwargs)
    assert got[0].is_cuda and got[1].is_cuda
    assert_matches(got, prepare_iq_input_reference(raw, patch_len, **kwargs))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", IN_DTYPES)
@pytest.mark.parametrize("out_dtype", _OUT_DTYPES, ids=["fp32", "bf16"])
def test_cuda_kernel_long_windows(dtype: torch.dtype, out_dtype: torch.dtype) -> None:
    raw = make_raw(5, 65536, dtype, seed=11)
    for norm in NORMS:
        kwargs = {"norm": norm, "prefix_patches": 1000, "out_dtype": out_dtype}
        got = prepare_iq_input(raw.cuda(), 16, **kwargs)  # auto picks Triton for CUDA
        assert_matches(got, prepare_iq_input_reference(raw, 16, **kwargs))


@pytest.mark.gpu
def test_cuda_auto_uses_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_reference(*args: object, **kwargs: object) -> None:
        raise AssertionError("auto must pick Triton for a CUDA tensor")

    monkeypatch.setattr(prepare, "prepare_iq_input_reference", no_reference)
    patches, scale = prepare_iq_input(make_raw(2, 64, torch.int16).cuda(), 8)
    assert patches.is_cuda and scale.is_cuda


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_cuda_special_values(backend: str) -> None:
    raw = torch.full((3, 4096, 2), -32768, dtype=torch.int16)
    raw[1] = 0
    raw = raw.float()
    raw[2, 7, 0] = float("nan")
    patches, scale = prepare_iq_input(raw.cuda(), 32, backend=backend)
    assert scale[0].item() == torch.sqrt(torch.tensor(2.0**31) + 1e-12).item()
    inv = torch.reciprocal(scale[0].cpu())  # the kernel multiplies by the IEEE reciprocal
    assert torch.equal(patches[0].cpu(), torch.full((128, 64), -32768.0) * inv)
    assert torch.equal(patches[1].cpu(), torch.zeros(128, 64))
    assert torch.isnan(patches[2]).all() and torch.isnan(scale[2])


@pytest.mark.gpu
def test_cuda_offsets_past_int32() -> None:
    # 16,385 windows of 65,536 int8 samples: 2^31 + 2^17 input elements, so offsets into the last
    # window exceed int32 (2 GiB in, 4 GiB bf16 out).
    batch, length = 16385, 65536
    if torch.cuda.get_device_properties(0).total_memory < 16 * 2**30:
        pytest.skip("needs 16 GiB of GPU memory")
    raw = torch.zeros(batch, length, 2, dtype=torch.int8, device="cuda")
    edge = make_raw(2, length, torch.int8, seed=13)
    raw[0], raw[-1] = edge[0].cuda(), edge[1].cuda()
    patches, scale = prepare_iq_input(raw, 16, out_dtype=torch.bfloat16)
    want = prepare_iq_input_reference(edge, 16, out_dtype=torch.bfloat16)
    ends = (patches[[0, -1]], scale[[0, -1]])
    assert_matches(ends, want)
    assert not patches[1:-1].any()  # all-zero windows in between: exact zeros
    del raw, patches


@pytest.mark.skipif(
    HAVE_CUDA or not HAVE_TRITON,
    reason="checks the CPU-only setup: with a GPU the kernel compiles instead of interpreting",
)
def test_conftest_selected_interpreter_without_gpu() -> None:
    # Guards the premise of the interpreter tests: on a machine without a GPU they must run in
    # the interpreter, not silently skip; so a missing TRITON_INTERPRET fails here.
    assert os.environ.get("TRITON_INTERPRET") == "1"
    assert _interpreter_on()
