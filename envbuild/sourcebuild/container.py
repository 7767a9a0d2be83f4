"""Source builds in a builder container made from the image's own lower layers.

:class:`ContainerBuilder` turns the base and the layers below the source-built ones (the venv with
the locked torch, the CUDA wheels, the small distributions) into an image — the same OCI image
writer as the build's, the layers from the store — and loads it into the container engine it is
given (:mod:`envbuild.engine`; ``docker load`` of a docker archive, so the engine keeps the layers
and a second load of the same layers is cheap; an image already in the engine is not loaded
again: its ID is its config digest). A build then runs in a throwaway container of that image:

* the work folder (the sdist in, the wheel out) is bind-mounted at ``/envbuild/work``, this
  machine's uv binary read-only at ``/envbuild/tools/uv``;
* ``uv pip install`` puts the build requirements into the image's own venv (the container's copy
  of it: nothing goes back into a layer), constrained to the lock's versions, then
  ``uv build --wheel --no-build-isolation`` builds against the venv's torch;
* the container gets this machine's proxy variables (``HTTP(S)_PROXY``, ``NO_PROXY``, ``ALL_PROXY``
  in either case) and the CA bundle ``$SSL_CERT_FILE`` names, mounted read-only, for the build
  only: none of it is an input of the derivation key, none of it enters an image (the container's
  changes are discarded; the log names the variables it passed, never their values);
* the network is ``host`` unless asked otherwise (an engine started with ``--bridge=none`` has no
  other way out).

The engine must see this machine's file system (the bind mounts): a local engine. The toolchain a
build would use (Python, gcc, g++, nvcc inside the image) is probed once per builder image by
:mod:`envbuild.sourcebuild.container_probe` (that file's text, run by the image's Python) and kept
in the store (derivation kind ``builder-probe``), so a no-op rebuild does not start the engine.

The builder's identity in a source build's key is ``{"mode": "container", "rootfs": …}``: the
sha256 of the image's layer diff IDs (uncompressed content), the same on every machine that
builds the same lower layers, whatever their compression.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from envbuild.build import dockerarchive
from envbuild.build import image as image_mod
from envbuild.build.layers import Layer
from envbuild.engine import ContainerEngine, Mount, RunRequest
from envbuild.errors import (
    ContainerStartFailed,
    EngineError,
    EngineUnreachable,
    EnvironmentFailure,
    ToolNotFound,
)
from envbuild.proc import core as proc
from envbuild.sourcebuild import container_probe
from envbuild.sourcebuild.builder import (
    SOURCE_DATE_EPOCH,
    Builder,
    BuildJob,
    BuildOutcome,
    Toolchain,
)
from envbuild.sourcebuild.toolchain import cuda_home_script, parse_nvcc
from envbuild.store.core import Output, Store

log = logging.getLogger(__name__)

WORK = "/envbuild/work"
UV = "/envbuild/tools/uv"
CA_BUNDLE = "/envbuild/tools/ca-certificates.pem"
#: The network settings a builder container gets from this machine (for the build only).
PROXY_VARIABLES = tuple(
    v
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY")
    for v in (name, name.lower())
)
PROBE_KIND = "builder-probe"
PROBE_FORMAT = 1


class ContainerBuilder(Builder):
    """Builds in a container of the image made of ``layers`` (base first) and ``config``.

    ``python`` is the interpreter inside the image (the venv's, ``/opt/venv/bin/python``);
    ``engine`` runs the containers; ``base_env`` replaces ``os.environ`` as the source of the
    proxy variables and ``SSL_CERT_FILE``; ``epoch`` (the plan's SOURCE_DATE_EPOCH, None when
    unset) dates the image.
    """

    mode = "container"

    def __init__(
        self,
        store: Store,
        *,
        layers: Sequence[Layer],
        config: image_mod.OciImageConfig,
        python: str = "/opt/venv/bin/python",
        network: str = "host",
        engine: ContainerEngine,
        base_env: Mapping[str, str] | None = None,
        epoch: int | None = None,
    ) -> None:
        self.store = store
        self.mtime = epoch or 0
        self.python = python
        self.network = network
        self.engine = engine
        self.base_env = dict(os.environ if base_env is None else base_env)
        history = [image_mod.History(created_by="envbuild builder layer") for _ in layers]
        self.image = image_mod.write_image(
            store,
            layers=layers,
            config=config,
            history=history,
            created=image_mod.epoch_time(epoch),
        )
        diff_ids = "\n".join(x.diff_id for x in layers)
        self.rootfs = "sha256:" + hashlib.sha256(diff_ids.encode()).hexdigest()
        self._probed: dict[bool, Toolchain] = {}
        self._loaded = False

    @property
    def image_id(self) -> str:
        """The engine's ID of the builder image: its config digest."""
        return self.image.config_digest

    def identity(self) -> dict[str, str]:
        return {"mode": self.mode, "rootfs": self.rootfs}

    # -- the network settings for a build (never an input, never in an image) ----------------

    def network_env(self) -> dict[str, str]:
        """The proxy variables of this machine, and ``SSL_CERT_FILE`` pointing at the mounted
        CA bundle when this machine names one."""
        env = {k: self.base_env[k] for k in PROXY_VARIABLES if self.base_env.get(k)}
        if self._ca_file() is not None:
            env["SSL_CERT_FILE"] = CA_BUNDLE
        return env

    def _ca_file(self) -> Path | None:
        value = self.base_env.get("SSL_CERT_FILE")
        return Path(value).resolve() if value and Path(value).is_file() else None

    # -- probe -------------------------------------------------------------------------------

    def probe(self, *, cuda: bool) -> Toolchain:
        if cuda not in self._probed:
            self._probed[cuda] = self._probe(cuda)
        return self._probed[cuda]

    def _probe(self, cuda: bool) -> Toolchain:
        inputs = {
            "format": PROBE_FORMAT,
            "rootfs": self.rootfs,
            "python": self.python,
            "cuda": cuda,
        }

        def run() -> Output:
            program = Path(container_probe.__file__).read_text(encoding="utf-8")
            script = (
                f"{shlex.quote(self.python)} - {'cuda' if cuda else ''} <<'EOF'\n{program}EOF\n"
            )
            code, text = self._run(script, network="none")
            prefix = container_probe.PREFIX
            line = next((ln for ln in text.splitlines() if ln.startswith(prefix)), None)
            if code != 0 or line is None:
                raise EnvironmentFailure(
                    f"the builder image cannot run {self.python} (exit status {code})",
                    hint="the image's venv and its interpreter are needed for source builds: "
                    f"check [python] and the base; the container said: {text.strip()[-500:]}",
                )
            data = line.removeprefix(prefix).encode()
            return Output(outputs={"probe": self.store.add_bytes(data)})

        drv = self.store.realize(PROBE_KIND, inputs, run).drv
        found: dict[str, Any] = json.loads(self.store.read_blob(drv.outputs["probe"]))
        for tool in ("gcc", "g++"):
            if not found.get(tool):
                raise ToolNotFound(
                    f"{tool} (the C/C++ compiler) in the builder image",
                    hint="source builds in a container need a compiler in the image's base: add "
                    "build-essential (Debian) to [base] packages, or build on the host "
                    "(--builder host)",
                )
        nvcc = None
        if cuda:
            got = found.get("nvcc")
            if not got:
                raise ToolNotFound(
                    "nvcc (the CUDA compiler) in the builder image",
                    hint="lock NVIDIA's nvidia-cuda-nvcc wheels (with nvidia-cuda-crt, "
                    "nvidia-nvvm, nvidia-cuda-runtime) or start from a CUDA devel base image",
                )
            nvcc = parse_nvcc(got["path"], got["version"], got["codes"], got["archs"])
        compilers = {"gcc": str(found["gcc"]), "g++": str(found["g++"])}
        if nvcc is not None:
            compilers["nvcc"] = nvcc.version
        return Toolchain(python=str(found["python"]), compilers=compilers, nvcc=nvcc)

    # -- build -------------------------------------------------------------------------------

    def build(self, job: BuildJob) -> BuildOutcome:
        work = job.work_dir.resolve()

        def at(path: Path) -> str:
            return f"{WORK}/{path.resolve().relative_to(work).as_posix()}"

        install = [UV, "pip", "install", "--python", self.python]
        if job.constraints:
            constraints = work / "constraints.txt"
            constraints.write_text("\n".join(job.constraints) + "\n")
            install += ["--constraint", at(constraints)]
        if job.exclude_newer:
            install.append(f"--exclude-newer={job.exclude_newer}")
        nvcc = self._probed.get(True)
        build_env = {**job.env, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(build_env.items()))
        cuda_path = ""
        if nvcc is not None and nvcc.nvcc is not None:
            # a CUDA_HOME made for the build, as on the host: the wheels' toolkit has no lib64
            # and no libcudart.so for torch's -lcudart (toolchain.assemble_cuda_home); in the
            # container's own /tmp, not the bind-mounted work folder
            home = str(Path(nvcc.nvcc.path).parent.parent)
            cuda_path = cuda_home_script(self.python, home, "/tmp/envbuild-cuda")
            cuda_path += 'export PATH="$CUDA_HOME/bin:$PATH"\n'
        uid, gid = os.getuid(), os.getgid()
        requires = " ".join(shlex.quote(r) for r in job.requires)
        build = [UV, "build", "--wheel", "--no-build-isolation", "--python", self.python]
        build += ["--out-dir", at(job.out_dir), at(job.sdist)]
        script = (
            "set -ex\n"
            + (f"{_join(install)} -- {requires}\n" if job.requires else "")
            + exports
            + cuda_path
            + "set +e\n"
            + f"{_join(build)}\n"
            + "status=$?\n"
            + "set +x\n"
            + f"chown -R {uid}:{gid} {shlex.quote(at(job.out_dir))}\n"
            + "exit $status\n"
        )
        index_env: dict[str, str] = {}
        if job.index_url:
            index_env["UV_INDEX_URL"] = _reveal(job.index_url, self.base_env)
        if job.extra_index_urls:
            index_env["UV_EXTRA_INDEX_URL"] = " ".join(
                _reveal(u, self.base_env) for u in job.extra_index_urls
            )
        header = self._header()
        code, text = self._run(script, network=self.network, work=work, env=index_env)
        wheels = sorted(job.out_dir.glob("*.whl"))
        wheel = wheels[0] if code == 0 and len(wheels) == 1 else None
        return BuildOutcome(code, header + text, wheel)

    def _header(self) -> str:
        passed = sorted(self.network_env())
        return (
            f"# builder container: image {self.image_id} (rootfs {self.rootfs}), network "
            f"{self.network}\n# for the build only, from this machine: "
            f"{', '.join(passed) or 'no proxy variables, no CA bundle'}"
            + (" (CA bundle mounted read-only)" if "SSL_CERT_FILE" in passed else "")
            + "\n"
        )

    # -- the engine --------------------------------------------------------------------------

    def _ensure_image(self) -> None:
        if self._loaded:
            return
        if self.engine.inspect_image(self.image_id) is not None:
            log.debug("builder image %s is in the engine", self.image_id[:19])
        else:
            log.info("loading the builder image %s into the engine", self.image_id[:19])
            with self.store.temp_dir("builder-") as tmp:
                archive = tmp / dockerarchive.DOCKER_ARCHIVE
                dockerarchive.write_docker_archive(
                    self.store,
                    self.image,
                    archive,
                    repo_tags=[f"envbuild/builder:{self.image_id.removeprefix('sha256:')[:12]}"],
                    mtime=self.mtime,
                )
                loaded = self.engine.load(archive)
            if loaded.id != self.image_id:
                raise EnvironmentFailure(
                    f"the engine loaded the builder image as {loaded.id}, expected {self.image_id}"
                ) from None
        self._loaded = True

    def _run(
        self,
        script: str,
        *,
        network: str,
        work: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> tuple[int, str]:
        """Run ``sh -c script`` in a throwaway container; its exit status and output."""
        mounts = [Mount(Path(proc.find_uv()).resolve(), UV)]
        environment = {
            "UV_PYTHON_DOWNLOADS": "never",
            "UV_NO_CONFIG": "1",
            "UV_CACHE_DIR": "/tmp/envbuild-uv-cache",
            "UV_NO_PROGRESS": "1",
            "LC_ALL": "C.UTF-8",
            "TZ": "UTC",
            **(env or {}),
        }
        if network != "none":
            environment.update(self.network_env())
            if (ca := self._ca_file()) is not None:
                mounts.append(Mount(ca, CA_BUNDLE))
        if work is not None:
            mounts.append(Mount(work, WORK, read_only=False))
        request = RunRequest(
            self.image_id,
            entrypoint=["/bin/sh", "-c"],
            command=[script],
            environment=environment,
            mounts=mounts,
            network=network,
            user="0:0",
            workdir=WORK if work is not None else "/",
            labels={"dev.envbuild.builder": self.rootfs},
        )
        try:
            self._ensure_image()
            done = self.engine.run(request, on_output=_log_output)
        except EngineUnreachable as exc:
            raise EnvironmentFailure(
                exc.message,
                hint="start dockerd or set DOCKER_HOST, or build on the host (--builder host)",
            ) from exc
        except ContainerStartFailed as exc:
            raise EnvironmentFailure(
                f"the builder image cannot start a container: {exc.detail}",
                hint="a builder image needs /bin/sh, the venv's Python and a compiler: a "
                "base with python3 and build-essential (Debian), or --builder host",
            ) from exc
        except EngineError as exc:
            raise EnvironmentFailure(f"the builder container failed: {exc.message}") from exc
        return done.exit_code, done.output


def _log_output(text: str) -> None:
    for line in text.splitlines():
        log.debug("builder: %s", line)


def _join(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def _reveal(url: str | proc.Secret, env: Mapping[str, str]) -> str:
    """An index URL with ``${NAME}`` filled from ``env`` (passed in the container's environment,
    not on its command line)."""
    import re

    text = url.reveal() if isinstance(url, proc.Secret) else url
    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), text)
