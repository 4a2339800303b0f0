"""rlkit bundle: what goes to the node, and a verified split/join/install round trip (no network)."""
import base64
import hashlib
import json
import re
import subprocess
import sys
import zipfile

import pytest

from rlkit.tools import bundle as B
from rlkit.tools import bundle_archive as A


def test_decide_brings_missing_and_mismatched_and_keeps_node_torch():
    resolved = [("vllm", "0.24.0", "u1"), ("torch", "2.11.0", "u2"), ("transformers", "5.9.0", "u3"),
                ("PyYAML", "6.0.2", "u4"), ("nvidia-cublas", "13.1", "u5"), ("flashinfer-cubin", "0.6", "u6")]
    have = B.read_freeze("torch==2.11.0+cu130\ntransformers==5.17.0\npyyaml==6.0.2\nnvidia_cublas==13.0\n")
    decisions = {d.name: d for d in B.decide(resolved, have, B.SKIPPABLE_DENSE)}
    assert decisions["vllm"].bring and decisions["vllm"].reason == "missing on the node"
    assert decisions["transformers"].bring and "5.17.0" in decisions["transformers"].reason
    assert not decisions["torch"].bring and not decisions["nvidia-cublas"].bring
    assert not decisions["pyyaml"].bring
    assert not decisions["flashinfer-cubin"].bring and "skipped" in decisions["flashinfer-cubin"].reason


