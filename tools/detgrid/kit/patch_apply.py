"""The writing half of ``detgrid patch``: apply a planned change to a checkout, commit it, and
write the commit as a ``git format-patch`` file, so that an interruption at any point can be
finished or undone by the next run.

Before the first byte of the tree is touched, a journal is written atomically into the checkout's
git directory (``<git-dir>/detgrid-patch.json``): the HEAD the change is made on, every path it
writes (with the mode it had, or null when it creates the file), the patch file and the commit's
subject. Each file is then written to a temporary beside it and renamed over it; the files are
committed; the patch file is written to a temporary beside it and renamed; the journal is removed
last. ``recover()``, which every run calls first, reads a journal left behind:

- HEAD is still the journal's base: the commit never happened, so every journalled path is put
  back as it is in the base commit (or removed, if the apply created it) and unstaged;
- HEAD is a commit with the journal's subject whose parent is the base: only the patch file may be
  missing, so it is written;
- anything else (HEAD moved on since): nothing is touched, and the one-line message says what to do.

Temporaries named in the journal are removed either way. A journal itself is written through a
temporary and a rename, so it is either complete or absent.
"""

import json
import os
import signal
import subprocess
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

JOURNAL = "detgrid-patch.json"
TMP_SUFFIX = ".detgrid-tmp"
# Test hook: "N:kill" (SIGKILL itself) or "N:raise" (an OSError) at the N-th checkpoint, counting
# from 1; see CHECKPOINTS for the order.
STOP_AT_ENV = "DETGRID_PATCH_STOP_AT"


class ApplyError(Exception):
    """Applying or recovering could not proceed; the message is one line for the user."""


@dataclass
class Journal:
    base: str  # HEAD the change is made on
    modes: Dict[str, Optional[int]]  # path -> its mode before the apply, None if the apply creates it
    out: str  # the patch file, absolute
    subject: str  # the commit's subject, to recognise the commit after a crash


def git(tree: Path, *args: str, input: Optional[str] = None, check: bool = True) -> str:
    # user.useConfigOnly: never commit under a guessed identity (user@hostname)
    r = subprocess.run(["git", "-c", "user.useConfigOnly=true", "-C", str(tree), *args],
                       capture_output=True, text=True, input=input)
    if check and r.returncode != 0:
        first = (r.stderr.strip() or r.stdout.strip() or f"exit {r.returncode}").splitlines()[0]
        raise ApplyError(f"git {args[0]} failed in {tree}: {first}")
    return r.stdout.strip()


def journal_path(tree: Path) -> Path:
    return Path(git(tree, "rev-parse", "--absolute-git-dir")) / JOURNAL


def tmp_of(path: Path) -> Path:
    return path.with_name(f".{path.name}{TMP_SUFFIX}")


def write_atomic(path: Path, data: bytes, mode: Optional[int] = None) -> None:
    """Write through a temporary beside ``path`` and a rename: readers see the old or the new
    bytes, never a part."""
    tmp = tmp_of(path)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, path)


def _unlink(path: Path) -> None:
    path.unlink(missing_ok=True)


# --------------------------------------------------------------------------- checkpoints

CHECKPOINTS = ("journal written", "temporaries written", "renamed", "staged", "committed",
               "patch file written")
_reached = 0


