"""`featshard validate --format json`: one document on stdout that validates against
the shipped schema (schema/validate-report.schema.json), with the exit code of the
text report; a valid spec and its sample, a planted finding (its feature, line and
column), an invalid spec (its diagnostic, line and column) and an unreadable sample."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from conftest import featshard_bin

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "schema" / "validate-report.schema.json"


def report(*args: str) -> tuple[int, Any]:
    import jsonschema

    run = subprocess.run([str(featshard_bin()), "validate", *args, "--format", "json"], capture_output=True,
                         text=True, check=False, cwd=ROOT)
    doc = json.loads(run.stdout)
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
    return run.returncode, doc


def test_a_valid_spec_and_its_sample() -> None:
    code, doc = report("examples/openfold3.yaml", "--features", "tests/data/openfold3/plain.safetensors")
    assert code == 0 and doc["ok"] and doc["summary"]["features"] == 53, doc
    assert doc["samples"] == [{"path": "tests/data/openfold3/plain.safetensors", "findings": [],
                               "taken": True, "refused": None}], doc


def test_a_finding_names_its_feature_line_and_column(tmp_path: Path) -> None:
    text = (ROOT / "examples" / "openfold3.yaml").read_text()
    spec = tmp_path / "wrong.yaml"
    spec.write_text(text.replace("    index: {of: atoms, scope: padded_global}\n    doc: each token's first atom",
                                 "    doc: each token's first atom"))
    code, doc = report(str(spec), "--features", "tests/data/openfold3/plain.safetensors")
    assert code == 1 and not doc["ok"], doc
    (found,) = doc["samples"][0]["findings"]
    line = next(n for n, t in enumerate(spec.read_text().splitlines(), 1) if t.startswith("  start_atom_index:"))
    assert (found["feature"], found["line"], found["column"]) == ("start_atom_index", line, 3), found
    assert "first `atoms` item" in found["shows"] and "padded_global" in found["consider"], found


def test_an_invalid_spec_is_its_diagnostics(tmp_path: Path) -> None:
    text = (ROOT / "examples" / "openfold3.yaml").read_text()
    spec = tmp_path / "bad.yaml"
    spec.write_text(text.replace("map_pad: 0", "map_pad: -1"))
    code, doc = report(str(spec))
    assert code == 1 and doc["summary"] is None, doc
    (d,) = doc["diagnostics"]
    line = next(n for n, t in enumerate(spec.read_text().splitlines(), 1) if "map_pad: -1" in t)
    assert (d["severity"], d["feature"], d["semantic"], d["line"]) == ("error", "atom_to_token_index", "atoms", line), d


def test_an_unreadable_sample_is_refused_in_the_report(tmp_path: Path) -> None:
    missing = tmp_path / "missing.safetensors"
    code, doc = report("examples/openfold3.yaml", "--features", str(missing))
    assert code == 1 and not doc["samples"][0]["taken"] and str(missing) in doc["samples"][0]["refused"], doc
