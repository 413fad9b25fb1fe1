#!/usr/bin/env python3
"""The --json and --junit reports of `dynemb-dist replay`, checked from the outside.

The JSON report is validated against docs/report-schema.json with a small validator for the
JSON Schema subset that file uses (jsonschema is not installed); its numbers are checked
against the run (exit status, file hashes, planted defects). The JUnit file is parsed with
xml.etree and its counts must match the JSON summary and the run.
Env (tests/CMakeLists.txt): DYNEMB (binary), DYNEMB_SRC (source root); cwd = build/tests.
"""
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

try:
    import h5py
    import numpy as np
except ImportError:
    print("h5py/numpy missing for", sys.executable)
    sys.exit(77)

DYNEMB = os.environ["DYNEMB"]
SRC = os.environ["DYNEMB_SRC"]
SCHEMA = json.load(open(os.path.join(SRC, "docs", "report-schema.json")))
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


# ---------------------------------------------------------------- tiny JSON Schema validator
TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}
KNOWN = {"$schema", "$id", "title", "description", "$defs", "type", "properties", "required",
         "additionalProperties", "items", "enum", "const", "pattern", "minimum", "minLength",
         "$ref"}


def resolve(ref):
    assert ref.startswith("#/"), ref
    node = SCHEMA
    for part in ref[2:].split("/"):
        node = node[part]
    return node


