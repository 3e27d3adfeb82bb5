"""LoRA on the backbone's linear layers, served by ATMM.

``inject_lora`` wraps the targeted ``nn.Linear`` layers in ``LoRALinear`` and pre-allocates, per group of
same-shaped layers, contiguous slot stacks ``A [L, S, R, in]`` and ``B [L, S, out, R]`` (PEFT orientation;
entries past an adapter's rank stay zero). Loading an adapter writes into a slot; nothing is allocated later.
All wrapped layers share one ``LoRAContext``: the engine describes each forward once (``begin``: the
``LoRAMode`` and every batch element's slot) and every layer computes its LoRA the way the mode says.

The modes (one ``LoRAMode`` object; nothing else decides how a layer computes):
    premerged   every run of rows through its slot's own W + ΔW (``enable_premerge``; memory per slot)
    unmerged    base W, plus each row's LoRA through ATMM (or the dLoRA-style einsum, ``impl="einsum"``)
    merged(s)   W = W0 + ΔW_s holds slot s: rows of s need nothing else (and no other slot may be in the batch)
    mixture(s)  W holds slot s; every other row adds its own LoRA and subtracts s's (deLoRA)

The base weights of each group are moved into one contiguous ``[L, out, in]`` tensor so that a weight switch
(``merge_slot`` / ``unmerge``) is one batched GEMM plus one add per group, computed from a pristine copy:
no drift however many times modes switch. Which slot the weights hold is ``LoRAContext.weights_slot``.

Inject after the model is on its final device and dtype (the stacks are views; ``model.to`` would break them).
"""

from __future__ import annotations

import torch
from torch import nn

from vlora_va import kernels
from vlora_va.engine.modes import MERGED, MIXTURE, PREMERGED, UNMERGED, DeviceLayout, LoRAMode
from vlora_va.kernels.segments import NO_ADAPTER, Segments


