#!/usr/bin/env python3
"""Makes a fresh clone's files look as old as their content is to cargo, so that a
target/ kept between CI runs rebuilds only what changed.

Why: cargo decides that a workspace crate (or a build script's rerun-if-changed input)
is stale when a source file's mtime is newer than its last build. A fresh clone gives
every file the clone's time, so a kept target/ would rebuild every workspace crate in
every profile, minutes of a warm run, although nothing changed.

How, and why it never makes cargo use a stale build: MANIFEST (kept beside the cache)
maps each tracked path to the git blob its content had and the mtime it was given then.
- Same blob as recorded: the file gets the recorded mtime back. Every build since that
  mtime was made from this very content (any other content would have replaced the
  entry), so cargo's verdicts stay true.
- New or changed content: the file's mtime is set to now, after every build that used
  the old content (the caller holds the cache's lock, so no other run builds meanwhile),
  and the entry is replaced.
The manifest is written before anything is built (atomically: a temporary file renamed
over it), so a run that dies mid-build leaves entries that are still true.

Usage: restore-mtimes.py MANIFEST      (at the repository root; prints a one-line summary)
"""

import json
import os
import subprocess
import sys
import time


def tracked():
    """(path, blob) of every file git tracks, from the index: no file is hashed."""
    out = subprocess.run(["git", "ls-files", "-s", "-z"], check=True, capture_output=True).stdout
    for entry in out.split(b"\0"):
        if not entry:
            continue
        meta, path = entry.split(b"\t", 1)
        mode, blob, _stage = meta.split(b" ")
        if mode == b"160000":  # a submodule: no file here
            continue
        yield os.fsdecode(path), blob.decode()


def dirty():
    """Tracked files whose working copy differs from the index (never restored: the
    index's blob is not their content)."""
    subprocess.run(["git", "update-index", "-q", "--refresh"], capture_output=True)
    out = subprocess.run(["git", "diff-files", "--name-only", "-z"], check=True, capture_output=True).stdout
    return {os.fsdecode(p) for p in out.split(b"\0") if p}


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: restore-mtimes.py MANIFEST")
    manifest_path = sys.argv[1]
    try:
        with open(manifest_path) as f:
            old = json.load(f)
    except FileNotFoundError:
        old = {}
    except (OSError, ValueError) as e:
        # Unreadable: treat every file as new (a full rebuild of the workspace crates).
        print(f"restore-mtimes: {manifest_path} unreadable ({e}); every file counts as changed")
        old = {}
    # "Now" is after every recorded time, even if the clock went back since.
    newest = max((int(e[1]) for e in old.values() if isinstance(e, list) and len(e) == 2), default=0)
    now_ns = max(time.time_ns(), newest + 1_000_000_000)
    modified = dirty()
    new, kept, changed = {}, 0, 0
    for path, blob in tracked():
        if not os.path.lexists(path):
            continue
        if path in modified:
            # Its content is not the blob's: new now, and not recorded.
            os.utime(path, ns=(now_ns, now_ns), follow_symlinks=False)
            changed += 1
            continue
        entry = old.get(path)
        if isinstance(entry, list) and len(entry) == 2 and entry[0] == blob:
            mtime_ns = int(entry[1])
            kept += 1
        else:
            mtime_ns = now_ns
            changed += 1
        os.utime(path, ns=(mtime_ns, mtime_ns), follow_symlinks=False)
        new[path] = [blob, mtime_ns]
    tmp = f"{manifest_path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(new, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, manifest_path)
    print(f"restore-mtimes: {kept} files as old as their content, {changed} new or changed (now)")


if __name__ == "__main__":
    main()
