"""vlora_va.contracts.plugins: registries import what they name only when it is asked for, refuse unknown names
listing the known ones, and plug-in files named in a pipeline are imported once; none of it loads torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vlora_va.contracts.plugins import Registry, UnknownPlugin, load_plugins


def test_an_entry_is_imported_on_first_use_only(tmp_path, monkeypatch):
    (tmp_path / "lazy_plugin_mod.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry("thing", {"lazy": "lazy_plugin_mod:VALUE"})
    assert "lazy" in registry and "lazy_plugin_mod" not in sys.modules
    assert registry.load("lazy") == 42 and "lazy_plugin_mod" in sys.modules
    monkeypatch.delitem(sys.modules, "lazy_plugin_mod")


def test_unknown_names_and_bad_targets_are_refused_saying_what_is_known():
    registry = Registry("sink type", {"jsonl": "x:Y", "stdout": "x:Z"})
    with pytest.raises(UnknownPlugin, match=r"unknown sink type 'mqtt' \(known: jsonl, stdout\)"):
        registry.load("mqtt")
    with pytest.raises(ValueError, match="expected 'package.module:Name'"):
        registry.register("mqtt", "no_colon_here")
    registry.register("mqtt", object, options=("topic",))
    assert registry.names() == ("jsonl", "stdout", "mqtt") and registry.options["mqtt"] == {"topic"}
    registry.unregister("mqtt")
    assert "mqtt" not in registry and registry.unknown("mqtt")


def test_registered_options_are_imported_on_first_use_only(tmp_path, monkeypatch):
    """A sink's options class may be named like its sink ("module:Name"): checking a pipeline imports it, not the
    sink (whose module may need what this host lacks)."""
    (tmp_path / "lazy_options_mod.py").write_text("OPTIONS = 'the options'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry("sink type")
    registry.register("lazy", "no_such_sink_module:Sink", options="lazy_options_mod:OPTIONS")
    assert "lazy_options_mod" not in sys.modules
    assert registry.load_options("lazy") == "the options" and "no_such_sink_module" not in sys.modules
    assert registry.load_options("unregistered") == frozenset()
    with pytest.raises(ValueError, match="expected 'package.module:Name'"):
        registry.register("bad", "x:Y", options="no_colon_here")
    monkeypatch.delitem(sys.modules, "lazy_options_mod")

def test_a_plug_in_file_is_imported_once(tmp_path):
    plugin = tmp_path / "count_plugin.py"
    plugin.write_text("import builtins\nbuiltins.vlora_va_count_plugin = getattr(builtins, 'vlora_va_count_plugin', 0) + 1\n")
    import builtins

    load_plugins([str(plugin)])
    load_plugins([str(plugin)])
    assert builtins.vlora_va_count_plugin == 1
    del builtins.vlora_va_count_plugin
    with pytest.raises(ImportError, match="no such plug-in file"):
        load_plugins([str(tmp_path / "missing.py")])


def test_checking_a_pipeline_loads_no_torch():
    """What lets an ingest host and `vlora-va validate` check names without the engine."""
    code = ("import sys\nfrom vlora_va.contracts.config import parse_config\n"
            "parse_config('adapters: {a: x}\\nstreams: [{id: s, source: v.mp4, tasks: [{adapter: a}]}]\\n', 'p.yaml')\n"
            "print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr[-2000:]
