"""The ten GPU benchmark workloads (how to build each model with random weights, its seeded
inputs, the names its ONNX file uses) and the measures every script of bench/gpu/ shares: the
timing summary, the accuracy metrics and the JSON/.npz files they write.

One module for both, so the exported model, PyTorch's peers and kiln's runs see the same weights
and inputs and are summarised by the same definitions. torch, torchvision and transformers are
imported inside the builders only, numpy inside the functions that need it: report.py imports
this module on machines without torch.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

MODEL_SEED = 0  # torch.manual_seed before building: the weights
INPUT_SEED = 1234  # a generator of its own for the inputs, so they do not depend on the model
CALIBRATION_SEED = 4321  # the images that set BatchNorm statistics (see _calibrate_batchnorm)


@dataclass(frozen=True)
class Workload:
    """One benchmark row: a model at a fixed batch and input shape.

    input_names/output_name are the names the ONNX export gives (the .npz keys follow the
    exported file, which normally keeps them). exporter is the one tried first: "dynamo" or
    "torchscript" (torch.onnx.export(..., dynamo=False)). channels_last says whether PyTorch's fp16
    peers run in channels_last memory format (the CNNs: that is how cuDNN is fastest).
    """

    name: str
    label: str
    build: Callable[[], object]
    make_inputs: Callable[[], dict]
    input_names: tuple[str, ...]
    output_name: str
    exporter: str = "dynamo"
    channels_last: bool = False
    note: str = ""


def _image(batch: int, size: int = 224) -> Callable[[], dict]:
    """Seeded N(0, 1) images, NCHW float32."""

    def make() -> dict:
        import torch

        generator = torch.Generator().manual_seed(INPUT_SEED)
        return {"input": torch.randn(batch, 3, size, size, generator=generator)}

    return make


def _token_ids(batch: int, length: int, vocab: int, with_mask: bool) -> Callable[[], dict]:
    """Seeded token ids in [0, vocab), int64; with_mask adds an all-ones int64 attention mask."""

    def make() -> dict:
        import torch

        generator = torch.Generator().manual_seed(INPUT_SEED)
        inputs = {"input_ids": torch.randint(0, vocab, (batch, length), generator=generator)}
        if with_mask:
            inputs["attention_mask"] = torch.ones(batch, length, dtype=torch.int64)
        return inputs

    return make


def _eval(module):
    """eval() and no gradients: inference only, and no autograd state in exports or timing."""
    module.eval()
    for parameter in module.parameters():
        parameter.requires_grad_(False)
    return module


def _calibrate_batchnorm(model, batch: int, size: int):
    """Sets every BatchNorm's running statistics to its batch statistics on seeded N(0, 1) images,
    as training would leave them (one pass, the BatchNorms alone in training mode, so dropout and
    stochastic depth stay off).

    With the initial statistics (mean 0, variance 1) the activations of a random-weight CNN shrink
    layer after layer: MobileNetV3-Large's outputs come out near 1e-9 and EfficientNet-B0's near
    1e-14, zero in fp16, so no fp16 accuracy could be judged and fp16 kernels would be timed on
    zeros. Calibrated, every BatchNorm's output has unit scale."""
    import torch

    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    generator = torch.Generator().manual_seed(CALIBRATION_SEED)
    images = torch.randn(batch, 3, size, size, generator=generator)
    momenta = [norm.momentum for norm in norms]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average: after one batch, that batch's statistics
        norm.train()
    with torch.no_grad():
        model(images)
    for norm, momentum in zip(norms, momenta):
        norm.momentum = momentum
    return model.eval()


def _torchvision(name: str, calibrate: bool = False) -> Callable[[], object]:
    """A torchvision classifier with random weights (weights=None: nothing is downloaded);
    calibrate: BatchNorm statistics from _calibrate_batchnorm."""

    def build():
        import torch
        import torchvision

        torch.manual_seed(MODEL_SEED)
        model = _eval(getattr(torchvision.models, name)(weights=None))
        return _calibrate_batchnorm(model, 8, 224) if calibrate else model

    return build


def _vit_b_16():
    """ViT-B/16 with its head re-initialised: torchvision zero-initialises the classifier head, so
    random-weight ViT outputs are all zeros and no accuracy metric could tell right from wrong."""
    import torch
    import torchvision

    torch.manual_seed(MODEL_SEED)
    model = torchvision.models.vit_b_16(weights=None)
    torch.nn.init.trunc_normal_(model.heads.head.weight, std=0.02)
    torch.nn.init.normal_(model.heads.head.bias, std=0.02)
    return _eval(model)


def _first_tensor(output, key: str):
    """The tensor named `key` of a model output that is a dict, a ModelOutput or a tuple."""
    if hasattr(output, key):
        return getattr(output, key)
    if isinstance(output, dict):
        return output[key]
    return output[0]


