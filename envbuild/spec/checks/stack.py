"""Checks of the host and the core stack: GPUs, driver vs CUDA, torch's CUDA variant, vLLM's
torch pin, the model family's minimum vLLM, GGUF support."""

from __future__ import annotations

import re
from collections.abc import Iterator

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from envbuild.errors import Problem
from envbuild.spec import facts
from envbuild.spec import knowledge as kb
from envbuild.spec.checks.core import WARNING, SpecGpu
from envbuild.spec.load import LoadedSpec
from envbuild.spec.locate import KeyPath


def host_gpus(loaded: LoadedSpec, targets: list[SpecGpu]) -> Iterator[Problem]:
    host = loaded.spec.host
    for i, g in enumerate(host.gpus if host else []):
        key: KeyPath = ("host", "gpus", i)
        fact = kb.gpu(g.model)
        if fact is None:
            close = kb.suggest_gpu(g.model)
            hint = (
                f"did you mean {' or '.join(repr(c) for c in close)}?"
                if close
                else "use a GPU name from envbuild/spec/knowledge.toml, or add the GPU there"
            )
            yield loaded.problem((*key, "model"), f"unknown GPU model {g.model!r}", hint)
            continue
        if g.compute_capability and g.compute_capability != fact.compute_capability:
            yield loaded.problem(
                (*key, "compute_capability"),
                f"{fact.name} has compute capability {fact.compute_capability}, "
                f"not {g.compute_capability}",
                f'set compute_capability = "{fact.compute_capability}" or leave it out',
            )
        if g.memory_gib and abs(g.memory_gib - fact.memory_gib) > 0.05 * fact.memory_gib:
            yield loaded.problem(
                (*key, "memory_gib"),
                f"{fact.name} has {fact.memory_gib:g} GiB per GPU, not {g.memory_gib:g}",
                f"set memory_gib = {fact.memory_gib:g} or leave it out",
            )


def driver_vs_cuda(loaded: LoadedSpec, gpus: list[SpecGpu]) -> Iterator[Problem]:
    spec = loaded.spec
    if not spec.host or not spec.cuda:
        return
    driver, cuda = spec.host.driver, spec.cuda.version
    major = int(cuda.split(".")[0])
    floor = kb.major_min_driver(major)
    if floor and kb.driver_key(driver) < kb.driver_key(floor.driver):
        yield loaded.problem(
            ("host", "driver"),
            f"driver {driver} cannot run CUDA {major}.x at all (needs >= {floor.driver})",
            f"upgrade the driver, or use a CUDA {major - 1}.x toolkit",
        )
        return
    fact = kb.min_driver(cuda)
    if fact is None:
        yield loaded.problem(
            ("cuda", "version"),
            f"CUDA {cuda} is not in envbuild's knowledge base; only the CUDA {major}.x driver "
            "floor was checked",
            "add its minimum driver to envbuild/spec/knowledge.toml",
            severity=WARNING,
        )
    elif kb.driver_key(driver) < kb.driver_key(fact.driver):
        yield loaded.problem(
            ("host", "driver"),
            f"driver {driver} is older than CUDA {fact.cuda}'s minimum {fact.driver}",
            f"upgrade the driver to >= {fact.driver}, or use a CUDA release it supports",
        )


