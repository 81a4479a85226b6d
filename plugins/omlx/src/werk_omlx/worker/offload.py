"""Expert offload: mlx-lm's ``SwitchGLU`` replaced by a layer whose experts live in a bounded LRU.

:func:`install_offload` walks a lazily loaded mlx-lm model, finds every ``SwitchGLU`` (the MoE
expert block of ``qwen3_moe``, ``qwen2_moe``, ``mixtral`` and others), locates each expert's
tensors in the checkpoint (:mod:`werk_omlx.worker.tensors`) and swaps the block for an
:class:`OffloadedSwitchGLU` before any expert weight is evaluated, so the stacked expert arrays
are never materialised. At a forward pass the layer reads the router's choice (a sync point),
asks the shared :class:`ExpertStore` for exactly those experts (loading misses from disk with
``pread``), stacks them and runs the same ``gather_mm``/``gather_qmm`` computation on the
stacked subset with remapped indices. The arithmetic is the stock layer's, row for row, so the
output is identical to stock mlx-lm (``tests/test_omlx_offload.py`` checks bit equality).

The store's contract (docs/omlx.md, "Expert offload"):

* **Budget.** Resident expert bytes stay within ``budget_bytes`` except while one layer's
  working set (the experts its forward needs at once) does not fit beside the pinned experts;
  then they exceed it by at most that working set. A forward never waits for room: misses are
  loaded after evicting least-recently-used unpinned experts outside the working set.
* **Pins.** A pinned expert is resident and is never evicted by pressure. Pins, and the
  experts a prefetch brings in, must fit the budget together (``CapacityError`` otherwise).
* **Actions.** ``prefetch``, ``pin``, ``unpin`` and ``evict`` take explicit experts; with
  ``dry_run`` they return the same plan and change nothing. Evicting drops the cached copy; the
  checkpoint is never touched. Evicting a pinned expert is refused (``PinnedError``).
* **Counters.** hits, misses, evictions, loaded bytes, the peak resident bytes and the largest
  working set; per expert, routed-token accesses and the last use (Unix ms).

This module relies on mlx-lm's private ``_gather_sort``/``_scatter_unsort`` helpers, hence the
0.32.x pin of mlx and mlx-lm.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np
from mlx.nn.layers.base import Module
from mlx_lm.models.switch_layers import (
    QuantizedSwitchLinear,
    SwitchGLU,
    SwitchLinear,
    _gather_sort,
    _scatter_unsort,
)

from .tensors import LayoutError, Slice, TensorFiles, TensorRef, expert_slices

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")

#: (layer, expert)
Key = tuple[int, int]


class CapacityError(Exception):
    """The requested experts cannot be resident together within the budget."""


class PinnedError(Exception):
    """An explicit eviction named a pinned expert."""


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class ExpertUse:
    """Per-expert access counters."""

    accesses: int = 0
    last_used_ms: int | None = None


@dataclass(frozen=True)
class ExpertView:
    """One expert as observed now."""

    layer: int
    expert: int
    bytes: int
    resident: bool
    pinned: bool
    accesses: int
    last_used_ms: int | None


@dataclass(frozen=True)
class Plan:
    """What an action does (or, in a dry run, would do)."""

    load: tuple[Key, ...] = ()
    evict: tuple[Key, ...] = ()
    pin: tuple[Key, ...] = ()
    unpin: tuple[Key, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.load or self.evict or self.pin or self.unpin)


@dataclass
class Counters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    loaded_bytes: int = 0
    peak_resident_bytes: int = 0
    max_working_set_bytes: int = 0


@dataclass
class ExpertStore:
    """The bounded LRU of expert tensors shared by every offloaded layer (module docstring)."""

    files: TensorFiles
    #: layer → per expert, the slice of every part
    slices: dict[int, list[dict[str, Slice]]]
    budget_bytes: int
    counters: Counters = field(default_factory=Counters)
    resident_bytes: int = 0
    _resident: OrderedDict[Key, dict[str, mx.array]] = field(default_factory=OrderedDict)
    _pinned: set[Key] = field(default_factory=set)
    _use: dict[Key, ExpertUse] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.budget_bytes <= 0:
            raise ValueError("the expert cache budget must be positive")
        self._sizes = {
            (layer, e): sum(s.nbytes for s in parts.values())
            for layer, experts in self.slices.items()
            for e, parts in enumerate(experts)
        }

    # -- identities -------------------------------------------------------------------------
    def keys(self) -> list[Key]:
        return sorted(self._sizes)

    def size(self, key: Key) -> int:
        return self._sizes[key]

    def known(self, key: Key) -> bool:
        return key in self._sizes

    # -- the forward path --------------------------------------------------------------------
    def acquire(self, layer: int, experts: Sequence[int], tokens: Sequence[int]) -> list[dict[str, mx.array]]:
        """The tensors of ``experts`` of ``layer`` (misses loaded), each touched as most recent;
        ``tokens[i]`` routed tokens are counted as accesses of ``experts[i]``."""
        wanted = [(layer, e) for e in experts]
        stamp = now_ms()
        with self._lock:
            c = self.counters
            c.max_working_set_bytes = max(c.max_working_set_bytes, sum(self._sizes[k] for k in wanted))
            missing = [k for k in wanted if k not in self._resident]
            c.hits += len(wanted) - len(missing)
            c.misses += len(missing)
            for key in wanted:
                if key in self._resident:
                    self._resident.move_to_end(key)
            need = sum(self._sizes[k] for k in missing)
            for victim in self._victims(need, keep=set(wanted)):
                self._drop(victim)
            for key in missing:
                self._load(key)
            for key, count in zip(wanted, tokens, strict=True):
                use = self._use.setdefault(key, ExpertUse())
                use.accesses += int(count)
                use.last_used_ms = stamp
            return [self._resident[k] for k in wanted]

    def _victims(self, need: int, keep: set[Key]) -> list[Key]:
        """Least-recently-used unpinned experts outside ``keep`` whose eviction makes room for
        ``need`` more bytes (as many as exist, when that is not enough)."""
        victims: list[Key] = []
        excess = self.resident_bytes + need - self.budget_bytes
        for key in self._resident:
            if excess <= 0:
                break
            if key in self._pinned or key in keep:
                continue
            victims.append(key)
            excess -= self._sizes[key]
        return victims

    def _load(self, key: Key) -> None:
        layer, expert = key
        arrays = {part: self.files.read(piece) for part, piece in self.slices[layer][expert].items()}
        self._resident[key] = arrays
        self.resident_bytes += self._sizes[key]
        self.counters.loaded_bytes += self._sizes[key]
        self.counters.peak_resident_bytes = max(self.counters.peak_resident_bytes, self.resident_bytes)

    def _drop(self, key: Key) -> None:
        del self._resident[key]
        self.resident_bytes -= self._sizes[key]
        self.counters.evictions += 1

    # -- explicit actions ----------------------------------------------------------------------
    def _bring_in(self, keys: Sequence[Key]) -> tuple[tuple[Key, ...], tuple[Key, ...]]:
        missing = tuple(k for k in keys if k not in self._resident)
        need = sum(self._sizes[k] for k in missing)
        return missing, tuple(self._victims(need, keep=set(keys)))

    def prefetch(self, keys: Sequence[Key], dry_run: bool) -> Plan:
        """Make ``keys`` resident (most recent), evicting LRU unpinned others for room."""
        with self._lock:
            others_pinned = sum(self._sizes[k] for k in self._pinned if k not in keys)
            if sum(self._sizes[k] for k in set(keys)) + others_pinned > self.budget_bytes:
                raise CapacityError("the experts do not fit the cache beside the pinned ones")
            load, evict = self._bring_in(keys)
            plan = Plan(load=load, evict=evict)
            if not dry_run:
                self._apply(plan, keys)
            return plan

    def pin(self, keys: Sequence[Key], dry_run: bool) -> Plan:
        """Pin ``keys`` (resident, never evicted by pressure); all pins must fit the budget."""
        with self._lock:
            pins = self._pinned | set(keys)
            if sum(self._sizes[k] for k in pins) > self.budget_bytes:
                raise CapacityError("the pinned experts would not fit the cache")
            load, evict = self._bring_in(keys)
            plan = Plan(load=load, evict=evict, pin=tuple(k for k in keys if k not in self._pinned))
            if not dry_run:
                self._apply(plan, keys)
            return plan

    def unpin(self, keys: Sequence[Key], dry_run: bool) -> Plan:
        with self._lock:
            plan = Plan(unpin=tuple(k for k in keys if k in self._pinned))
            if not dry_run:
                self._pinned.difference_update(plan.unpin)
            return plan

    def evict(self, keys: Sequence[Key], dry_run: bool) -> Plan:
        """Drop the cached copies of ``keys`` (the checkpoint stays); pinned ones are refused."""
        with self._lock:
            if any(k in self._pinned for k in keys):
                raise PinnedError("a pinned expert cannot be evicted; unpin it first")
            plan = Plan(evict=tuple(k for k in keys if k in self._resident))
            if not dry_run:
                for key in plan.evict:
                    self._drop(key)
            return plan

    def _apply(self, plan: Plan, touched: Sequence[Key]) -> None:
        for key in plan.evict:
            self._drop(key)
        for key in plan.load:
            self._load(key)
        for key in touched:
            self._resident.move_to_end(key)
        self._pinned.update(plan.pin)

    # -- observation -----------------------------------------------------------------------------
    def view(self, keys: Iterable[Key] | None = None) -> list[ExpertView]:
        with self._lock:
            out = []
            for key in self.keys() if keys is None else keys:
                use = self._use.get(key, ExpertUse())
                out.append(
                    ExpertView(
                        layer=key[0],
                        expert=key[1],
                        bytes=self._sizes[key],
                        resident=key in self._resident,
                        pinned=key in self._pinned,
                        accesses=use.accesses,
                        last_used_ms=use.last_used_ms,
                    )
                )
            return out

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            c = self.counters
            return {
                "budget_bytes": self.budget_bytes,
                "resident_bytes": self.resident_bytes,
                "resident_experts": len(self._resident),
                "pinned_experts": len(self._pinned),
                "hits": c.hits,
                "misses": c.misses,
                "evictions": c.evictions,
                "loaded_bytes": c.loaded_bytes,
                "peak_resident_bytes": c.peak_resident_bytes,
                "max_working_set_bytes": c.max_working_set_bytes,
            }


@dataclass(frozen=True)
class ProjectionSpec:
    """How one projection computes: float ``gather_mm`` or quantized ``gather_qmm``."""

    quantized: bool
    group_size: int = 0
    bits: int = 0
    mode: str = "affine"
    bias: bool = False


class OffloadedSwitchGLU(Module):
    """``SwitchGLU`` with its experts fetched from an :class:`ExpertStore` per forward."""

    def __init__(
        self, layer: int, num_experts: int, store: ExpertStore, specs: dict[str, ProjectionSpec], activation: Module
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.activation = activation
        self.layer_index = layer
        self.expert_count = num_experts
        self.store = store
        self._specs = specs  # underscore: not a parameter tree (mlx.Module)

    def _project(self, name: str, x: mx.array, stacked: dict[str, mx.array], idx: mx.array, sort: bool) -> mx.array:
        spec = self._specs[name]
        if spec.quantized:
            out = mx.gather_qmm(
                x,
                stacked[f"{name}.weight"],
                stacked[f"{name}.scales"],
                stacked.get(f"{name}.biases"),
                rhs_indices=idx,
                transpose=True,
                group_size=spec.group_size,
                bits=spec.bits,
                mode=spec.mode,
                sorted_indices=sort,
            )
        else:
            out = mx.gather_mm(x, stacked[f"{name}.weight"].swapaxes(-1, -2), rhs_indices=idx, sorted_indices=sort)
        if spec.bias:
            out = out + mx.expand_dims(stacked[f"{name}.bias"][idx], -2)
        return out

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        indices = mx.stop_gradient(indices)
        mx.eval(indices)  # the router's choice decides what is read: a sync point
        chosen, counts = np.unique(np.asarray(indices), return_counts=True)
        experts = [int(e) for e in chosen]
        tensors = self.store.acquire(self.layer_index, experts, [int(c) for c in counts])
        stacked = {part: mx.stack([t[part] for t in tensors]) for part in tensors[0]}
        lookup = np.zeros(self.expert_count, dtype=np.uint32)
        lookup[chosen] = np.arange(len(experts), dtype=np.uint32)
        local = mx.array(lookup)[indices]

        x = mx.expand_dims(x, (-2, -3))
        do_sort = indices.size >= 64  # the stock layer's rule, so the order of work is the same
        idx = local
        inv_order = None
        if do_sort:
            x, idx, inv_order = _gather_sort(x, local)  # type: ignore[no-untyped-call]
        x_up = self._project("up_proj", x, stacked, idx, do_sort)
        x_gate = self._project("gate_proj", x, stacked, idx, do_sort)
        x = self._project("down_proj", self.activation(x_up, x_gate), stacked, idx, do_sort)
        if do_sort:
            x = _scatter_unsort(x, inv_order, local.shape)  # type: ignore[no-untyped-call]
        return x.squeeze(-2)


def _projection(module: Module) -> tuple[ProjectionSpec, dict[str, tuple[int, ...]]]:
    """The spec and the stacked part shapes of one ``SwitchLinear``/``QuantizedSwitchLinear``."""
    has_bias = "bias" in module
    if isinstance(module, QuantizedSwitchLinear):
        if module.global_scale is not None:
            raise LayoutError("experts with a global scale (nvfp4) are not offloaded")
        parts = {"weight": tuple(module.weight.shape), "scales": tuple(module.scales.shape)}
        if module.biases is not None:
            parts["biases"] = tuple(module.biases.shape)
        spec = ProjectionSpec(True, module.group_size, module.bits, module.mode, has_bias)
    elif isinstance(module, SwitchLinear):
        parts = {"weight": tuple(module.weight.shape)}
        spec = ProjectionSpec(False, bias=has_bias)
    else:
        raise LayoutError(f"an expert projection of type {type(module).__name__} is not offloaded")
    if has_bias:
        parts["bias"] = tuple(module["bias"].shape)
    return spec, parts


def switch_blocks(model: Module) -> list[tuple[str, Module, str, SwitchGLU]]:
    """Every ``SwitchGLU`` of ``model``: (path, parent module, attribute name, block)."""
    found = []
    for name, module in model.named_modules():  # type: ignore[no-untyped-call]
        for key, child in module.items():
            if isinstance(child, SwitchGLU):
                found.append((f"{name}.{key}" if name else key, module, key, child))
    found.sort(key=lambda item: item[0])
    return found


def install_offload(model: Module, index: dict[str, TensorRef], budget_bytes: int) -> ExpertStore:
    """Replace every ``SwitchGLU`` of the (not yet evaluated) ``model`` by an offloaded layer
    sharing one :class:`ExpertStore`; raises :class:`LayoutError` (and changes nothing) when the
    model has no expert block or a block's tensors cannot be located."""
    blocks = switch_blocks(model)
    if not blocks:
        raise LayoutError("the model has no MoE expert blocks (mlx-lm SwitchGLU)")
    plans = []
    slices: dict[int, list[dict[str, Slice]]] = {}
    for position, (path, parent, key, block) in enumerate(blocks):
        match = _LAYER.search(path + ".")
        layer = int(match.group(1)) if match else position
        if layer in slices:
            raise LayoutError("two expert blocks share a layer number")
        specs: dict[str, ProjectionSpec] = {}
        parts: dict[str, tuple[int, ...]] = {}
        num_experts = 0
        for name in PROJECTIONS:
            spec, shapes = _projection(block[name])
            specs[name] = spec
            parts.update({f"{name}.{p}": shape for p, shape in shapes.items()})
            num_experts = shapes["weight"][0]
        slices[layer] = expert_slices(index, path, parts, num_experts)
        plans.append((parent, key, layer, num_experts, specs, block.activation))
    store = ExpertStore(TensorFiles(), slices, budget_bytes)
    for parent, key, layer, num_experts, specs, activation in plans:
        setattr(parent, key, OffloadedSwitchGLU(layer, num_experts, store, specs, activation))
    return store