def validate(value, schema, path="$"):
    """Returns a list of 'path: problem' strings (empty when valid)."""
    errs = []
    unknown = set(schema) - KNOWN
    assert not unknown, f"validator does not support {unknown} (at {path})"
    if "$ref" in schema:
        errs += validate(value, resolve(schema["$ref"]), path)
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(TYPES[t](value) for t in types):
            return errs + [f"{path}: {value!r} is not of type {types}"]
    if "const" in schema and value != schema["const"]:
        errs.append(f"{path}: {value!r} != const {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        errs.append(f"{path}: {value!r} not in {schema['enum']}")
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errs.append(f"{path}: {value!r} does not match {schema['pattern']}")
        if "minLength" in schema and len(value) < schema["minLength"]:
            errs.append(f"{path}: shorter than {schema['minLength']}")
    if TYPES["number"](value) and "minimum" in schema and value < schema["minimum"]:
        errs.append(f"{path}: {value} < minimum {schema['minimum']}")
    if isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            errs += validate(v, schema["items"], f"{path}[{i}]")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                errs.append(f"{path}: missing required '{key}'")
        extra = schema.get("additionalProperties", True)
        for key, v in value.items():
            if key in props:
                errs += validate(v, props[key], f"{path}.{key}")
            elif extra is False:
                errs.append(f"{path}: unexpected property '{key}'")
            elif isinstance(extra, dict):
                errs += validate(v, extra, f"{path}.{key}")
    return errs


# The validator itself must reject what the schema forbids.
good = {"schema_version": "1.1.0"}
check(validate("1.1.0", SCHEMA["properties"]["schema_version"]) == [], "validator: const ok")
check(validate("2.0.0", SCHEMA["properties"]["schema_version"]) != [], "validator: const")
check(validate(None, {"type": ["integer", "null"]}) == [], "validator: null in a type list")
check(validate(True, {"type": "integer"}) != [], "validator: bool is not an integer")
check(validate({"a": 1}, {"type": "object", "additionalProperties": False}) != [],
      "validator: additionalProperties")
check(validate("abc", {"$ref": "#/$defs/sha256_or_null"}) != [], "validator: $ref + pattern")


# ---------------------------------------------------------------- helpers
def run(args, want_rc):
    p = subprocess.run([DYNEMB] + args, capture_output=True, text=True)
    check(p.returncode == want_rc,
          f"{' '.join(args)}: exit {p.returncode}, want {want_rc}\n{p.stdout}\n{p.stderr}")
    return p


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def replay_reports(tmp, name, capture, want_rc, extra=()):
    js, xml = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".xml")
    args = ["replay", capture, "--json", js, "--junit", xml, "--quiet"] + list(extra)
    p = run(args, want_rc)
    report = json.load(open(js))
    errs = validate(report, SCHEMA)
    check(errs == [], f"{name}: report does not match docs/report-schema.json:\n  " +
          "\n  ".join(errs[:20]))
    s = report["summary"]
    check(s["exit_code"] == p.returncode, f"{name}: summary.exit_code {s['exit_code']}")
    statuses = [c["status"] for c in report["checks"]]
    check(s["checks"] == len(report["checks"]), f"{name}: summary.checks")
    for key, st in (("passed", "pass"), ("failed", "fail"), ("errors", "error"),
                    ("skipped", "skipped")):
        check(s[key] == statuses.count(st), f"{name}: summary.{key} {s[key]}")
    check(s["context_mismatches"] == sum(c["status"] == "fail" and c["stage"] == "ctx"
                                         for c in report["checks"]), f"{name}: ctx count")
    check(report["capture"]["sha256"] in (None, sha256(capture)) if p.returncode == 2
          else report["capture"]["sha256"] == sha256(capture), f"{name}: capture sha256")
    check(report["argv"][1:] == args, f"{name}: argv {report['argv']}")
    names = [c["name"] for c in report["checks"]]
    check(len(names) == len(set(names)), f"{name}: check names are not unique")

    # JUnit: counts agree with the JSON summary and with the testcases in the file.
    root = ET.parse(xml).getroot()
    check(root.tag == "testsuites", f"{name}: root <{root.tag}>")
    cases = root.findall("./testsuite/testcase")
    fails = [c for c in cases if c.find("failure") is not None]
    errors = [c for c in cases if c.find("error") is not None]
    skips = [c for c in cases if c.find("skipped") is not None]
    trouble = 1 if report["trouble"] else 0
    for node in [root, root.find("testsuite")]:
        check(int(node.get("tests")) == len(cases) == s["checks"] + trouble,
              f"{name}: junit tests={node.get('tests')}, {len(cases)} testcases, "
              f"{s['checks']} checks")
        check(int(node.get("failures")) == len(fails) == s["failed"], f"{name}: junit failures")
        check(int(node.get("errors")) == len(errors) == s["errors"] + trouble,
              f"{name}: junit errors")
        check(int(node.get("skipped")) == len(skips) == s["skipped"], f"{name}: junit skipped")
    case_names = [c.get("name") for c in cases]
    check(len(case_names) == len(set(case_names)), f"{name}: junit names are not unique")
    check(set(names) <= set(case_names), f"{name}: junit lacks some checks")
    for c in fails:
        body = c.find("failure").text or ""
        check(body.strip() != "" and c.find("failure").get("message"),
              f"{name}: empty <failure> in {c.get('name')}")
    return report, p


