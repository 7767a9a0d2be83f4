"""`envbuild snapshot`, `diff` and `verify` end to end on a real venv: the story's debug line."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path
from typing import Any

import pytest

from snapshot.conftest import ALPHA_FILES, later, pip_install, site_packages

Cli = Any

MODEL_SIZE = len(ALPHA_FILES["alpha/models/llama.py"])
EDITED = f"differs from RECORD (size {MODEL_SIZE} → {MODEL_SIZE + len('    print(h)' + chr(10))} B)"

#: What a test machine has that a snapshot would otherwise try (and take seconds on).
SCOPE = ("--no-docker", "--no-systemd")


def take(cli: Cli, venv: Path, out: Path, *extra: str) -> Path:
    result = cli("snapshot", "--python", venv, "--hf-cache", out.parent / "hf", *SCOPE, "-o", out,
                 *extra)  # fmt: skip
    assert result.exit_code == 0, result.stderr
    return out


def edit_model(venv: Path) -> Path:
    model = site_packages(venv) / "alpha" / "models" / "llama.py"
    model.write_text(model.read_text().replace("    h = x * 2\n", "    h = x * 2\n    print(h)\n"))
    later(model)
    return model


def test_snapshot_writes_a_canonical_manifest_and_a_summary(
    cli: Cli, venv: Path, tmp_path: Path
) -> None:
    out = tmp_path / "snap.json"
    result = cli("snapshot", "--python", venv, "--no-models", *SCOPE, "-o", out)
    assert result.exit_code == 0, result.stderr
    text = out.read_text()
    data = json.loads(text)
    assert text == json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    assert data["schema_version"] == 2 and data["kind"] == "envbuild.snapshot"
    assert [d["name"] for d in data["pythons"][0]["distributions"]] == ["alpha", "beta"]
    assert (
        "2 distributions, 0 modified, 0 missing, 0 unrecorded, 1 overlapping paths" in result.stdout
    )
    # no -o: the manifest is stdout
    again = cli("snapshot", "--python", venv, "--no-models", *SCOPE, "--quick")
    assert again.exit_code == 0
    assert again.json()["pythons"][0]["integrity"] == "quick"


def test_the_edited_file_is_named_by_snapshot_diff_and_verify(
    cli: Cli, venv: Path, tmp_path: Path
) -> None:
    before = take(cli, venv, tmp_path / "before.json")
    assert cli("verify", before).exit_code == 0

    edit_model(venv)
    after = take(cli, venv, tmp_path / "after.json")
    shown = cli("snapshot", "--python", venv, "--no-models", *SCOPE, "-o", tmp_path / "x.json")
    assert "modified: alpha/models/llama.py (alpha 1.0)" in shown.stdout

    diff = cli("diff", before, after)
    assert diff.exit_code == 1
    assert f"alpha/models/llama.py (alpha): ∅ → {EDITED}" in diff.stdout
    data = cli("diff", before, after, "--json").json()
    assert data["different"] is True
    [files] = [g for g in data["groups"] if g["key"].startswith("files ")]
    assert [c["subject"] for c in files["changes"]] == ["alpha/models/llama.py (alpha)"]

    for quick in ((), ("--quick",)):
        verify = cli("verify", before, *quick)
        assert verify.exit_code == 1, verify.stderr
        assert verify.stdout.splitlines() == [
            f"files that differ from their RECORD ({venv}):",
            f"  alpha/models/llama.py (alpha): ∅ → {EDITED}",
        ]
    assert cli("verify", after).exit_code == 0
    assert cli("diff", after, after).exit_code == 0


def test_deleted_added_and_upgraded(cli: Cli, venv: Path, wheelhouse: Path, tmp_path: Path) -> None:
    before = take(cli, venv, tmp_path / "before.json")
    sp = site_packages(venv)
    (sp / "beta" / "__init__.py").unlink()
    (sp / "alpha" / "models" / "mistral_debug.py").write_text("x = 1\n")
    pip_install(venv, str(wheelhouse / "alpha-2.0-py3-none-any.whl"))
    after = take(cli, venv, tmp_path / "after.json")
    diff = cli("diff", before, after)
    assert diff.exit_code == 1
    lines = diff.stdout.splitlines()
    assert any(line.startswith("  alpha: 1.0 → 2.0, +") for line in lines), lines
    assert "  alpha/models/mistral_debug.py (alpha): ∅ → added (not in its RECORD)" in lines
    assert "  beta/__init__.py (beta): ∅ → missing" in lines
    verify = cli("verify", before, "--json").json()
    assert verify["drift"] is True
    subjects = {c["subject"] for g in verify["groups"] for c in g["changes"]}
    assert {"alpha", "beta/__init__.py (beta)", "alpha/models/mistral_debug.py (alpha)"} <= subjects


def test_a_gone_venv_is_drift_not_an_error(cli: Cli, venv: Path, tmp_path: Path) -> None:
    before = take(cli, venv, tmp_path / "before.json")
    import shutil

    shutil.rmtree(venv)
    verify = cli("verify", before)
    assert verify.exit_code == 1
    assert f"  {venv}: cpython" in verify.stdout
    assert "→ ∅" in verify.stdout


def test_diff_of_two_venvs_on_different_paths_pairs_them(
    cli: Cli, venv: Path, base_venv: Path, tmp_path: Path
) -> None:
    a = take(cli, base_venv, tmp_path / "a.json")
    edit_model(venv)
    b = take(cli, venv, tmp_path / "b.json")
    diff = cli("diff", a, b)
    assert diff.exit_code == 1
    assert "alpha/models/llama.py (alpha): ∅ → differs from RECORD" in diff.stdout
    assert "Python environments:" not in diff.stdout
    # paired, and said so
    assert (
        f"note: the Python environments are at different paths: {base_venv} in {a}, {venv} in "
        f"{b}; compared with each other"
    ) in diff.stdout.splitlines()
    assert cli("diff", a, b, "--json").json()["notes"] == [diff.stdout.splitlines()[-1][6:]]


@pytest.mark.parametrize("extra", [(), ("--json",)])
def test_snapshot_against_a_build_manifest(
    cli: Cli, venv: Path, tmp_path: Path, extra: tuple[str, ...]
) -> None:
    snap = take(cli, venv, tmp_path / "snap.json")
    image = tmp_path / "images" / "exp"
    image.mkdir(parents=True)
    (image / "build-manifest.json").write_text(json.dumps({
        "packages": [{"name": "alpha", "version": "1.0"}, {"name": "Beta", "version": "0.9"},
                     {"name": "gamma", "version": "3"}],
        "layers": [{"name": "base", "digest": "sha256:" + "a" * 64, "size": 100}],
    }))  # fmt: skip
    result = cli("diff", snap, image / "build-manifest.json", *extra)
    assert result.exit_code == 1
    if extra:
        data = result.json()
        [pk] = [g for g in data["groups"] if g["key"].startswith("packages")]
        changes = {c["subject"]: (c["before"], c["after"]) for c in pk["changes"]}
        assert changes == {
            "beta": ("1.0", "0.9"),
            "gamma": (None, "3"),
        }
        assert any("host" in n for n in data["not_compared"])
    else:
        assert "  beta: 1.0 → 0.9" in result.stdout
        assert "  gamma: ∅ → 3" in result.stdout
    # the image folder can be recorded in a snapshot, then its layers are compared too
    with_image = take(cli, venv, tmp_path / "with-image.json", "--image", image)
    assert json.loads(with_image.read_text())["image"]["manifest"]["layers"][0]["name"] == "base"


def test_layers_of_the_recorded_image_against_a_new_build(
    cli: Cli, venv: Path, tmp_path: Path
) -> None:
    image = tmp_path / "images" / "exp"
    image.mkdir(parents=True)
    layer = {"name": "python", "digest": "sha256:" + "a" * 64, "size": 1000}
    (image / "build-manifest.json").write_text(json.dumps({"layers": [layer]}))
    snap = take(cli, venv, tmp_path / "snap.json", "--image", image)
    rebuilt = tmp_path / "rebuilt.json"
    rebuilt.write_text(
        json.dumps({"layers": [{**layer, "digest": "sha256:" + "b" * 64, "size": 1500}]})
    )
    result = cli("diff", snap, rebuilt)
    assert result.exit_code == 1
    assert f"  python: sha256:{'a' * 64} → sha256:{'b' * 64}, +500 B" in result.stdout.splitlines()
    assert cli("diff", snap, image / "build-manifest.json").exit_code == 0


def test_against_envbuild_build_manifest(cli: Cli, venv: Path, tmp_path: Path) -> None:
    """The build manifest `envbuild build` writes (envbuild.build.manifest.BuildManifest): packages
    come from its layers' name==version lists; its image digest is compared with the one a
    snapshot recorded with --image."""
    from envbuild.build.manifest import BuildManifest, BuiltLayer

    def manifest(beta: str, image: str) -> BuildManifest:
        layer = BuiltLayer(
            name="python", kind="packages", key="k", digest="sha256:" + "a" * 64,
            diff_id="sha256:" + "b" * 64, size=2048, media_type="tar",
            distributions=["alpha==1.0", f"beta=={beta}"],
        )  # fmt: skip
        return BuildManifest(
            generator="envbuild 0.1.0", spec="exp", spec_hash="c" * 64, lock_hash="d" * 64,
            base={}, source_date_epoch=0, layers=[layer], config="sha256:" + "e" * 64,
            image=image, outputs={},
        )  # fmt: skip

    image = tmp_path / "images" / "exp"
    image.mkdir(parents=True)
    built = manifest("1.0", "sha256:" + "1" * 64)
    (image / "build-manifest.json").write_text(built.model_dump_json())
    snap = take(cli, venv, tmp_path / "snap.json", "--image", image)
    result = cli("diff", snap, image / "build-manifest.json")
    assert result.exit_code == 0, result.stdout
    rebuilt = tmp_path / "rebuilt.json"
    rebuilt.write_text(manifest("1.1", "sha256:" + "2" * 64).model_dump_json())
    result = cli("diff", snap, rebuilt)
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert "  beta: 1.0 → 1.1" in lines
    assert f"  image: sha256:{'1' * 64} → sha256:{'2' * 64}" in lines


def test_a_distribution_without_record_is_said_to_be_unchecked(
    cli: Cli, venv: Path, tmp_path: Path
) -> None:
    """Some installers write no RECORD: legit, but nothing of it can be checked, and the summary
    says so instead of counting it clean. In the manifest, ``record_sha256`` is null."""
    (site_packages(venv) / "beta-1.0.dist-info" / "RECORD").unlink()
    out = tmp_path / "snap.json"
    result = cli("snapshot", "--python", venv, "--no-models", *SCOPE, "-o", out)
    assert result.exit_code == 0, result.stderr
    [beta] = [d for d in json.loads(out.read_text())["pythons"][0]["distributions"]
              if d["name"] == "beta"]  # fmt: skip
    assert (beta["record_sha256"], beta["files"]) == (None, 0)
    assert "overlapping paths, 1 without RECORD (full check)" in result.stdout
    assert "  no RECORD: beta-1.0.dist-info (beta 1.0): its files cannot be checked" in (
        result.stdout.splitlines()
    )


def test_stray_files_are_named_with_the_distributions_sharing_their_folder(
    cli: Cli, venv: Path, tmp_path: Path
) -> None:
    before = take(cli, venv, tmp_path / "before.json")
    sp = site_packages(venv)
    (sp / "shared" / "stray.py").write_text("x = 1\n")  # shared/ belongs to alpha and beta
    (sp / "loose.py").write_text("y = 2\n")  # site-packages itself: nobody's folder
    shown = cli("snapshot", "--python", venv, "--no-models", *SCOPE, "-o", tmp_path / "x.json")
    assert "2 unrecorded" in shown.stdout
    lines = shown.stdout.splitlines()
    assert "  unrecorded: shared/stray.py (a folder of alpha & beta)" in lines
    assert "  unrecorded: loose.py (no distribution)" in lines
    verify = cli("verify", before)
    assert verify.exit_code == 1
    assert "  shared/stray.py (a folder of alpha & beta): ∅ → added (in no RECORD)" in (
        verify.stdout.splitlines()
    )
    assert "  loose.py (no distribution): ∅ → added (in no RECORD)" in verify.stdout.splitlines()
    data = cli("verify", before, "--json").json()
    [files] = [g for g in data["groups"] if g["key"].startswith("files ")]
    stray = next(c for c in files["changes"] if c["item"]["path"] == "shared/stray.py")
    assert stray["item"]["folder_owners"] == ["alpha", "beta"]
    assert stray["item"]["distribution"] is None
    assert stray["before_fields"] is None
    assert stray["after_fields"] == {
        "status": "added", "size": 6, "sha256": hashlib.sha256(b"x = 1\n").hexdigest(),
        "mode": f"{stat.S_IMODE((sp / 'shared' / 'stray.py').stat().st_mode):04o}",
    }  # fmt: skip
