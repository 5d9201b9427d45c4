"""Commit subjects of at most 72 characters: checks one message (the commit-msg hook) or the history since the rule.

The rule holds for the commits after RULE_BASE (the last commit before it). A clone that lacks RULE_BASE (a
shallow one) checks the commits committed after RULE_START instead. Standard library only: the hook runs it with
whatever python3 is on PATH.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

MAX_SUBJECT = 72
RULE_BASE = "273906629d19911e43dfbdcd098a4c0343be1ed0"  # the parent of the first commit under the rule
RULE_START = "2026-12-03T09:49:00+00:00"  # a little before that first commit was made


def subject_of(message: str) -> str:
    """The first line of a commit message that is neither blank nor a comment."""
    return next((line.rstrip() for line in message.splitlines() if line.strip() and not line.startswith("#")), "")


def too_long(subject: str) -> bool:
    return len(subject) > MAX_SUBJECT


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def commits_to_check(repo: Path, base: str, start: str) -> list[tuple[str, str]]:
    """(short hash, subject) of each commit on HEAD under the rule."""
    if _git(repo, "cat-file", "-e", f"{base}^{{commit}}").returncode == 0:
        selection = [f"{base}..HEAD"]
    else:  # a shallow clone without the base: go by commit date
        selection = ["HEAD", f"--since={start}"]
    log = _git(repo, "log", "--format=%h%x00%s", *selection)
    if log.returncode != 0:
        raise RuntimeError(f"git log failed: {log.stderr.strip()}")
    return [tuple(line.split("\0", 1)) for line in log.stdout.splitlines() if line]


def check_history(repo: Path, base: str = RULE_BASE, start: str = RULE_START) -> list[str]:
    """One line per commit under the rule whose subject is too long."""
    return [f"{sha} ({len(subject)} characters): {subject}" for sha, subject in commits_to_check(repo, base, start)
            if too_long(subject)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--message-file", help="check this commit message (the commit-msg hook's argument)")
    parser.add_argument("--repo", default=".", help="the checkout whose history to check")
    args = parser.parse_args(argv)
    if args.message_file:
        subject = subject_of(Path(args.message_file).read_text())
        if too_long(subject):
            print(f"commit subject is {len(subject)} characters, at most {MAX_SUBJECT} allowed: {subject!r}\n"
                  "Say what changed in the subject; put the details in the body after a blank line.",
                  file=sys.stderr)
            return 1
        return 0
    if _git(Path(args.repo), "rev-parse", "--git-dir").returncode != 0:
        print("check-commits: not a git checkout, no history to check")
        return 0
    bad = check_history(Path(args.repo))
    for line in bad:
        print(f"commit subject over {MAX_SUBJECT} characters: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