with tempfile.TemporaryDirectory() as tmp:
    seq = os.path.join(tmp, "seq.h5")
    run(["synth", "--preset", "unit-seq-w2", "--batches", "2", "--seed", "5", "-o", seq], 0)

    # Clean: exit 0, every check passes.
    clean, _ = replay_reports(tmp, "clean", seq, 0)
    check(clean["summary"]["status"] == "pass", "clean: status")
    check(clean["summary"]["failed"] == 0 and clean["summary"]["passed"] > 0, "clean: counts")
    with h5py.File(seq) as f:
        plan_text = f["plan"][()]
    plan_bytes = plan_text if isinstance(plan_text, bytes) else plan_text.encode()
    check(clean["plan"]["sha256"] == hashlib.sha256(plan_bytes).hexdigest(), "plan sha256")
    check(clean["plan"]["embedded"] is True, "plan embedded")
    check(clean["run"]["tolerance"] == "exact" and clean["run"]["ctx"] == "captured", "run")

    # Two planted defects: a context field and a one-ulp golden.
    bad = os.path.join(tmp, "bad.h5")
    with open(seq, "rb") as a, open(bad, "wb") as b:
        b.write(a.read())
    with h5py.File(bad, "r+") as f:
        f["batches/1/rank0/ctx/input_splits"][1] += 1
        d = f["batches/0/rank1/output"]
        v = d[...]
        v[2, 9] = np.nextafter(v[2, 9], np.float32(np.inf), dtype=np.float32)
        d[...] = v
    rep, _ = replay_reports(tmp, "bad", bad, 1, ["--max-mismatches", "3"])
    by_name = {c["name"]: c for c in rep["checks"]}
    ins = by_name.get("batch1.rank0.ctx.input_splits")
    check(ins is not None and ins["status"] == "fail" and ins["mismatches"] == 1
          and ins["details"][0]["where"] == {"index": 1}
          and ins["details"][0]["note"].startswith("plan routes "), f"input_splits: {ins}")
    gold = by_name.get("batch0.rank1.output.golden")
    check(gold is not None and gold["status"] == "fail" and gold["mismatches"] == 1
          and gold["cause"] == "data (golden output)"
          and gold["details"][0]["where"]["column"] == 9
          and set(gold["details"][0]["where"]) == {"feature", "feature_index", "sample",
                                                  "position", "column"}
          and 0 < gold["max_rel_err"] < 1e-6, f"golden: {gold}")
    check(rep["summary"]["data_mismatches"] == 1, "bad: one data mismatch")
    check(rep["summary"]["status"] == "fail", "bad: status")

    # Pooled VBE capture: clean, and its coordinates are (feature, sample, column).
    vbe = os.path.join(tmp, "vbe.h5")
    run(["synth", "--preset", "unit-pooled-w8", "--vbe", "--seed", "5", "-o", vbe], 0)
    with h5py.File(vbe, "r+") as f:
        f["batches/0/rank4/output"][10] += 1.0
    rep, _ = replay_reports(tmp, "vbe", vbe, 1)
    gold = {c["name"]: c for c in rep["checks"]}["batch0.rank4.output.golden"]
    check(set(gold["details"][0]["where"]) == {"feature", "feature_index", "sample", "column"},
          f"vbe where: {gold['details'][0]['where']}")

    # Trouble: a capture missing a dataset; exit 2, reports still written and valid.
    broken = os.path.join(tmp, "broken.h5")
    with open(seq, "rb") as a, open(broken, "wb") as b:
        b.write(a.read())
    with h5py.File(broken, "r+") as f:
        del f["batches/1/rank1/lengths"]
    rep, p = replay_reports(tmp, "broken", broken, 2)
    # The run goes on: the trouble is an error check of batch 1 (rank 1's KJT is needed by
    # every rank, so the whole batch), and batch 0 is still checked.
    errs = [c for c in rep["checks"] if c["status"] == "error"]
    check(rep["trouble"] is None, f"broken: trouble {rep['trouble']}")
    check(len(errs) == 1 and errs[0]["batch"] == 1 and errs[0]["rank"] == 1
          and errs[0]["stage"] == "capture" and "batches/1/rank1/lengths" in errs[0]["message"],
          f"broken: error checks {errs}")
    check(sum(c["batch"] == 0 and c["status"] == "pass" for c in rep["checks"]) > 10,
          "broken: the checks of batch 0 are reported")
    check(rep["summary"]["status"] == "error", "broken: status")
    check("batches/1/rank1" in p.stderr, "broken: stderr names the HDF5 path")
    # --fail-fast: the first trouble stops the run (the old behaviour), reports still written.
    rep, p = replay_reports(tmp, "broken_ff", broken, 2, ["--fail-fast"])
    check(rep["trouble"] and "batches/1/rank1" in rep["trouble"], f"fail-fast: {rep['trouble']}")
    check(not any(c["status"] == "error" for c in rep["checks"]), "fail-fast: no error checks")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
