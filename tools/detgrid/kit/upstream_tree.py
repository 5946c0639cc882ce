"""Fetch and cache a real PyTorch source tree: Debian's ``pytorch`` source package.

Debian trixie's ``pytorch 2.6.0+dfsg-7`` is upstream v2.6.0 (``version.txt`` 2.6.0a0) with its
tests; the dfsg repack drops third_party sources, which the patch tool never touches. Used by the
tests and by CI (``python -m detgrid.kit.upstream_tree`` prints the tree's path, or exits 3 with the
reason when Debian cannot be reached). apt runs with a private state directory under the cache
(``<cache>/apt-src``): the system's apt configuration is never read or written.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional, Tuple

from detgrid.kit import apt

DEBIAN_PACKAGE = "pytorch"
DEBIAN_VERSION = "2.6.0+dfsg-7"
DEBIAN_SUITE = "trixie"
UPSTREAM_VERSION = "2.6.0"


class Unavailable(RuntimeError):
    """The tree is not cached and cannot be fetched here (the reason is the message)."""


def cache_dir() -> Path:
    root = os.environ.get("DETGRID_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "detgrid"
    )
    return Path(root)


def cached_tree() -> Path:
    return cache_dir() / f"pytorch-{UPSTREAM_VERSION}"


def _is_tree(path: Path) -> bool:
    return (path / "version.txt").is_file() and (
        path / "aten/src/ATen/native/cuda/GridSampler.cu"
    ).is_file()


def _run(cmd, cwd=None, timeout=900):
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _private_apt(state: Path) -> list:
    """apt options for a private state directory holding only a deb-src line for trixie: the
    system's apt configuration is neither read nor written."""
    for d in ("lists/partial", "cache/archives/partial", "preferences.d"):
        (state / d).mkdir(parents=True, exist_ok=True)
    (state / "sources.list").write_text(
        f"deb-src [signed-by={apt.DEBIAN_KEYRING}] http://deb.debian.org/debian {DEBIAN_SUITE} main\n")
    return apt.private_options(state)


def _download_source(dl: Path) -> None:
    if shutil.which("apt-get") is None:
        raise Unavailable("apt-get not found: cannot fetch Debian's pytorch source package")
    if not apt.DEBIAN_KEYRING.is_file():
        raise Unavailable(f"{apt.DEBIAN_KEYRING} missing: cannot verify Debian's {DEBIAN_SUITE} index")
    opts = _private_apt(cache_dir() / "apt-src")
    upd = _run(["apt-get", *opts, "-q", "update"])
    if upd.returncode != 0:
        raise Unavailable(f"apt-get update (private state) failed: "
                          f"{(upd.stderr or upd.stdout).strip()[-300:]}")
    got = _run(["apt-get", *opts, "source", "--download-only",
                f"{DEBIAN_PACKAGE}={DEBIAN_VERSION}"], cwd=dl)
    if got.returncode != 0:
        raise Unavailable(f"apt-get source {DEBIAN_PACKAGE}={DEBIAN_VERSION} failed: "
                          f"{(got.stderr or got.stdout).strip()[-300:]}")


def fetch(refresh: bool = False) -> Path:
    """Return the cached v2.6.0 tree, downloading and extracting it on first use."""
    tree = cached_tree()
    if _is_tree(tree) and not refresh:
        return tree
    dl = cache_dir() / "dl"
    dl.mkdir(parents=True, exist_ok=True)
    orig = dl / f"{DEBIAN_PACKAGE}_{DEBIAN_VERSION.split('-')[0]}.orig.tar.xz"
    if not orig.is_file():
        _download_source(dl)
        if not orig.is_file():
            raise Unavailable(f"apt-get source left no {orig.name} in {dl}")
    staging = Path(tempfile.mkdtemp(prefix="extract-", dir=cache_dir()))
    try:
        # tar --no-same-owner: the archive's uids mean nothing here.
        ext = _run(["tar", "--no-same-owner", "-xJf", str(orig), "-C", str(staging)])
        if ext.returncode != 0:
            raise Unavailable(f"extracting {orig.name} failed: {ext.stderr.strip()[-300:]}")
        tops = [p for p in staging.iterdir() if p.is_dir()]
        if len(tops) != 1 or not _is_tree(tops[0]):
            raise Unavailable(f"{orig.name} does not hold one PyTorch tree")
        if tree.exists():
            shutil.rmtree(tree)
        tops[0].rename(tree)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return tree