def _deeplabv3():
    """DeepLabV3-ResNet50 returning its 'out' tensor (the model returns a dict)."""
    import torch
    import torchvision

    class SegmentationOut(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(x)["out"]

    torch.manual_seed(MODEL_SEED)
    # weights_backbone=None: its default would download ImageNet weights for the ResNet.
    model = torchvision.models.segmentation.deeplabv3_resnet50(
        weights=None, weights_backbone=None, aux_loss=False
    )
    # Batch 2: the ASPP pooling branch's BatchNorm sees one value per channel and image.
    return _calibrate_batchnorm(_eval(SegmentationOut(model)), 2, 520)


def _bert_base():
    """transformers BertModel(BertConfig()) with random weights, returning last_hidden_state."""
    import torch
    import transformers

    class BertLastHidden(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            output = self.model(input_ids=input_ids, attention_mask=attention_mask)
            return _first_tensor(output, "last_hidden_state")

    torch.manual_seed(MODEL_SEED)
    return _eval(BertLastHidden(transformers.BertModel(transformers.BertConfig())))


def _gpt2():
    """transformers GPT2Model(GPT2Config()) with random weights and no KV cache, returning
    last_hidden_state."""
    import torch
    import transformers

    class Gpt2LastHidden(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            # An explicit all-ones mask: without one, transformers 5 looks for packed sequences in
            # the position ids with torch.diff, which the TorchScript exporter cannot write.
            mask = torch.ones_like(input_ids)
            output = self.model(input_ids=input_ids, attention_mask=mask, use_cache=False)
            return _first_tensor(output, "last_hidden_state")

    torch.manual_seed(MODEL_SEED)
    config = transformers.GPT2Config()
    config.use_cache = False
    return _eval(Gpt2LastHidden(transformers.GPT2Model(config)))


BN_NOTE = "BatchNorm statistics calibrated on seeded images (random-weight activations vanish)"
BERT_VOCAB = 30522  # BertConfig().vocab_size
GPT2_VOCAB = 50257  # GPT2Config().vocab_size

WORKLOADS: tuple[Workload, ...] = (
    Workload("resnet50_b1", "resnet50 b1", _torchvision("resnet50", calibrate=True), _image(1),
             ("input",), "output", channels_last=True, note=BN_NOTE),
    Workload("resnet50_b32", "resnet50 b32", _torchvision("resnet50", calibrate=True),
             _image(32), ("input",), "output", channels_last=True, note=BN_NOTE),
    Workload("mobilenet_v3_large_b1", "mobilenet_v3_large b1",
             _torchvision("mobilenet_v3_large", calibrate=True), _image(1), ("input",), "output",
             channels_last=True, note=BN_NOTE),
    Workload("efficientnet_b0_b8", "efficientnet_b0 b8",
             _torchvision("efficientnet_b0", calibrate=True), _image(8), ("input",), "output",
             channels_last=True, note=BN_NOTE),
    Workload("convnext_tiny_b8", "convnext_tiny b8", _torchvision("convnext_tiny"), _image(8),
             ("input",), "output", channels_last=True),
    Workload("vit_b_16_b8", "vit_b_16 b8", _vit_b_16, _image(8), ("input",), "output",
             note="classifier head re-initialised (torchvision zero-initialises it)"),
    Workload("swin_t_b8", "swin_t b8", _torchvision("swin_t"), _image(8), ("input",), "output"),
    Workload("deeplabv3_resnet50_b1", "deeplabv3_resnet50 b1 (520²)", _deeplabv3, _image(1, 520),
             ("input",), "out", channels_last=True, note=BN_NOTE),
    Workload("bert_base_b8_s128", "bert_base b8 s128", _bert_base,
             _token_ids(8, 128, BERT_VOCAB, with_mask=True), ("input_ids", "attention_mask"),
             "last_hidden_state"),
    Workload("gpt2_b1_s512", "gpt2 b1 s512", _gpt2, _token_ids(1, 512, GPT2_VOCAB, with_mask=False),
             ("input_ids",), "last_hidden_state", exporter="torchscript",
             note="TorchScript exporter: torch 2.11's dynamo exporter fails on GPT-2"),
)

NAMES: tuple[str, ...] = tuple(w.name for w in WORKLOADS)


def select(only: str | None) -> list[Workload]:
    """The workloads named in a comma-separated list (all of them for None or ""), in the suite's
    order; an unknown name is an error that lists the known ones."""
    if not only:
        return list(WORKLOADS)
    wanted = [name.strip() for name in only.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in NAMES]
    if unknown:
        raise SystemExit(f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(NAMES)}")
    return [w for w in WORKLOADS if w.name in wanted]


def by_name(name: str) -> Workload:
    """The workload called `name`."""
    return select(name)[0]


# ---- measures and files shared by export.py, peers.py, kiln_runs.py and report.py ----


def summarize(times_ms: list[float]) -> dict:
    """median, p10, p90, min, max and mean of per-run times (ms). Percentiles are nearest-rank
    (bench/cpu/models.sh's definition), so they are always measured values."""
    xs = sorted(float(x) for x in times_ms)
    if not xs:
        raise ValueError("no timed runs")

    def quantile(p: float) -> float:
        return xs[min(len(xs) - 1, int(p * (len(xs) - 1) + 0.5))]

    return {
        "runs": len(xs),
        "median": statistics.median(xs),
        "p10": quantile(0.1),
        "p90": quantile(0.9),
        "min": xs[0],
        "max": xs[-1],
        "mean": statistics.fmean(xs),
    }


def json_number(x: float):
    """x as JSON can hold it: a float when finite, else the string "NaN", "Infinity" or
    "-Infinity" (strict JSON readers refuse the bare tokens Python would write)."""
    x = float(x)
    if math.isfinite(x):
        return x
    if math.isnan(x):
        return "NaN"
    return "Infinity" if x > 0 else "-Infinity"


def accuracy(actual, reference) -> dict:
    """How far `actual` is from `reference` (arrays of one shape), in float64: max abs error,
    relative L2 error ||a - r|| / ||r||, cosine distance 1 - cos(a, r) and the count of NaN/Inf
    in `actual`. A NaN anywhere makes the error metrics NaN: non_finite says how many."""
    import numpy as np

    a = np.asarray(actual, dtype=np.float64)
    r = np.asarray(reference, dtype=np.float64)
    if a.shape != r.shape:
        return {"error": f"shape {list(a.shape)} differs from the reference's {list(r.shape)}"}
    non_finite = int(a.size - np.count_nonzero(np.isfinite(a)))
    diff = a - r
    a_norm, r_norm, diff_norm = (float(np.linalg.norm(v)) for v in (a, r, diff))
    if r_norm > 0:
        rel_l2 = diff_norm / r_norm
    else:
        rel_l2 = 0.0 if diff_norm == 0 else math.inf
    if a_norm > 0 and r_norm > 0:
        # 0.5 * ||a/|a| - r/|r|||^2 equals 1 - cos(a, r) without cancellation near cos = 1.
        cos_dist = 0.5 * float(np.linalg.norm(a / a_norm - r / r_norm)) ** 2
    elif math.isnan(a_norm):
        cos_dist = math.nan
    else:
        cos_dist = 0.0 if a_norm == r_norm else 1.0
    return {
        "max_abs": json_number(np.max(np.abs(diff)) if a.size else 0.0),
        "rel_l2": json_number(rel_l2),
        "cos_dist": json_number(cos_dist),
        "non_finite": non_finite,
        "ref_max_abs": json_number(np.max(np.abs(r)) if r.size else 0.0),
        "elements": int(a.size),
    }


def accuracy_of_outputs(outputs: dict, references: dict) -> dict:
    """accuracy() per output named in `references`; a reference output missing from `outputs` is
    an entry with an error."""
    result = {}
    for name, reference in references.items():
        if name not in outputs:
            result[name] = {"error": f"no output '{name}' (got: {', '.join(sorted(outputs))})"}
        else:
            result[name] = accuracy(outputs[name], reference)
    return result


def read_json(path: str | os.PathLike, default=None):
    """The JSON document at `path`, or `default` when there is no such file."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return default


def _readable(fd: int) -> None:
    """Gives a temporary file (mkstemp makes it 0600) the mode a plain open() would."""
    mask = os.umask(0)
    os.umask(mask)
    os.fchmod(fd, 0o666 & ~mask)


def write_json(path: str | os.PathLike, data) -> None:
    """Writes `data` as indented JSON through a temporary file and a rename, so a run killed
    mid-write (the device tool's time limit) never leaves half a file for the next run."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    _readable(fd)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


def save_npz(path: str | os.PathLike, arrays: dict) -> None:
    """Writes named arrays as an uncompressed .npz (C order, which kiln reads), atomically."""
    import numpy as np

    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    _readable(fd)
    with os.fdopen(fd, "wb") as f:
        np.savez(f, **{name: np.ascontiguousarray(a) for name, a in arrays.items()})
    os.replace(tmp, path)


def load_npz(path: str | os.PathLike) -> dict:
    """The arrays of an .npz file, by name."""
    import numpy as np

    with np.load(path, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def utc_now() -> str:
    """The current time in UTC, ISO 8601 to the second ("2026-12-03T10:04:05Z")."""
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    return now.isoformat().replace("+00:00", "Z")


def describe_error(error: BaseException, limit: int = 300) -> str:
    """One line for a report cell: the exception's type and the first non-empty line of its
    message, cut at `limit` characters."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def source_digest() -> str:
    """The first 12 hex digits of this file's SHA-256: exports made from other workload
    definitions (weights, inputs, names) are not reused."""
    with open(__file__, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:12]


def update_results(path: str | os.PathLike, kind: str, workload: str, entry: dict,
                   environment: dict, settings: dict) -> None:
    """Stores one workload's results in the `kind` ("peers" or "kiln") JSON file at `path`,
    keeping the other workloads already there, so that the file is complete after every workload
    and a run cut short by the time limit still reports what it measured."""
    data = read_json(path)
    if not isinstance(data, dict) or data.get("kind") != kind:
        data = {"kind": kind, "schema": 1, "workloads": {}}
    data["date"] = utc_now()
    data["environment"] = environment
    data["settings"] = settings
    data["workloads"][workload] = entry
    write_json(path, data)
