"""The persisted quarantine: survives new stores, concurrent writers, says how to get out."""

from __future__ import annotations

import threading

import pytest

from hil.quarantine import QuarantineStore, default_state_path, refusal


def test_persists_and_releases(tmp_path):
    path = tmp_path / "state" / "s.json"
    QuarantineStore(path).quarantine("lab", "suite long-context hung", "run1")
    entry = QuarantineStore(path).get("lab")
    assert entry["reason"] == "suite long-context hung" and entry["run_id"] == "run1"
    assert QuarantineStore(path).release("lab") is True
    assert QuarantineStore(path).get("lab") is None
    assert QuarantineStore(path).release("lab") is False


def test_concurrent_writers_keep_every_entry(tmp_path):
    store = QuarantineStore(tmp_path / "s.json")
    threads = [threading.Thread(target=store.quarantine, args=(f"t{i}", "x")) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(store.all()) == {f"t{i}" for i in range(16)}


def test_corrupt_state_names_the_file(tmp_path):
    path = tmp_path / "s.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        QuarantineStore(path).get("x")


def test_default_path_and_refusal(tmp_path):
    assert default_state_path({"HIL_STATE": "/a/b.json"}).as_posix() == "/a/b.json"
    xdg = default_state_path({"XDG_STATE_HOME": str(tmp_path)})
    assert xdg == tmp_path / "bi100-hil" / "state.json"
    msg = refusal("lab", {"since": "then", "reason": "probe failed"})
    assert "reset-target lab" in msg and "--recheck" in msg and "probe failed" in msg
