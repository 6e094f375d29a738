"""What `make test` prints last: each lane's time against its budget and the ten slowest tests of the run.

    python tests/_lane_report.py LOGS BUDGET_MINUTES LANE...

LOGS is the folder `make test` writes (.test-logs): LANE.seconds, the lane's wall time, and BACKEND.xml, pytest's
JUnit report of each backend of the lane (a lane is backends joined by "+", e.g. tensorflow+torch). A lane over
its budget is said in one line; the exit status is 0 whatever the times (a loaded machine must not fail a run
by chance): the budget is a rule for people (docs/contributing.md), not a test. It writes LOGS/durations.json, each
backend's seconds per test file in this run: copied to tests/durations.json, it is the order, longest first, in which
the processes that share a backend's files ("jax-1of2", "jax-2of2") take them (tests/_claims.py).
"""

import collections
import json
import pathlib
import sys
import xml.etree.ElementTree as ET


def test_times(xml_path):
    """(seconds, test id) of every test case in the JUnit report `xml_path` (none if it is missing)."""
    if not xml_path.exists():
        return []
    cases = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        cases.append((float(case.get("time", 0)), f"{module}.py::{case.get('name')}"))
    return cases


def report(logs, budget_min, lanes):
    """The lines of the report (see the module's docstring) for the folder `logs`."""
    lines = [f"=== lanes against their budget of {budget_min:g} min each (Makefile's LANE_BUDGET_MIN) ==="]
    for lane in lanes:
        path = logs / f"{lane}.seconds"
        if not path.exists():
            lines.append(f"{lane:<20} no time recorded (the lane did not end)")
            continue
        minutes = int(path.read_text().split()[0]) / 60
        over = minutes - budget_min
        verdict = (f"OVER its budget by {over:.1f} min: a change is not done while a lane is over "
                   "(docs/contributing.md, 'Keeping the suite fast')" if over > 0 else "within its budget")
        lines.append(f"{lane:<20} {minutes:5.1f} min  {verdict}")
    slowest = sorted(((seconds, backend, test) for lane in lanes for backend in lane.split("+")
                      for seconds, test in test_times(logs / f"{backend}.xml")), reverse=True)[:10]
    lines.append("=== the ten slowest tests of the run ===")
    lines += [f"{seconds:7.1f} s  {backend:<10}  {test}" for seconds, backend, test in slowest]
    return lines


def durations(logs, tests=pathlib.Path("tests")):
    """{backend: {test file stem: seconds}} of the JUnit reports in `logs` (a backend's parts added up), every
    test file in `tests` there (0: none of its tests ran on the backend)."""
    files = {path.stem: 0.0 for path in tests.glob("test_*.py")}
    seconds = collections.defaultdict(lambda: collections.Counter(files))
    for xml_path in sorted(logs.glob("*.xml")):
        for time, test in test_times(xml_path):
            seconds[xml_path.stem.split("-")[0]][pathlib.Path(test.split("::")[0]).stem] += time
    return {backend: {f: round(s, 1) for f, s in sorted(files.items())} for backend, files in sorted(seconds.items())}


if __name__ == "__main__":
    folder, budget, *lane_names = sys.argv[1:]
    print("\n".join(report(pathlib.Path(folder), float(budget), lane_names)))
    (pathlib.Path(folder) / "durations.json").write_text(json.dumps(durations(pathlib.Path(folder)), indent=1) + "\n")