def _wheel(path, name="rlkitbundletoy", version="1.0"):
    """A minimal valid pure-Python wheel."""
    files = {f"{name}/__init__.py": b"VALUE = 42\n",
             f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{name}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for fname, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{fname},sha256={digest},{len(data)}")
    record.append(f"{name}-{version}.dist-info/RECORD,,")
    wheel = path / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:  # as real wheels are (pack re-stores them)
        for fname, data in files.items():
            zf.writestr(fname, data)
        zf.writestr(f"{name}-{version}.dist-info/RECORD", "\n".join(record) + "\n")
    return wheel


@pytest.mark.parametrize("compress", [False, True])
def test_pack_split_join_install_round_trip(tmp_path, compress):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = _wheel(wheels)
    (wheels / "stale-0.1-py3-none-any.whl").write_bytes(b"not in the plan: pack must not see it")
    manifest = A.pack([wheel], tmp_path / "parts", split_mib=1, compress=compress)
    assert manifest["wheels"] == ["rlkitbundletoy-1.0-py3-none-any.whl"]
    target = tmp_path / "site"
    assert A.install(tmp_path / "parts", target) == manifest["wheels"]
    out = subprocess.run([sys.executable, "-c", "import rlkitbundletoy; print(rlkitbundletoy.VALUE)"],
                         env={"PYTHONPATH": str(target)}, capture_output=True, text=True)
    assert out.stdout.strip() == "42", out.stderr


def test_parts_are_split_at_the_limit_and_corruption_is_caught(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = _wheel(wheels)
    with zipfile.ZipFile(wheel, "a") as zf:  # make the archive larger than one 1 MiB part
        zf.writestr("rlkitbundletoy/blob.bin", bytes(range(256)) * 6000)
    manifest = A.pack([wheel], tmp_path / "parts", split_mib=1, compress=False)
    assert len(manifest["parts"]) == 2 and manifest["parts"][0]["bytes"] == 2**20
    part = tmp_path / "parts" / manifest["parts"][1]["name"]
    part.write_bytes(part.read_bytes()[:-1] + b"X")
    with pytest.raises(A.BundleError, match="corrupt"):
        A.join_and_verify(tmp_path / "parts", tmp_path)
    part.unlink()
    with pytest.raises(A.BundleError, match="missing"):
        A.join_and_verify(tmp_path / "parts", tmp_path)


def test_resplit_recuts_the_parts_and_the_bundle_still_installs(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = _wheel(wheels)
    with zipfile.ZipFile(wheel, "a") as zf:
        zf.writestr("rlkitbundletoy/blob.bin", bytes(range(256)) * 6000)
    parts = tmp_path / "parts"
    before = A.pack([wheel], parts, split_mib=2, compress=False)
    assert len(before["parts"]) == 1
    assert B.main(["resplit", "--parts", str(parts), "--split-mib", "1"]) == 0
    after = json.loads((parts / A.MANIFEST).read_text())
    assert [p["bytes"] for p in after["parts"]][0] == 2**20 and len(after["parts"]) == 2
    assert sorted(p.name for p in parts.glob("*.part*")) == [p["name"] for p in after["parts"]]  # no stale part
    assert {k: after[k] for k in ("archive", "sha256", "bytes", "wheels")} == \
        {k: before[k] for k in ("archive", "sha256", "bytes", "wheels")}
    assert A.install(parts, tmp_path / "site") == before["wheels"]
    assert B.main(["resplit", "--parts", str(parts), "--split-mib", "0"]) == 1


def test_freeze_lists_this_environment():
    frozen = B.read_freeze(B.freeze())
    assert "pytest" in frozen and "packaging" in frozen


def test_a_node_version_that_satisfies_every_requirement_stays():
    resolved = [("click", "8.5.1", "u1"), ("tokenizers", "0.22.2", "u2"), ("transformers", "5.9.0", "u3"),
                ("rich", "14.0", "u4")]
    requires = ["click>=8.0", "tokenizers<=0.23.0,>=0.22.0", "transformers==5.9.0; python_version >= '3.10'",
                "rich>=14; extra == 'cli'", "click<8.5; python_version < '3.9'"]
    have = B.read_freeze("click==8.5.0\ntokenizers==0.23.2\ntransformers==5.17.0\nrich==13.9\n")
    decisions = {d.name: d for d in B.decide(resolved, have, (), B.requirement_specs(requires, "3.12"))}
    assert not decisions["click"].bring and "satisfies" in decisions["click"].reason  # 3.9 marker is false
    assert decisions["tokenizers"].bring and decisions["transformers"].bring
    assert decisions["rich"].bring  # a requirement behind an extra still counts: carry rather than break


# ------------------------------------------------------------------------------------------------------------
# faults (issue 25 item 4, docs/reliability.md): a real bundle of two parts, then one part damaged or gone


def _two_part_bundle(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = _wheel(wheels)
    with zipfile.ZipFile(wheel, "a") as zf:  # larger than one 1 MiB part
        zf.writestr("rlkitbundletoy/blob.bin", bytes(range(256)) * 6000)
    parts = tmp_path / "parts"
    manifest = A.pack([wheel], parts, split_mib=1, compress=False)
    assert len(manifest["parts"]) == 2
    return parts, manifest


def _tree(path):
    """Every file under ``path`` with its bytes (what an install must leave as it was)."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()} if path.exists() else None


def _flip_last_byte(part):
    data = part.read_bytes()
    part.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))


@pytest.mark.parametrize("damage, message", [
    (lambda parts, m: _flip_last_byte(parts / m["parts"][1]["name"]),
     r"part wheels\.tar\.part001 is corrupt \(SHA-256 mismatch\); copy it again"),
    (lambda parts, m: (parts / m["parts"][1]["name"]).write_bytes((parts / m["parts"][1]["name"]).read_bytes()[:1000]),
     r"part wheels\.tar\.part001 is corrupt \(SHA-256 mismatch\); copy it again"),  # a transfer cut short
    (lambda parts, m: (parts / m["parts"][0]["name"]).unlink(),
     r"part wheels\.tar\.part000 is missing from .*; copy every part listed in manifest\.json"),
    (lambda parts, m: (parts / A.MANIFEST).unlink(), r"manifest\.json not found: is .* a bundle made by `rlkit bundle build`"),
    (lambda parts, m: (parts / A.MANIFEST).write_text(json.dumps({**m, "parts": m["parts"][::-1]})),
     r"the joined archive does not match the manifest's SHA-256; parts are out of order or stale"),
])
def test_a_damaged_or_missing_part_fails_the_install_and_leaves_the_target_untouched(tmp_path, capsys, damage, message):
    """``rlkit bundle install`` on a bundle with a part corrupted, cut short or missing, its manifest missing, or
    parts in another order: the error names the part and the fix, the command exits 1, and neither an existing
    target (its files byte for byte) nor a new one (not created) is touched."""
    parts, manifest = _two_part_bundle(tmp_path)
    assert A.install(parts, tmp_path / "before-damage") == manifest["wheels"]  # the intact bundle installs
    damage(parts, manifest)
    existing = tmp_path / "site"
    existing.mkdir()
    (existing / "other_package.py").write_text("KEPT = True\n")
    before = _tree(existing)
    with pytest.raises(A.BundleError, match=message):
        A.install(parts, existing)
    assert _tree(existing) == before
    fresh = tmp_path / "new-site"
    assert B.main(["install", "--from", str(parts), "--target", str(fresh)]) == 1
    assert re.search(message, capsys.readouterr().err) and not fresh.exists()
