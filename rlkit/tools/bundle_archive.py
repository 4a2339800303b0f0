"""The offline-node bundle's archive: wheels packed into one archive (optionally xz-compressed), cut into parts with a
SHA-256 each in ``manifest.json``, and on the node every part verified, joined, verified whole and installed.

Stdlib only, like :mod:`rlkit.tools.bundle` (whose ``build``, ``resplit`` and ``install`` commands call it): it runs on
a node without internet from a checkout, before anything is installed. ``install`` puts every wheel in ONE ``pip
install --no-index --no-deps --target`` (two installs into one target clobber shared namespace folders such as
``google/``).
"""
from __future__ import annotations

import copy
import hashlib
import json
import lzma
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

MANIFEST = "manifest.json"


class BundleError(RuntimeError):
    """A bundle cannot be built, verified or installed; the message says what to do."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def store_uncompressed(wheel: Path, dest: Path) -> Path:
    """Rewrite a wheel with ZIP_STORED members: still a valid wheel (RECORD hashes cover contents), and
    the archive compressor then sees raw bytes, which it packs ~30% smaller than deflated members."""
    out = dest / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)  # before the copy below changes how the member is stored
            stored = copy.copy(info)
            stored.compress_type = zipfile.ZIP_STORED
            dst.writestr(stored, data)
    return out


def xz_compress(tar_path: Path) -> Path:
    """xz at preset 6: the multi-threaded xz command where present, else Python's lzma (same format)."""
    out = tar_path.with_name(tar_path.name + ".xz")
    if shutil.which("xz"):
        subprocess.run(["xz", "-6", "-T0", "--keep", "--force", str(tar_path)], check=True)
    else:
        with open(tar_path, "rb") as src, lzma.open(out, "wb", preset=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    tar_path.unlink()
    return out


def pack(wheels: list[Path], out: Path, split_mib: int, compress: bool) -> dict:
    """Archive ``wheels``, split into parts of at most ``split_mib`` MiB, write the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("wheels.tar*"):
        stale.unlink()
    wheels = sorted(wheels)
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        archive = out / "wheels.tar"
        with tarfile.open(archive, "w") as tar:
            for wheel in wheels:
                tar.add(store_uncompressed(wheel, Path(tmp)) if compress else wheel, arcname=wheel.name)
                if compress:
                    (Path(tmp) / wheel.name).unlink()
    if compress:
        archive = xz_compress(archive)
    manifest = {"archive": archive.name, "sha256": sha256(archive), "bytes": archive.stat().st_size,
                "wheels": [p.name for p in wheels]}
    split(archive, out, split_mib, manifest)
    archive.unlink()
    return manifest


def split(archive: Path, out: Path, split_mib: int, manifest: dict) -> dict:
    """Cut ``archive`` into parts of at most ``split_mib`` MiB in ``out``; record them in the manifest there."""
    for stale in out.glob(f"{archive.name}.part*"):
        stale.unlink()
    manifest["parts"] = []
    limit = split_mib * 2**20
    with open(archive, "rb") as f:
        index = 0
        while chunk := f.read(limit):
            part = out / f"{archive.name}.part{index:03d}"
            part.write_bytes(chunk)
            manifest["parts"].append({"name": part.name, "sha256": hashlib.sha256(chunk).hexdigest(), "bytes": len(chunk)})
            index += 1
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def resplit(bundle_dir: Path, split_mib: int) -> dict:
    """Re-cut a built bundle's parts to a new size (no re-download, no re-compression)."""
    with tempfile.TemporaryDirectory(dir=bundle_dir) as tmp:
        archive = join_and_verify(bundle_dir, Path(tmp))
        manifest = json.loads((bundle_dir / MANIFEST).read_text())
        return split(archive, bundle_dir, split_mib, manifest)


def join_and_verify(bundle_dir: Path, dest: Path) -> Path:
    """Check every part against the manifest, join them, check the whole; returns the archive path."""
    manifest_path = bundle_dir / MANIFEST
    if not manifest_path.exists():
        raise BundleError(f"{manifest_path} not found: is {bundle_dir} a bundle made by `rlkit bundle build`?")
    manifest = json.loads(manifest_path.read_text())
    archive = dest / manifest["archive"]
    with open(archive, "wb") as joined:
        for part in manifest["parts"]:
            path = bundle_dir / part["name"]
            if not path.exists():
                raise BundleError(f"part {part['name']} is missing from {bundle_dir}; copy every part listed in {MANIFEST}")
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() != part["sha256"]:
                raise BundleError(f"part {part['name']} is corrupt (SHA-256 mismatch); copy it again")
            joined.write(data)
    if sha256(archive) != manifest["sha256"]:
        raise BundleError("the joined archive does not match the manifest's SHA-256; parts are out of order or stale")
    return archive


def install(bundle_dir: Path, target: Path) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        archive = join_and_verify(bundle_dir, Path(tmp))
        wheels = Path(tmp) / "wheels"
        with tarfile.open(archive) as tar:
            tar.extractall(wheels, filter="data")
        names = sorted(str(p) for p in wheels.glob("*.whl"))
        if not names:
            raise BundleError("the bundle holds no wheels")
        target.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir", "--upgrade", "--target", str(target), *names]
        if subprocess.run(cmd).returncode != 0:
            raise BundleError(f"pip could not install the bundle into {target}")
    return [Path(n).name for n in names]