def torch_variant(loaded: LoadedSpec, gpus: list[SpecGpu]) -> Iterator[Problem]:
    spec = loaded.spec
    torch = spec.torch
    if torch is None:
        return
    if torch.index == "pypi":
        fact = kb.torch_pypi_cuda(torch.version)
        if fact is None:
            yield loaded.problem(
                ("torch", "version"),
                f"torch {torch.version} is not in envbuild's knowledge base; the CUDA variant "
                "of its PyPI wheels was not checked",
                "add it to torch_pypi in envbuild/spec/knowledge.toml",
                severity=WARNING,
            )
        elif fact.cuda != torch.cuda:
            yield loaded.problem(
                ("torch", "cuda"),
                f"PyPI's torch {torch.version} is a {fact.cuda} build, not {torch.cuda}",
                f'set cuda = "{fact.cuda}", or take torch from the index that has '
                f'{torch.cuda} (index = "https://download.pytorch.org/whl/{torch.cuda}")',
            )
    else:
        m = re.search(r"/(cu\d{3}|cpu)/?$", torch.index)
        if m and m.group(1) != torch.cuda:
            yield loaded.problem(
                ("torch", "cuda"),
                f"torch.index serves {m.group(1)} wheels, but torch.cuda is {torch.cuda}",
                f'set cuda = "{m.group(1)}" or point index at .../whl/{torch.cuda}',
            )
    if torch.cuda == "cpu":
        return
    variant = f"{torch.cuda[2:-1]}.{torch.cuda[-1]}"
    major = int(torch.cuda[2:-1])
    if spec.host:
        driver = spec.host.driver
        floor = kb.major_min_driver(major)
        ga = kb.min_driver(variant)
        if floor and kb.driver_key(driver) < kb.driver_key(floor.driver):
            yield loaded.problem(
                ("torch", "cuda"),
                f"torch's {torch.cuda} wheels need a CUDA {major}.x driver (>= {floor.driver}); "
                f"the host has {driver}",
                "upgrade the driver, or use a torch built for an older CUDA",
            )
        elif ga and kb.driver_key(driver) < kb.driver_key(ga.driver):
            older = kb.newest_cuda_for(driver, major)
            yield loaded.problem(
                ("torch", "cuda"),
                f"torch's {torch.cuda} wheels are CUDA {variant} builds and driver {driver} is "
                f"below CUDA {variant}'s minimum {ga.driver}: they run only by CUDA minor version "
                f"compatibility, where the driver cannot JIT-compile PTX newer than its own CUDA "
                "(kernels without SASS for the GPU fail to load) and APIs that need a newer "
                "driver fail",
                f"upgrade the driver to >= {ga.driver}"
                + (f", or use a torch built for CUDA {older} or older" if older else ""),
                severity=WARNING,
            )
    if spec.cuda and int(spec.cuda.version.split(".")[0]) != major:
        yield loaded.problem(
            ("torch", "cuda"),
            f"torch is built for CUDA {variant} but the toolkit is CUDA {spec.cuda.version}; "
            "torch's extension builds need the same CUDA major",
            f"use a CUDA {major}.x toolkit, or a torch built for CUDA "
            f"{spec.cuda.version.split('.')[0]}",
        )


def vllm_pins(loaded: LoadedSpec, gpus: list[SpecGpu]) -> Iterator[Problem]:
    spec = loaded.spec
    vllm = spec.vllm
    if vllm is None:
        return
    pinned = kb.vllm_torch(vllm.version)
    if pinned is None:
        yield loaded.problem(
            ("vllm", "version"),
            f"vLLM {vllm.version} is not in envbuild's knowledge base; its torch pin was not "
            "checked",
            "add it to vllm_torch.pins in envbuild/spec/knowledge.toml",
            severity=WARNING,
        )
    elif spec.torch and Version(spec.torch.version).public != pinned:
        others = sorted(
            (r for r, t in facts.knowledge().vllm_torch.pins.items() if t == spec.torch.version),
            key=Version,
        )
        alt = f", or a vLLM that pins it ({', '.join(others)})" if others else ""
        yield loaded.problem(
            ("torch", "version"),
            f"vLLM {vllm.version} pins torch=={pinned}, but the spec pins torch "
            f"{spec.torch.version}",
            f'set torch.version = "{pinned}"{alt}',
        )
    model = spec.model
    if model is None:
        return
    family = kb.model_family(model.repo)
    if family and Version(vllm.version) < Version(family.min_vllm):
        yield loaded.problem(
            ("vllm", "version"),
            f"{family.name} ({model.repo}) needs vLLM >= {family.min_vllm}; the spec has "
            f"{vllm.version}",
            f'set vllm.version to "{family.min_vllm}" or newer',
        )
    is_gguf = model.gguf is not None or "gguf" in model.repo.lower()
    is_gguf = is_gguf or any(f.endswith(".gguf") for f in model.files)
    if is_gguf and model.gguf is None and spec.serve is not None:
        yield loaded.problem(
            ("model", "repo"),
            f"{model.repo} looks like a GGUF repo, and the unit would serve it by its repo id, "
            "which vLLM does not load as GGUF (vllm-gguf-plugin takes repo:QUANT, a .gguf file "
            "or folder:QUANT)",
            'add [model.gguf] with quant = "<the quant type>" and the folder its files are in',
            severity=WARNING,
        )
    fact = kb.gguf(vllm.version)
    if is_gguf and fact and fact.packages:
        named = {canonicalize_name(p) for p in spec.packages} | {
            canonicalize_name(_req_name(r) or "") for r in spec.requirements
        }
        if fact.extra not in vllm.extras and not named & {
            canonicalize_name(p) for p in fact.packages
        }:
            yield loaded.problem(
                ("vllm", "extras"),
                f"{model.repo} is a GGUF model, and vLLM {vllm.version} reads GGUF only "
                f"through {', '.join(fact.packages)}",
                f'add extras = ["{fact.extra}"] to [vllm]',
            )


def _req_name(text: str) -> str | None:
    try:
        return Requirement(text).name
    except InvalidRequirement:
        return None
