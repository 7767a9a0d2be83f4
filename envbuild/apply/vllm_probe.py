"""vLLM's own ``vllm serve`` argument parser, asked from inside a venv that holds vLLM.

This file is run as a script by the venv's interpreter (``python -I vllm_probe.py MODE``); it
imports nothing from envbuild, only the standard library and vLLM. It builds the parser the way
``vllm``'s entry point does (a top parser with the ``serve`` subcommand) and either

- ``dump``: prints every serve flag as JSON (names, dest, whether it takes a value, choices, its
  group), plus the tool-call and reasoning parsers vLLM has registered, which vLLM checks after
  parsing; or
- ``parse``: reads a JSON list of commands on stdin (each the arguments after ``vllm serve``),
  parses each as ``vllm serve ARG...`` and runs the checks vLLM runs before loading anything
  (``ServeSubcommand.validate`` and the parser-name checks of the API server); prints a list of
  ``{"ok": true, "reference": {model, tokenizer, hf_config_path, revision}}`` (what the parsed
  command names to load) or ``{"ok": false, "error": …}``, one per command. When vLLM's parser
  cannot even be imported, it prints ``{"ok": null, "error": …}`` once; or
- ``model``: reads a list of such references on stdin and resolves each the way the engine
  will, with the locked code's own functions, offline in the unit's ``HF_HOME``: the
  installed general plugins that take over model references first (vllm-gguf-plugin: its
  ``_is_gguf_reference``, its loader's ``_prepare_weights`` and shard discovery, its config
  source), then vLLM's ``file_or_path_exists`` for the config. Prints a list of ``{"ok",
  "error", "kind", "weights", "shards", "config", "plugins"}`` (``{"ok": null, "error"}``
  once when vLLM cannot be imported).

Nothing is loaded onto a GPU and no weights are read (a GGUF file's first bytes at most).
"""

# mypy: disable-error-code="import-not-found"
# (vLLM is in the venv this runs in, not in envbuild's)

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from typing import Any


def _quiet_cpu_env() -> None:
    # vLLM reads these when imported; keep the probe quiet and off the network.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # vLLM builds default configs while it adds the flags, and those ask for the platform; an
    # explicit CPU target is authoritative in vLLM, so parsing never probes a GPU (nor
    # disturbs the service that may hold them while apply's preflight runs).
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"


def _serve_parser() -> tuple[argparse.ArgumentParser, Any]:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(prog="vllm")
    sub = top.add_subparsers(required=False, dest="subparser")
    cmd = ServeSubcommand()
    cmd.subparser_init(sub).set_defaults(dispatch_function=cmd.cmd)
    return top, cmd


def _serve_actions(top: argparse.ArgumentParser) -> tuple[argparse.ArgumentParser, list[Any]]:
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            serve = action.choices["serve"]
            return serve, list(serve._actions)
    raise SystemExit("no serve subcommand")


def _groups(parser: argparse.ArgumentParser) -> dict[int, str]:
    out: dict[int, str] = {}
    for group in parser._action_groups:
        for action in group._group_actions:
            out[id(action)] = group.title or ""
    return out


def dump() -> dict[str, Any]:
    from vllm import __version__
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    top, _cmd = _serve_parser()
    serve, actions = _serve_actions(top)
    groups = _groups(serve)
    flags = []
    for action in actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        choices = None
        if action.choices is not None:
            choices = sorted(str(c) for c in action.choices)
        flags.append(
            {
                "names": list(action.option_strings),
                "dest": action.dest,
                "takes_value": action.nargs != 0,
                "nargs": None if action.nargs is None else str(action.nargs),
                "choices": choices,
                "group": groups.get(id(action), ""),
            }
        )
    return {
        "vllm": __version__,
        "flags": flags,
        "tool_call_parsers": ToolParserManager.list_registered(),
        "reasoning_parsers": ReasoningParserManager.list_registered(),
    }


def parse(argv: list[str]) -> dict[str, Any]:
    from vllm.entrypoints.common.cli_args import validate_api_server_args

    top, cmd = _serve_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = top.parse_args(["serve", *argv])
            cmd.validate(args)
            if getattr(args, "model_tag", None) is not None:
                args.model = args.model_tag
            validate_api_server_args(args)
    except SystemExit as exc:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        message = lines[-1] if lines else f"the parser exited with {exc.code}"
        return {"ok": False, "error": message.removeprefix("vllm: error: ")}
    except Exception as exc:  # vLLM's checks raise ValueError, TypeError, KeyError
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    reference = {
        key: None if getattr(args, key, None) is None else str(getattr(args, key))
        for key in ("model", "tokenizer", "hf_config_path", "revision")
    }
    return {"ok": True, "reference": reference}