def checkpoint(name: str) -> None:
    """Where the test hook may stop the process (``DETGRID_PATCH_STOP_AT``)."""
    global _reached
    _reached += 1
    spec = os.environ.get(STOP_AT_ENV)
    if not spec:
        return
    at, _, how = spec.partition(":")
    if int(at) != _reached:
        return
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise OSError(f"stopped by {STOP_AT_ENV}={spec} after: {name}")


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM would end the process without unwinding; make it an exception, as SIGINT is, so
    the apply is rolled back in-process (SIGKILL is left to the next run's recover())."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --------------------------------------------------------------------------- apply


def identity(tree: Path) -> str:
    """Author and committer from the user's git configuration (or GIT_AUTHOR_* and
    GIT_COMMITTER_*), as `git commit` will take them; ApplyError when either is unset."""
    idents = []
    for var in ("GIT_AUTHOR_IDENT", "GIT_COMMITTER_IDENT"):
        try:
            idents.append(git(tree, "var", var))
        except ApplyError:
            raise ApplyError("git user.name and user.email are not set (git config --global user.name "
                             "'Your Name'; git config --global user.email you@example.com): the commit "
                             "and the patch's From: line take them from there") from None
    return idents[0].rsplit(" ", 2)[0]  # "Name <email>", without the timestamp


def write_patch_file(tree: Path, out: Path) -> None:
    patch = git(tree, "format-patch", "-1", "--stdout", "--base=HEAD~1", "HEAD") + "\n"
    write_atomic(out, patch.encode("utf-8"))


def apply(tree: Path, new: Dict[str, bytes], message: str, out: Path) -> str:
    """Write ``new`` (path -> bytes) into the tree, commit exactly those paths with ``message``
    and write the commit to ``out``; return the commit. On a failed write, SIGINT or SIGTERM the
    interrupted apply is rolled back (or, once committed, completed) before ApplyError says so."""
    global _reached
    _reached = 0
    tree, out = Path(tree), Path(out)
    paths = sorted(new)
    modes = {rel: ((tree / rel).stat().st_mode & 0o7777 if (tree / rel).exists() else None)
             for rel in paths}
    journal = Journal(git(tree, "rev-parse", "HEAD"), modes, str(out), message.splitlines()[0])
    jp = journal_path(tree)
    with sigterm_as_interrupt():
        try:
            write_atomic(jp, json.dumps(asdict(journal), indent=1).encode("utf-8"))
        except OSError as e:  # nothing in the tree is touched yet
            _unlink(tmp_of(jp))
            raise ApplyError(f"cannot write the journal {jp}: {e.strerror or e}") from None
        try:
            checkpoint("journal written")
            for rel in paths:
                tmp = tmp_of(tree / rel)
                tmp.write_bytes(new[rel])
                os.chmod(tmp, modes[rel] if modes[rel] is not None else 0o644)
            checkpoint("temporaries written")
            for rel in paths:
                os.replace(tmp_of(tree / rel), tree / rel)
            checkpoint("renamed")
            git(tree, "add", "--", *paths)
            checkpoint("staged")
            # --only: the commit holds these paths and nothing else the user had staged
            git(tree, "commit", "-q", "--no-verify", "--only", "-F", "-", "--", *paths, input=message)
            checkpoint("committed")
            write_patch_file(tree, out)
            checkpoint("patch file written")
            jp.unlink()
        except (OSError, KeyboardInterrupt, ApplyError) as e:
            # a failed write, SIGINT or SIGTERM: leave the tree as the journal says, then report
            raise ApplyError(f"{e or type(e).__name__}; {recover(tree)}") from None
        except BaseException:
            recover(tree)
            raise
    return git(tree, "rev-parse", "HEAD")


# --------------------------------------------------------------------------- recovery


def _load(jp: Path) -> Journal:
    try:
        return Journal(**json.loads(jp.read_text(encoding="utf-8")))
    except (ValueError, TypeError) as e:
        raise ApplyError(f"{jp} is not a detgrid journal ({e}); move it away and rerun") from None


def _roll_back(tree: Path, j: Journal) -> None:
    paths = sorted(j.modes)
    for rel in paths:
        if j.modes[rel] is None:
            _unlink(tree / rel)
        else:
            blob = subprocess.run(["git", "-C", str(tree), "cat-file", "blob", f"{j.base}:{rel}"],
                                  capture_output=True, check=True).stdout
            write_atomic(tree / rel, blob, j.modes[rel])
    git(tree, "reset", "-q", j.base, "--", *paths)


def recover(tree: Path) -> Optional[str]:
    """Finish or undo an apply that a previous run left behind (see the module docstring);
    return what was done, None when there was nothing to do."""
    tree = Path(tree)
    jp = journal_path(tree)
    _unlink(tmp_of(jp))
    if not jp.exists():
        return None
    j = _load(jp)
    for rel in j.modes:
        _unlink(tmp_of(tree / rel))
    _unlink(tmp_of(Path(j.out)))
    lock = jp.parent / "index.lock"
    if lock.exists():
        raise ApplyError(f"{lock} exists: if no git process is running, delete it and rerun "
                         "`detgrid patch` to finish the interrupted apply")
    head = git(tree, "rev-parse", "HEAD")
    if head == j.base:
        _roll_back(tree, j)
        jp.unlink()
        return f"rolled back an interrupted apply ({len(j.modes)} files as in {j.base[:12]})"
    parent = git(tree, "rev-parse", "--verify", "-q", "HEAD~1", check=False)
    if parent == j.base and git(tree, "log", "-1", "--format=%s", "HEAD") == j.subject:
        write_patch_file(tree, Path(j.out))
        jp.unlink()
        return f"completed an interrupted apply (commit {head[:12]}; wrote {j.out})"
    raise ApplyError(f"{jp} records an interrupted apply on {j.base[:12]}, but HEAD is now "
                     f"{head[:12]}: check the tree, then delete {jp} and rerun")


def dirty(tree: Path, paths: Sequence[str] = ()) -> List[str]:
    """Paths with uncommitted changes: tracked ones anywhere (no ``paths``), or any change,
    untracked files included, at ``paths``."""
    args = ["status", "--porcelain", "-z"]
    args += ["--untracked-files=all", "--", *paths] if paths else ["--untracked-files=no"]
    out = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True).stdout
    return [entry[3:] for entry in out.split("\0") if len(entry) > 3]