class LoRAContext:
    """What the wrapped layers of one model share: the slot storage groups, which slot the base weights
    hold, and the current forward's mode and batch layout (host-side Segments, or a DeviceLayout)."""

    def __init__(self, num_slots: int, max_rank: int):
        self.num_slots = num_slots
        self.max_rank = max_rank
        self.groups: list[_Group] = []
        self.weights_slot: int | None = None  # the slot merged into the base weights (None: pristine)
        self.mode: LoRAMode | None = None  # None: no LoRA on the next forward
        self.layout: DeviceLayout | None = None  # set: the forward reads its batch from device tensors
        self._elem_slots: list[int] | None = None
        self._segments: dict[tuple[int, int], Segments] = {}
        # Set (a kernels.fused.FusedTiles): unmerged forwards over a DeviceLayout run each layer as one fused
        # kernel with these tiles (base GEMM, bias and LoRA in one pass) instead of cuBLAS + ATMM's two kernels.
        # Its rank tile covers max_rank, so a captured graph stays right whatever adapter a slot later holds.
        self.fused = None

    def begin(self, mode: LoRAMode, row_slots, layout: DeviceLayout | None = None) -> None:
        """Describe the next forward: its mode, and the adapter slot of each batch element (-1: none).
        The base weights must already hold mode.weights_slot (merge_slot / unmerge switch them). With a
        `layout`, the slots are written into its device tensors (padded to its size) and the layers read
        them from there (CUDA-graph capturable; unmerged rows through ATMM only, not the einsum)."""
        slots = [int(s) for s in (row_slots.tolist() if torch.is_tensor(row_slots) else row_slots)]
        bad = [s for s in slots if not NO_ADAPTER <= s < self.num_slots]
        if bad:
            raise ValueError(f"row slots {sorted(set(bad))} out of range [-1, {self.num_slots})")
        if mode.slot is not None and not 0 <= mode.slot < self.num_slots:
            raise ValueError(f"{mode}: slot out of range [0, {self.num_slots})")
        if mode.weights_slot != self.weights_slot:
            raise ValueError(f"{mode} needs the base weights to hold slot {mode.weights_slot}, they hold "
                             f"{self.weights_slot} (switch first)")
        if mode.kind == MERGED and any(s != mode.slot for s in slots):
            raise ValueError(f"{mode}: every row must use slot {mode.slot}, got slots {sorted(set(slots))}")
        if mode.kind == PREMERGED and any(g.Wm is None for g in self.groups):
            raise ValueError("premerged mode without premerged weights (enable_premerge first)")
        if layout is not None:
            if mode.impl != "atmm":
                raise ValueError(f"{mode}: device layouts serve unmerged rows through ATMM only")
            layout.fill(slots, mode)
        self.mode, self.layout, self._elem_slots, self._segments = mode, layout, slots, {}

    def clear(self) -> None:
        """No LoRA at all on the next forward (only valid while the base weights are pristine)."""
        self.mode, self.layout, self._elem_slots, self._segments = None, None, None, {}

    def segments(self, n_elems: int, n_rows: int) -> Segments:
        """The batch layout for an input of n_elems batch elements flattened to n_rows rows (cached: all
        layers of a forward share it)."""
        if n_elems != len(self._elem_slots):
            raise ValueError(f"LoRA context describes {len(self._elem_slots)} batch elements, "
                             f"the layer input has {n_elems} (call begin for this batch)")
        key = (n_elems, n_rows)
        seg = self._segments.get(key)
        if seg is None:
            seg = self._segments[key] = Segments.from_elements(self._elem_slots, n_rows // max(n_elems, 1))
        return seg


class _Group:
    """Contiguous storage for L same-shaped wrapped layers: slot stacks, ranks, scales, base weights."""

    def __init__(self, linears: list[nn.Linear], num_slots: int, max_rank: int):
        w = linears[0].weight
        L, (n_out, n_in) = len(linears), w.shape
        kw = dict(dtype=w.dtype, device=w.device)
        self.A = torch.zeros(L, num_slots, max_rank, n_in, **kw)
        self.B = torch.zeros(L, num_slots, n_out, max_rank, **kw)
        self.scale = torch.zeros(L, num_slots, dtype=torch.float32, device=w.device)  # for Triton
        self.rank = torch.zeros(L, num_slots, dtype=torch.int32, device=w.device)     # for Triton
        self.scale_py = [[0.0] * num_slots for _ in range(L)]  # host copies: no device sync per forward
        self.rank_py = [[0] * num_slots for _ in range(L)]
        self.W = torch.stack([lin.weight.detach() for lin in linears])  # [L, out, in], contiguous
        self.W0: torch.Tensor | None = None  # pristine base weights, made on the first merge
        self.Wm: torch.Tensor | None = None  # [S, L, out, in] per-slot W + ΔW (enable_premerge), or None
        for l, lin in enumerate(linears):
            lin.weight = nn.Parameter(self.W[l], requires_grad=lin.weight.requires_grad)

    def max_rank_of(self, slot: int) -> int:
        return max(r[slot] for r in self.rank_py)

    def premerge(self, slot: int) -> None:
        """Wm[slot] = pristine W + ΔW of the slot, all L layers in one batched GEMM + one add."""
        base = self.W0 if self.W0 is not None else self.W
        kernels.delta_weights(self.A[:, slot], self.B[:, slot], self.scale[:, slot], max(1, self.max_rank_of(slot)),
                              out=self.Wm[slot])
        self.Wm[slot].add_(base)
        lowp = getattr(self, "lowp", None)  # precision.GroupInt8: low-precision copies of the weights
        if lowp is not None:
            lowp.refresh(slot)  # never a stale packed weight after a load


class LoRALinear(nn.Module):
    """An nn.Linear (``.base``) plus the ATMM LoRA of each batch element's adapter, per the shared context.
    Input [B, T, in] or [N, in]; dim 0 is what the context's row_slots index (tokens share their image's
    adapter)."""

    def __init__(self, base: nn.Linear, ctx: LoRAContext, group: _Group, index: int, name: str):
        super().__init__()
        self.base = base
        self.in_features, self.out_features = base.in_features, base.out_features
        self.name = name
        self._ctx, self._group, self._index = ctx, group, index  # plain attributes: not submodules/buffers
        # Set when the base layer's output was pre-scaled per channel (vit.fold_layer_scale): every adapter's
        # B is scaled the same way on load, so W + s B A stays the folded form of the adapter's layer.
        self.out_scale: torch.Tensor | None = None

    @property
    def lora_A(self) -> torch.Tensor:  # [S, R, in]
        return self._group.A[self._index]

    @property
    def lora_B(self) -> torch.Tensor:  # [S, out, R]
        return self._group.B[self._index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mode = self._ctx.mode
        if mode is None or mode.kind == MERGED:  # the base weights already are W + ΔW of the batch's slot
            return self.base(x)
        if self._ctx.layout is not None:
            return self._from_layout(x, mode, self._ctx.layout)
        seg = self._ctx.segments(x.shape[0], x.numel() // self.in_features)
        if mode.kind == PREMERGED:
            return self._premerged(x, seg)
        delora = mode.slot if mode.kind == MIXTURE else None
        if seg.n_runs == 0 and delora is None:
            return self.base(x)
        g, l = self._group, self._index
        y = self.base(x)
        kernels.atmm(y.view(-1, self.out_features), x.reshape(-1, self.in_features), g.A[l], g.B[l], seg,
                     g.scale_py[l], g.rank_py[l], delora, device_params=(g.scale[l], g.rank[l]),
                     impl="einsum" if mode.impl == "einsum" else None)
        return y

    def _from_layout(self, x: torch.Tensor, mode: LoRAMode, layout: DeviceLayout) -> torch.Tensor:
        """The same results as the Segments path, read from device tensors with data-independent launches:
        premerged as one grouped GEMM over the per-slot weights (rows sorted by slot, `offs`), unmerged and
        mixture as ATMM over one run per image (kernels.atmm_images), or unmerged as one fused kernel per layer
        (`LoRAContext.fused`: kernels.lora_linear_images). Which ATMM backend computes them is the kernels'
        choice (the registry's default for the device), as on the Segments path."""
        g, l = self._group, self._index
        x2 = x.reshape(-1, self.in_features)
        if mode.kind == PREMERGED:
            y = torch._grouped_mm(x2, g.Wm[:, l].transpose(1, 2), offs=layout.offs)
            if self.base.bias is not None:
                y += self.base.bias
            return y.view(*x.shape[:-1], self.out_features)
        if mode.kind == UNMERGED and self._ctx.fused is not None:
            y2 = kernels.lora_linear_images(x2, self.base.weight, self.base.bias, g.A[l], g.B[l], layout.own_slot,
                                            layout.own_len, g.scale[l], g.rank[l], layout.tokens, self._ctx.max_rank,
                                            tiles=self._ctx.fused)
            return y2.view(*x.shape[:-1], self.out_features)
        y = self.base(x)
        y2 = y.view(-1, self.out_features)
        kernels.atmm_images(y2, x2, g.A[l], g.B[l], layout.own_slot, layout.own_len, g.scale[l], g.rank[l],
                            layout.tokens, 1.0, layout.start, layout.h)
        if mode.kind == MIXTURE:
            kernels.atmm_images(y2, x2, g.A[l], g.B[l], layout.delora_slot, layout.delora_len, g.scale[l],
                                g.rank[l], layout.tokens, -1.0, layout.start, layout.h)
        return y

    def _premerged(self, x: torch.Tensor, seg: Segments) -> torch.Tensor:
        """The same result as base + ATMM, computed as each run of rows through its slot's premerged
        weight W + scale·B·A (rows without adapter through W): no LoRA GEMMs and no extra pass over y.
        As a plain loop: for each row i, y[i] = x[i] @ Wm[idx[i]].T + bias.
        With a low-precision copy of the weights (`lowp`, engine/precision.py) each run goes through that
        slot's packed weight instead (int8), per run: no batched form."""
        g, l = self._group, self._index
        x2 = x.reshape(-1, self.in_features)
        lowp = getattr(g, "lowp", None)
        if lowp is not None and seg.n_runs == 1 and seg.starts[0] == 0 and seg.ends[0] == x2.shape[0]:
            return lowp.run(x2, lowp.packed(seg.slots[0], l)).view(*x.shape[:-1], self.out_features)  # no copy
        y = torch.empty(x2.shape[0], self.out_features, dtype=x2.dtype, device=x2.device)
        if lowp is None and seg.slot_progression() is not None:
            self._premerged_bmm(y, x2, seg)
            return y.view(*x.shape[:-1], self.out_features)
        base = lowp.packed(None, l) if lowp is not None else None
        cursor = 0
        for s, a, b in zip(seg.slots, seg.starts, seg.ends):
            if a > cursor:
                _linear_into(y[cursor:a], x2[cursor:a], self.base.weight, self.base.bias, lowp, base)
            _linear_into(y[a:b], x2[a:b], g.Wm[s, l], self.base.bias, lowp, lowp and lowp.packed(s, l))
            cursor = b
        if cursor < x2.shape[0]:
            _linear_into(y[cursor:], x2[cursor:], self.base.weight, self.base.bias, lowp, base)
        return y.view(*x.shape[:-1], self.out_features)

    def _premerged_bmm(self, y: torch.Tensor, x2: torch.Tensor, seg: Segments) -> None:
        """Equal runs whose slots rise by a constant step: one batched GEMM over a strided view of the
        per-slot weights (no copy). Measured on 2 cores, ViT-S shapes: 8 runs of 257 rows cost +7-13%
        over one merged GEMM this way vs +15-27% as 8 separate GEMMs (each 2-thread GEMM on few rows
        is inefficient; bmm gives each thread whole GEMMs). Rows without adapter go through W."""
        g, l = self._group, self._index
        first, step = seg.slot_progression()
        a, b, n = seg.starts[0], seg.ends[-1], seg.n_runs
        if a > 0:
            _linear_into(y[:a], x2[:a], self.base.weight, self.base.bias)
        if b < x2.shape[0]:
            _linear_into(y[b:], x2[b:], self.base.weight, self.base.bias)
        w = g.Wm[first:first + (n - 1) * step + 1:step, l]  # [n, out, in], a view
        xs, ys = x2[a:b].view(n, -1, self.in_features), y[a:b].view(n, -1, self.out_features)
        if self.base.bias is None:
            torch.bmm(xs, w.transpose(1, 2), out=ys)
        else:
            torch.baddbmm(self.base.bias.view(1, 1, -1), xs, w.transpose(1, 2), out=ys)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, slots={self._ctx.num_slots}, max_rank={self._ctx.max_rank}"


def _linear_into(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, lowp=None,
                 packed=None) -> None:
    """out = x @ w.T + bias; with `lowp` (precision.GroupInt8), through its packed copy of w instead."""
    if lowp is not None:
        out.copy_(lowp.run(x, packed))
    elif bias is None:
        torch.mm(x, w.t(), out=out)
    else:
        torch.addmm(bias, x, w.t(), out=out)


# ---- model-level API ------------------------------------------------------------------------------
def inject_lora(model: nn.Module, target_modules: list[str], num_slots: int, max_rank: int,
                out_scales: dict[str, torch.Tensor] | None = None) -> LoRAContext:
    """Replace every nn.Linear whose qualified name ends with one of target_modules (PEFT-style suffix
    match on dotted components) by a LoRALinear sharing the returned context. out_scales: {name: per-output
    factor} of layers whose weights were pre-scaled (vit.fold_layer_scale); adapters loaded there follow."""
    if num_slots < 1 or max_rank < 1:
        raise ValueError(f"num_slots ({num_slots}) and max_rank ({max_rank}) must be >= 1")
    if _lora_layers(model):
        raise ValueError("model already has LoRA layers (inject_lora was called before)")
    targets = [(n, m) for n, m in model.named_modules()
               if isinstance(m, nn.Linear) and any(n == t or n.endswith("." + t) for t in target_modules)]
    if not targets:
        raise ValueError(f"no nn.Linear matches target_modules={target_modules}")
    ctx = LoRAContext(num_slots, max_rank)
    by_shape: dict[tuple, list[tuple[str, nn.Linear]]] = {}
    for n, m in targets:
        by_shape.setdefault((tuple(m.weight.shape), m.weight.dtype, m.weight.device), []).append((n, m))
    for members in by_shape.values():
        group = _Group([m for _, m in members], num_slots, max_rank)
        ctx.groups.append(group)
        group.names = [n for n, _ in members]
        for l, (n, m) in enumerate(members):
            parent_name, _, child = n.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            layer = LoRALinear(m, ctx, group, l, n)
            if out_scales and n in out_scales:
                layer.out_scale = out_scales[n].to(m.weight.device, m.weight.dtype)
            setattr(parent, child, layer)
    return ctx


def _lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def _context(model: nn.Module) -> tuple[LoRAContext, dict[str, LoRALinear]]:
    layers = _lora_layers(model)
    if not layers:
        raise ValueError("model has no LoRA layers: call inject_lora first")
    return next(iter(layers.values()))._ctx, layers


def lora_module_names(model: nn.Module) -> list[str]:
    """Qualified names of the wrapped layers (the keys load_adapter accepts)."""
    return list(_lora_layers(model))


def _check_slot(ctx: LoRAContext, slot: int) -> None:
    if not isinstance(slot, int) or not 0 <= slot < ctx.num_slots:
        raise ValueError(f"slot {slot!r} out of range [0, {ctx.num_slots})")


def load_adapter(model: nn.Module, slot: int, weights: dict[str, tuple[torch.Tensor, torch.Tensor]],
                 scale: float | dict[str, float]) -> None:
    """Write an adapter into a slot. weights: {module name: (A [r, in], B [out, r])} (PEFT lora_A/lora_B
    weights); scale: lora_alpha / r, one float or per module. Everything is validated before anything is
    written; the slot is fully replaced (modules the adapter does not target get rank 0 there)."""
    ctx, layers = _context(model)
    _check_slot(ctx, slot)
    unknown = sorted(set(weights) - set(layers))
    if unknown:
        raise ValueError(f"unknown LoRA module names {unknown[:5]}{' ...' if len(unknown) > 5 else ''}; "
                         f"known e.g. {list(layers)[:3]}")
    for name, (a, b) in weights.items():
        lay = layers[name]
        r = a.shape[0] if a.dim() == 2 else -1
        if (a.dim() != 2 or b.dim() != 2 or a.shape[1] != lay.in_features or b.shape[0] != lay.out_features
                or b.shape[1] != r):
            raise ValueError(f"{name}: expected A [r, {lay.in_features}] and B [{lay.out_features}, r], "
                             f"got A {list(a.shape)} and B {list(b.shape)}")
        if not 1 <= r <= ctx.max_rank:
            raise ValueError(f"{name}: rank {r} not in [1, max_rank={ctx.max_rank}] (A {list(a.shape)})")
    scales = scale if isinstance(scale, dict) else {n: float(scale) for n in weights}
    missing = set(weights) - set(scales)
    if missing:
        raise ValueError(f"no scale for modules {sorted(missing)[:5]}")
    clear_slot(model, slot)
    with torch.no_grad():
        for name, (a, b) in weights.items():
            lay = layers[name]
            g, l, r = lay._group, lay._index, a.shape[0]
            g.A[l, slot, :r].copy_(a)
            g.B[l, slot, :, :r].copy_(b if lay.out_scale is None else b.to(lay.out_scale) * lay.out_scale[:, None])
            g.rank_py[l][slot], g.scale_py[l][slot] = r, float(scales[name])
    for g in ctx.groups:  # one host->device copy per group
        g.rank.copy_(torch.tensor(g.rank_py, dtype=torch.int32))
        g.scale.copy_(torch.tensor(g.scale_py, dtype=torch.float32))
        if g.Wm is not None:
            with torch.no_grad():
                g.premerge(slot)


def clear_slot(model: nn.Module, slot: int) -> None:
    """Empty a slot: zero stacks, rank 0 everywhere (a later load cannot see stale values)."""
    ctx, _ = _context(model)
    _check_slot(ctx, slot)
    if ctx.weights_slot == slot:
        raise ValueError(f"slot {slot} is merged into the base weights: unmerge first")
    for g in ctx.groups:
        g.A[:, slot].zero_()
        g.B[:, slot].zero_()
        for l in range(len(g.rank_py)):
            g.rank_py[l][slot], g.scale_py[l][slot] = 0, 0.0
        g.rank[:, slot] = 0
        g.scale[:, slot] = 0.0
        if g.Wm is not None:
            g.Wm[slot].copy_(g.W0 if g.W0 is not None else g.W)


def premerge_bytes(model: nn.Module) -> int:
    """Memory enable_premerge would take: one copy of every wrapped weight per slot."""
    ctx, _ = _context(model)
    return sum(g.W.numel() * g.W.element_size() for g in ctx.groups) * ctx.num_slots


def enable_premerge(model: nn.Module) -> None:
    """Keep W + ΔW of every slot (premerge_bytes of memory) so a batch runs each adapter's rows through
    its own merged weights: on CPU this beats base GEMM + LoRA GEMMs (no extra pass over the output).
    Used in premerged mode (the base weights pristine); loads and clears keep it up to date."""
    ctx, _ = _context(model)
    with torch.no_grad():
        for g in ctx.groups:
            if g.Wm is None:
                g.Wm = torch.empty((ctx.num_slots, *g.W.shape), dtype=g.W.dtype, device=g.W.device)
            for slot in range(ctx.num_slots):
                g.premerge(slot)


def slot_delta_weights(model: nn.Module, slot: int) -> dict[str, torch.Tensor]:
    """{module name: ΔW [out, in] = scale·B·A} for every wrapped layer, one batched GEMM per shape group."""
    ctx, _ = _context(model)
    _check_slot(ctx, slot)
    out = {}
    for g in ctx.groups:
        dw = kernels.delta_weights(g.A[:, slot], g.B[:, slot], g.scale[:, slot], g.max_rank_of(slot))
        out.update(zip(g.names, dw.unbind(0)))
    return out


def merge_slot(model: nn.Module, slot: int) -> None:
    """The base weights hold one slot: W = W0 + ΔW_slot for every wrapped layer (one bmm + one add per
    shape group), computed from the pristine W0, so switching never accumulates rounding error."""
    ctx, _ = _context(model)
    _check_slot(ctx, slot)
    with torch.no_grad():
        for g in ctx.groups:
            if g.W0 is None:
                g.W0 = g.W.clone()
            dw = kernels.delta_weights(g.A[:, slot], g.B[:, slot], g.scale[:, slot], g.max_rank_of(slot))
            torch.add(g.W0, dw, out=g.W)
    ctx.weights_slot = slot


def unmerge(model: nn.Module) -> None:
    """Back to the base weights exactly (copy of the pristine W0)."""
    ctx, _ = _context(model)
    if ctx.weights_slot is None:
        return
    with torch.no_grad():
        for g in ctx.groups:
            g.W.copy_(g.W0)
    ctx.weights_slot = None


def merged_slot(model: nn.Module) -> int | None:
    ctx, _ = _context(model)
    return ctx.weights_slot


def switch_weights(model: nn.Module, slot: int | None) -> bool:
    """Make the base weights hold `slot` (None: pristine). Returns whether anything changed."""
    ctx, _ = _context(model)
    if ctx.weights_slot == slot:
        return False
    if slot is None:
        unmerge(model)
    else:
        merge_slot(model, slot)  # from the pristine copy: no unmerge needed in between
    return True