# The pristine commit's date: v2.6.0's release day.
PRISTINE_DATE = "2025-01-29T00:00:00Z"


def fresh_git_copy(dest: Path, source: Optional[Path] = None, tag: str = "v2.6.0") -> Path:
    """Copy the tree's files the patch tool reads or writes into ``dest`` as a one-commit git repo.

    Only what the change set reads or touches is copied (aten/src/ATen, torch/__init__.py,
    docs/source/notes, test/test_torch.py, test/test_nn.py, tools/autograd/derivatives.yaml,
    version.txt, .lintrunner.toml, .clang-format): a full copy of the 158 MB tree per test would dominate the test time.
    """
    source = source or fetch()
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for rel in (
        "aten/src/ATen",
        "docs/source/notes",
        "torch/__init__.py",
        "test/test_torch.py",
        "test/test_nn.py",
        "tools/autograd/derivatives.yaml",
        "version.txt",
        ".lintrunner.toml",
        ".clang-format",
    ):
        src = source / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, dirs_exist_ok=True)
        elif src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    # A fixed identity and date make the pristine commit's hash a function of the tree alone,
    # so the base commit that PR.md and the patches name does not move between regenerations.
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t", GIT_AUTHOR_DATE=PRISTINE_DATE,
               GIT_COMMITTER_DATE=PRISTINE_DATE)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "commit", "-q", "-m", "pristine"], ["git", "tag", tag]):
        r = subprocess.run(cmd, cwd=dest, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr}")
    return dest


REGENERATE = "python -m detgrid.kit.upstream_tree --write-patch patches/v2.6.0.patch"
REGENERATE_TESTS = ("python -m detgrid.kit.upstream_tree --tests-only "
                    "--write-patch patches/v2.6.0-tests.patch")


def author(kit: Path) -> Tuple[str, str]:
    """(name, email) the patch is written under: the user's git identity as the kit's checkout
    sees it (its own configuration, else the global one, or GIT_AUTHOR_*); Unavailable when
    there is none, never a placeholder."""
    from detgrid.kit import patch_apply

    try:
        ident = patch_apply.identity(kit)
    except patch_apply.ApplyError as e:
        raise Unavailable(str(e)) from None
    name, _, email = ident.rpartition(" <")
    return name, email.rstrip(">")


def write_patch(out: Path, name: str, email: str, tests_only: bool = False) -> int:
    """Run `detgrid patch` on a fresh copy of the cached tree (never on the cache itself), with
    ``name <email>`` configured in the copy: the commit's and the patch's author; with
    ``tests_only``, `detgrid patch --tests-only` (the tests alone)."""
    from detgrid.kit import patch

    with tempfile.TemporaryDirectory(prefix="detgrid-regen-") as tmp:
        copy = fresh_git_copy(Path(tmp) / "pytorch")
        for key, value in (("user.name", name), ("user.email", email)):
            subprocess.run(["git", "-C", str(copy), "config", key, value], check=True)
        return patch.main(["patch", "--pytorch", str(copy), "--out", str(Path(out).resolve())]
                          + (["--tests-only"] if tests_only else []))


def _write_patch_target(argv) -> Optional[Path]:
    """The FILE of ``--write-patch FILE``, None without the option; Unavailable without FILE."""
    if "--write-patch" not in argv:
        return None
    i = argv.index("--write-patch") + 1
    if i >= len(argv) or argv[i].startswith("-"):
        raise Unavailable("--write-patch needs the patch file to write (e.g. patches/v2.6.0.patch)")
    return Path(argv[i])


def _kit_author() -> Tuple[str, str]:
    from detgrid.kit import patch

    try:
        return author(patch.kit_root())
    except patch.NotUsable as e:
        raise Unavailable(str(e)) from None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        target = _write_patch_target(argv)
        # before the download: a patch without its author's identity is not written at all
        ident = _kit_author() if target is not None else None
    except Unavailable as e:
        print(f"detgrid upstream_tree: {e}", file=sys.stderr)
        return 2
    try:
        tree = fetch(refresh="--refresh" in argv)
    except (Unavailable, subprocess.TimeoutExpired) as e:
        print(f"upstream tree unavailable: {e}", file=sys.stderr)
        return 3
    if target is not None:
        return write_patch(target, *ident, tests_only="--tests-only" in argv)
    print(tree)
    return 0


if __name__ == "__main__":
    sys.exit(main())