#: General plugins whose model-reference handling this probe runs (their own functions).
GGUF_PLUGIN = "vllm_gguf_plugin"


def _plugins() -> list[str]:
    from importlib.metadata import entry_points

    return sorted(f"{ep.name}={ep.value}" for ep in entry_points(group="vllm.general_plugins"))


def model(ref: dict[str, Any]) -> dict[str, Any]:
    """Where the engine would load ``ref`` from (see the module's docstring)."""
    from types import SimpleNamespace

    plugins = _plugins()
    name = str(ref["model"])
    out: dict[str, Any] = {"plugins": plugins, "kind": "hf", "weights": None, "shards": []}
    config_source = name
    if any(p.split("=", 1)[1].startswith(GGUF_PLUGIN) for p in plugins):
        # what the plugin's register() patches into EngineArgs.create_model_config decides
        from vllm_gguf_plugin import plugin as gguf_plugin
        from vllm_gguf_plugin.loader import GGUFModelLoader
        from vllm_gguf_plugin.weights_adapter.default import GGUFWeightsAdapter

        if gguf_plugin._is_gguf_reference(name):
            out["kind"] = "gguf"
            loader = SimpleNamespace(load_config=SimpleNamespace(download_dir=None,
                                                                 ignore_patterns=None))  # fmt: skip
            try:
                weights = GGUFModelLoader._prepare_weights(
                    loader, SimpleNamespace(model_weights=name, model=name)
                )
            except Exception as exc:  # its loader raises ValueError, the hub offline errors
                return {**out, "ok": False,
                        "error": f"vllm-gguf-plugin cannot find the weights: {exc}"}  # fmt: skip
            out["weights"] = os.path.abspath(weights)
            out["shards"] = [os.path.abspath(f) for f in
                             GGUFWeightsAdapter._get_all_gguf_files(weights)]  # fmt: skip
            config_source = gguf_plugin._get_gguf_config_source(
                name, ref.get("tokenizer"), ref.get("hf_config_path")
            )
    from vllm.transformers_utils.repo_utils import file_or_path_exists

    try:
        found = file_or_path_exists(config_source, "config.json", revision=ref.get("revision"))
    except Exception as exc:  # an invalid repo id, the hub offline
        found, why = False, f"{type(exc).__name__}: {exc}"
    else:
        why = "no config.json there"
    if not found:
        return {**out, "ok": False, "error": (
            f"vLLM reads {config_source!r} as a Hugging Face repo id or a folder and finds "
            f"no model there ({why})"
        )}  # fmt: skip
    out["config"] = _config_folder(config_source, ref.get("revision"))
    if out["kind"] == "hf":
        out["weights"] = out["config"]
    return {**out, "ok": True, "error": None}


def _config_folder(source: str, revision: str | None) -> str:
    if os.path.exists(source):
        return os.path.abspath(source)
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id=source, filename="config.json", revision=revision)
    return os.path.dirname(str(cached)) if isinstance(cached, str) else ""


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1] not in ("dump", "parse", "model"):
        sys.stderr.write(
            "usage: vllm_probe.py dump | parse < [[ARG, ...], ...] | model < {model, ...}\n"
        )
        return 2
    commands: Any = json.load(sys.stdin) if sys.argv[1] in ("parse", "model") else []
    # vLLM may print while importing; only our JSON goes to stdout.
    out = sys.stdout
    sys.stdout = sys.stderr
    _quiet_cpu_env()
    result: Any
    if sys.argv[1] == "dump":
        result = dump()
    elif sys.argv[1] == "model":
        try:
            import vllm.transformers_utils.repo_utils
        except Exception as exc:
            result = {"ok": None, "error": f"{type(exc).__name__}: {exc}"}
        else:
            result = [model(ref) for ref in commands]
    else:
        try:
            import vllm.entrypoints.cli.serve  # noqa: F401
        except Exception as exc:  # an ImportError, or what vLLM raises while importing
            result = {"ok": None, "error": f"{type(exc).__name__}: {exc}"}
        else:
            result = [parse([str(a) for a in argv]) for argv in commands]
    out.write(json.dumps(result, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
