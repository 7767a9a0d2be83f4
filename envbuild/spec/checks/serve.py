"""Checks of what runs on the host: parallelism vs GPUs, the KV-cache dtype for the architecture
and vLLM release, the model's size vs GPU memory, the model's pinned revision, and the extra
arguments of ``vllm serve`` against that vLLM's flags."""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from envbuild.errors import Problem
from envbuild.spec import facts, serveflags
from envbuild.spec import knowledge as kb
from envbuild.spec.checks.core import WARNING, SpecGpu, capabilities
from envbuild.spec.load import LoadedSpec
from envbuild.spec.model import Spec

GB_PER_GIB = 1024**3 / 1e9
PLACEHOLDER_SHA = "0" * 40


def parallelism(loaded: LoadedSpec, gpus: list[SpecGpu]) -> Iterator[Problem]:
    serve = loaded.spec.serve
    if serve is None or not gpus:
        return
    have = sum(g.count for g in gpus)
    need = serve.tensor_parallel_size * serve.pipeline_parallel_size
    if need > have:
        yield loaded.problem(
            ("serve", "tensor_parallel_size"),
            f"tensor_parallel_size x pipeline_parallel_size = {serve.tensor_parallel_size} x "
            f"{serve.pipeline_parallel_size} = {need} GPUs, but the host has {have}",
            f"use at most {have} GPUs (e.g. tensor_parallel_size = {have})",
        )


def kv_cache(loaded: LoadedSpec, gpus: list[SpecGpu]) -> Iterator[Problem]:
    spec = loaded.spec
    serve = spec.serve
    if serve is None:
        return
    dtype = serve.kv_cache_dtype
    key = ("serve", "kv_cache_dtype")
    known = facts.knowledge().vllm_kv_cache_dtypes.dtypes
    if dtype not in known:
        close = difflib.get_close_matches(dtype, known, n=1, cutoff=0.5)
        yield loaded.problem(
            key,
            f"vLLM has no KV-cache dtype {dtype!r}",
            f"did you mean {close[0]!r}?" if close else f"use one of {', '.join(known[:6])} …",
        )
        return
    if spec.vllm is None:
        return
    version = spec.vllm.version
    family = kb.model_family(spec.model.repo) if spec.model else None
    for cc in capabilities(gpus):
        rules = kb.kv_cache_rules(cc, version)
        if family is not None:
            rules = [r for r in rules if r.attention == family.attention]
        rejecting = [r for r in rules if dtype not in r.dtypes]
        if not rejecting:
            continue
        kinds = " and ".join(sorted({r.attention.upper() for r in rejecting}))
        later = _accepting_range(rejecting[0], dtype)
        fix = 'use kv_cache_dtype = "auto"' + (f", or vLLM {later}" if later else "")
        if family is None and len(rejecting) < len(rules):
            # Only some attention kinds reject it, and the model's kind is unknown.
            yield loaded.problem(
                key,
                f"KV-cache dtype {dtype!r} is not available for {kinds} models on compute "
                f"capability {cc} in vLLM {version}; envbuild does not know {_repo(loaded)}'s "
                "attention",
                fix,
                severity=WARNING,
            )
        else:
            what = f"{family.name} ({family.attention.upper()})" if family else "any model"
            yield loaded.problem(
                key,
                f"vLLM {version} has no KV-cache dtype {dtype!r} for {what} on compute "
                f"capability {cc} (it takes {', '.join(rejecting[0].dtypes)})",
                fix,
            )


def _repo(loaded: LoadedSpec) -> str:
    return loaded.spec.model.repo if loaded.spec.model else "the model"


def _accepting_range(rule: facts.KvCacheRule, dtype: str) -> str | None:
    for other in facts.knowledge().kv_cache:
        if (
            other.attention == rule.attention
            and other.cc_major == rule.cc_major
            and dtype in other.dtypes
        ):
            return other.vllm
    return None


def commits_url(repo: str) -> str:
    return f"https://huggingface.co/{repo}/commits/main"


def placeholders(spec: Spec) -> list[tuple[tuple[str, ...], str, str]]:
    """The (key, repo, revision) of every model repo pinned to the all-zero placeholder."""
    model = spec.model
    if model is None:
        return []
    found: list[tuple[tuple[str, ...], str, str]] = [
        (("model", "revision"), model.repo, model.revision)
    ]
    for part, aux in (("tokenizer", model.tokenizer), ("config", model.config)):
        if aux is not None:
            found.append((("model", part, "revision"), aux.repo, aux.revision))
    return [f for f in found if f[2] == PLACEHOLDER_SHA]


def model_size(loaded: LoadedSpec, gpus: list[SpecGpu]) -> Iterator[Problem]:
    spec = loaded.spec
    if spec.model is None or not gpus:
        return
    for key, repo, _revision in placeholders(spec):
        yield loaded.problem(
            key,
            "the revision is the all-zero placeholder, not a commit of the repo",
            f"put the commit sha from {commits_url(repo)}",
            severity=WARNING,
        )
    sizes = [g.memory_gib for g in gpus if g.memory_gib]
    if len(sizes) != len(gpus):
        return
    count = sum(g.count for g in gpus)
    used = count
    utilization = 1.0
    if spec.serve is not None:
        used = min(count, spec.serve.tensor_parallel_size * spec.serve.pipeline_parallel_size)
        utilization = spec.serve.gpu_memory_utilization
    total_gb = used * min(sizes) * GB_PER_GIB
    usable_gb = total_gb * utilization
    if spec.model.size_gb > usable_gb:
        yield loaded.problem(
            ("model", "size_gb"),
            f"the model ({spec.model.size_gb:g} GB) is larger than the memory vLLM may use on "
            f"{used} GPU{'' if used == 1 else 's'} ({usable_gb:.0f} of {total_gb:.0f} GB at "
            f"gpu_memory_utilization {utilization:g}); it will not load without offloading",
            "use more GPUs, a smaller quantization, or cpu offloading in serve.extra_args",
            severity=WARNING,
        )


def extra_args(loaded: LoadedSpec, gpus: list[SpecGpu]) -> Iterator[Problem]:
    """``serve.extra_args`` against the serve flags of the vLLM the spec pins (a table in the
    knowledge base, extracted from that vLLM's wheel)."""
    spec = loaded.spec
    if spec.serve is None or not spec.serve.extra_args:
        return
    key = ("serve", "extra_args")
    if spec.vllm is None:
        yield loaded.problem(
            key,
            "serve.extra_args cannot be checked: the spec pins no [vllm]",
            'pin vLLM ([vllm] version = "…")',
            severity=WARNING,
        )
        return
    flags = serveflags.table(spec.vllm.version)
    if flags is None:
        known = ", ".join(serveflags.known_versions()) or "none"
        yield loaded.problem(
            key,
            f"envbuild has no serve-flag table for vLLM {spec.vllm.version} (it has {known}): "
            "serve.extra_args are not checked",
            "extract one with tools/vllm_serve_flags.py (see its --help)",
            severity=WARNING,
        )
        return
    for problem in serveflags.check_args(flags, list(spec.serve.extra_args)):
        yield loaded.problem((*key, problem.index), problem.message, problem.fix)
