"""Start-up: the engine a pipeline needs, the cost profile of this machine, and the warm-up before serving.

    load the backbone ─► load each configured adapter (one that fails is reported, the others serve)
    ─► pick the backbone precision for this machine (engine/precision.py) ─► the engine
    ─► the cost profile: cached, or measured now (profiling.py) ─► warm up every plan key the policy can produce
"""

from __future__ import annotations

import logging
import os
import time

import torch

from vlora_va.contracts.config import PipelineConfig
from vlora_va.contracts.plugins import BACKBONE_BACKENDS, POLICIES
from vlora_va.engine import precision, precision_choice
from vlora_va.engine.adapters import Adapter, AdapterError, load_adapter_dir
from vlora_va.engine.backbones import load_backbone
from vlora_va.engine.executor import Engine
from vlora_va.serving import profiling
from vlora_va.serving.capacity import offered_images
from vlora_va.serving.costs import CostModel
from vlora_va.serving.scheduling import Scheduler

log = logging.getLogger(__name__)


def pick_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("daemon.device is cuda but no CUDA device is available (install a CUDA torch build)")
    return name


def pick_dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    return getattr(torch, name)


def load_adapters(config: PipelineConfig, hidden: int) -> tuple[dict[str, Adapter], dict[str, str]]:
    """Every configured adapter that loads, and a clear error for each one that does not."""
    loaded, failed = {}, {}
    for name, path in config.adapters.items():
        try:
            loaded[name] = load_adapter_dir(name, path, hidden)
            a = loaded[name]
            log.info("adapter %s: %s head, rank %d on %d layers, %s (%s)", name, a.task, a.rank, len(a.lora),
                     "trained" if a.trained else "UNTRAINED", path)
        except AdapterError as e:
            failed[name] = str(e)
            log.error("adapter %s not loaded: %s", name, e)
    return loaded, failed


def auto_backend(setting: str, choice: precision_choice.Choice) -> tuple[str, precision_choice.Choice]:
    """daemon.backend and the precision choice to build the engine with: `auto` takes the backend of the chosen
    candidate ("openvino-bf16": openvino in bf16), else torch; another setting stays as it is."""
    if setting != "auto":
        return setting, choice
    backend, label = precision_choice.split_choice(choice.precision)
    return backend, precision_choice.Choice(label, choice.reason)


def build_engine(config: PipelineConfig) -> tuple[Engine, dict[str, str]]:
    """The engine for a pipeline, and the adapters that could not be served (name -> why)."""
    d = config.daemon
    device = pick_device(d.device)
    torch.set_num_threads(d.threads or os.cpu_count() or 1)
    backbone = load_backbone(d.backbone, d.allow_download, device)
    adapters, failed = load_adapters(config, backbone.config.hidden_size)
    sizes = {n: int(a.head_config.get("image_size", d.image_size)) for n, a in adapters.items()}
    # The precision that serves this pipeline's mix of image sizes fastest (no streams yet: one image per size).
    workload = offered_images(config, sizes)[0] or {s: 1.0 for s in set(sizes.values()) or {d.image_size}}
    backend = d.backend
    if backend != "auto" and BACKBONE_BACKENDS.load(backend).owns_precision and d.precision == "auto" \
            and device == "cpu":
        caps = precision.Capabilities.detect(device)  # the torch engine's speeds say nothing of this backend's
        int8_why, _ = precision_choice.openvino_int8_gate(caps, backbone, adapters, sizes)
        choice = (precision_choice.float_precision(caps, {"bf16": precision_choice.gate_allows(adapters, "bf16")})
                  if int8_why else precision_choice.Choice("int8", "calibrated int8 models here, accuracy gate passed"))
    else:  # backend auto: the openvino backend's precisions compete with torch's, measured the same way
        choice = precision_choice.pick(d.precision, d.dtype, device, backbone, d.backbone, adapters, workload,
                                       profiling.profile_dir(d.profile_cache), auto_backend=backend == "auto",
                                       sizes=sizes)
        backend, choice = auto_backend(backend, choice)
    log.info("backbone precision %s: %s (backend %s)", choice.precision, choice.reason, backend)
    dtype = precision.dtype_of(choice.precision) if d.dtype == "auto" else pick_dtype(d.dtype, device)
    engine = Engine(backbone, adapters, d.image_size, d.max_slots, d.max_rank, device, d.premerge_max_mb,
                    d.max_batch_images, dtype,
                    precision=choice.precision if choice.precision in precision.PRECISIONS else None,
                    backend=backend)
    failed.update(engine.rejected)
    return engine, failed


def cost_model(config: PipelineConfig, engine: Engine, remeasure: bool = False) -> CostModel:
    """The cost profile for this engine on this machine: the cached one, or measured now (and cached)."""
    catalog = engine.catalog()
    ranks = {n: a.rank for n, a in engine.adapters.items()}
    modes = list(POLICIES.load(config.daemon.policy).measured_modes)
    key = profiling.profile_key(engine.device, config.daemon.backbone, engine.backbone, catalog, ranks, modes,
                                engine.backend_name, engine.precision)
    return CostModel(profiling.load_or_measure(engine, catalog, key, profiling.profile_dir(config.daemon.profile_cache),
                                               modes, remeasure))


def warm_up(engine: Engine, scheduler: Scheduler) -> set:
    """Every plan key the policy can produce, once (ready is reported only after this); the engine then rests in
    its resting mode. Returns the keys run."""
    t0 = time.perf_counter()
    catalog = engine.catalog()
    modes = {}
    for size in catalog.sizes:
        slot = next(a.slot for a in catalog.adapters.values() if a.size == size)
        modes[size] = scheduler.warmup_modes(slot)
    cuda = engine.device.type == "cuda"
    warmed = profiling.warm_up(engine, catalog, modes, profiling.batch_sizes(engine.device, catalog.max_batch_images),
                               bucketed=cuda)
    engine.switch(catalog.resting_mode())
    engine.backend.warmed()
    scheduler.weights_now(engine.weights_slot)
    log.info("warmed up %d plan keys in %.1f s", len(warmed), time.perf_counter() - t0)
    return warmed
