"""The commit-subject rule: the commit-msg hook refuses a long subject, and the history check finds every commit
under the rule with one, by base commit or (a shallow clone) by date."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tools.check_commit_subjects import check_history, main, subject_of

REPO_ROOT = Path(__file__).resolve().parents[3]
LONG = "Add " + "x" * 69  # 73 characters
EXACT = "Add " + "y" * 68  # 72 characters


def _git(repo: Path, *args: str, date: str = "2026-12-01T00:00:00+00:00") -> str:
    env = {**os.environ, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date, "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def _commit(repo: Path, subject: str, date: str) -> str:
    _git(repo, "commit", "--allow-empty", "--no-verify", "-m", subject, "-m", "a body", date=date)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    _git(tmp_path, "init", "-q", "-b", "main")
    return tmp_path


def test_subject_is_the_first_line_that_is_not_a_comment() -> None:
    assert subject_of("# Please enter the commit message\n\nFix the thing\n\nbody") == "Fix the thing"


def test_history_check_covers_only_commits_after_the_base(repo: Path) -> None:
    _commit(repo, LONG + " before the rule", "2026-11-30T00:00:00+00:00")
    base = _commit(repo, "Last commit before the rule", "2026-11-30T00:00:00+00:00")
    _commit(repo, EXACT, "2026-12-04T00:00:00+00:00")
    assert check_history(repo, base, "2026-12-03T00:00:00+00:00") == []
    bad = _commit(repo, LONG, "2026-12-04T00:00:00+00:00")
    [line] = check_history(repo, base, "2026-12-03T00:00:00+00:00")
    assert line.startswith(bad[:7]) and "(73 characters)" in line


def test_a_clone_without_the_base_goes_by_date(repo: Path) -> None:
    _commit(repo, LONG + " before the rule", "2026-11-30T00:00:00+00:00")
    _commit(repo, LONG, "2026-12-04T00:00:00+00:00")
    missing = "0" * 40
    [line] = check_history(repo, missing, "2026-12-03T00:00:00+00:00")
    assert line.endswith(": " + LONG)


def test_message_file_mode_is_the_hook(tmp_path: Path, capsys) -> None:
    message = tmp_path / "COMMIT_EDITMSG"
    message.write_text(EXACT + "\n\nDetails in the body may run as long as they like." + "z" * 100 + "\n")
    assert main(["--message-file", str(message)]) == 0
    message.write_text(LONG + "\n")
    assert main(["--message-file", str(message)]) == 1
    assert "73 characters, at most 72" in capsys.readouterr().err


def test_the_hook_refuses_a_long_subject_in_a_real_commit(repo: Path) -> None:
    """tools/commit-msg, installed as a hook of a repository holding the checker, stops `git commit`."""
    (repo / "tools").mkdir()
    (repo / "tools" / "check_commit_subjects.py").write_text(
        (REPO_ROOT / "tools" / "check_commit_subjects.py").read_text())
    hook = repo / ".git" / "hooks" / "commit-msg"
    hook.write_text((REPO_ROOT / "tools" / "commit-msg").read_text())
    hook.chmod(0o755)
    _git(repo, "commit", "--allow-empty", "-m", EXACT)
    with pytest.raises(subprocess.CalledProcessError) as refused:
        _git(repo, "commit", "--allow-empty", "-m", LONG)
    assert "at most 72" in refused.value.stderr
    assert _git(repo, "log", "--format=%s") == EXACT


def test_this_repository_keeps_the_rule() -> None:
    """What `make check-commits` runs on this checkout (CI: a fresh clone)."""
    assert check_history(REPO_ROOT) == []
