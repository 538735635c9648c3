"""``optcheck upgrade``: the same soak on a baseline and a candidate, and the verdict. Torch-free.

A *side* is what a soak runs on: a backend, and for PyTorch the interpreter of
the worker (``--python``: another venv, another torch), for TorchSharp the
version or build (``--torchsharp``). Both sides get the same
:class:`optcheck.config.SoakConfig` (seed, data, batches, model, optimizer), so
``optcheck.judge.verdict.judge`` compares them step by step: identical, within
numerical noise, or diverged. Two backends (PyTorch against TorchSharp) start
from the same initial weights (``--same-init``, ``optcheck.drivers.soak.export_same_init``).

With ``scenarios`` every ``--inject`` scenario both sides support in one process
(never the ``--nproc``-only ones) also runs on both (short runs), and
:func:`render_matrix` puts their outcomes side by side: the findings, the crash
(type and step) or "no crash", and the lead time. Everything that will run is
checked before anything runs (:func:`plan`): the scenarios, each side's options, and
each ``--python`` interpreter's torch (:func:`probe_python`).

The candidate is judged against the baseline side by the one regression policy of
``optcheck.judge.baseline`` (new findings, loss band, speed, peak RSS), the same as
``soak --baseline`` applies to a night, plus the trajectory verdict (identical /
within numerical noise / within the seed band / diverged, ``optcheck.judge.verdict``) under
the policy ``optcheck.judge.policy`` picks (a migration across backends or native libraries).
A speed regression of the two sequential runs is run again in interleaved pairs of short
runs and stands only if they confirm it (``optcheck.judge.speed_pairs``).
Over 400 lines: the upgrade's plan, its two sides and the scenario matrix are checked before anything runs and reported together.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from optcheck.run import exitcodes
from optcheck import scenarios as catalogue
from optcheck.config import Injection, SoakConfig
from optcheck.errors import InputError
from optcheck.judge.baseline import REGRESSION, Tolerances
from optcheck.judge.speed_pairs import PAIRS, confirm, first_side, pair_steps

worst = exitcodes.worst  # the one policy (optcheck.run.exitcodes); kept under this name for callers


def parse_seeds(text: str) -> list[int]:
    """``"1,2,3"`` -> [1, 2, 3]. Raises InputError on anything but distinct whole numbers >= 0."""
    try:
        seeds = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        seeds = []
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) < len(seeds):
        raise InputError(f"--seeds {text!r}: distinct whole numbers >= 0 separated by commas, e.g. 1,2,3")
    return seeds


def run_seeds(cfg: SoakConfig, seeds: list[int], out, **kwargs):
    """Run ``cfg`` once per seed into ``out/seed-N`` (``optcheck.drivers.soak.run_soak`` each);
    returns (results, worst exit code). Every seed's config is validated before any runs.
    ``kwargs`` go to every run: pass all that shapes findings (``fail_on``,
    ``rule_config``, ``ignore``), or a finding the user accepted comes back in one seed."""
    from optcheck.drivers.soak import default_out_dir, run_soak, validate
    from optcheck.drivers.watch import Signals

    out = Path(out) if out is not None else default_out_dir()
    cfgs = []
    for s in seeds:
        c = cfg.copy()
        c.run.seed, c.run.run_id = s, f"{out.name}-seed-{s}"
        c.validate()
        cfgs.append(c)
    validate(cfgs[0])
    results = []
    with kwargs.pop("signals", None) or Signals() as sig:
        for c in cfgs:
            if sig.count:
                break
            results.append(run_soak(c, out / f"seed-{c.run.seed}", signals=sig, **kwargs))
    return results, worst(r.exit_code for r in results)


@dataclass
class Side:
    """One side of an upgrade check.

    Attributes:
        name: ``baseline`` or ``candidate`` (also its folder under ``--out``).
        backend: ``pytorch`` or ``torchsharp``.
        python: PyTorch: the worker's interpreter (None: this one).
        torchsharp: TorchSharp: a version to build the worker for, or a local build's folder.
    """

    name: str
    backend: str = "pytorch"
    python: str | None = None
    torchsharp: str | None = None

    def config(self, cfg: SoakConfig) -> SoakConfig:
        c = cfg.copy()
        c.run.backend = self.backend
        c.run.python, c.torchsharp.version = self.python or None, self.torchsharp or None
        return c

    def text(self) -> str:
        what = self.python or self.torchsharp or "this environment"
        return f"{self.name}: {self.backend} ({what})"


@dataclass
class ScenarioRow:
    """One scenario on both sides: per side its outcome as (findings, crash, lead time) texts."""

    scenario: str
    step: int
    baseline: tuple[str, str, str]
    candidate: tuple[str, str, str]
    time_s: float = 0.0
    seconds: dict = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return self.baseline != self.candidate


@dataclass
class UpgradeResult:
    """What :func:`run_upgrade` returns: the two runs' results, the comparison, the matrix, and
    the candidate judged against the baseline by ``optcheck.judge.baseline``'s policy."""

    baseline: object
    candidate: object
    compare: object | None
    rows: list[ScenarioRow]
    exit_code: int
    time_s: float = 0.0
    against: object | None = None  # optcheck.judge.baseline.BaselineResult: the candidate against the baseline side

    @property
    def regressions(self) -> list:
        """The regression checks (``optcheck.judge.baseline.Check``) of the candidate against the baseline."""
        return list(self.against.regressions) if self.against is not None else []


def outcome(summary: dict) -> tuple[str, str, str]:
    """(findings by code, crash ``Type at step N`` or ``no crash``, lead time) of a run's summary."""
    codes = ", ".join(sorted(summary.get("findings_by_code") or {})) or "none"
    crash = summary.get("crash")
    crash_text = f"{crash.get('exc_type') or crash.get('signal')} at step {crash.get('step')}" if crash else "no crash"
    if summary.get("stopped"):
        crash_text = f"stopped at step {summary['stopped'].get('step')}"
    lead = summary.get("lead_time")
    lead_text = f"{lead['lead_steps']} steps ({lead['finding'].split()[0]})" if lead else "-"
    return codes, crash_text, lead_text


def shared_scenarios(sides: list[Side], nproc: int = 1) -> list[str]:
    """Catalogue scenarios every side's backend implements with ``nproc`` processes, in
    catalogue order: the ``--nproc``-only ones (``optcheck.distributed.cli.DIST_SCENARIOS``)
    only when ``nproc`` > 1, and then only they."""
    from optcheck.distributed.cli import DIST_SCENARIOS

    return [n for n, s in catalogue.CATALOGUE.items() if all(side.backend in s.backends for side in sides)
            and (n in DIST_SCENARIOS) == (nproc > 1)]


def plan_scenarios(sides: list[Side], names: list[str] | None) -> list[str]:
    """The scenarios an upgrade will run, checked before anything runs: ``names`` (each
    known, on both sides' backends, and not ``--nproc``-only: an upgrade runs one process),
    or with None every scenario :func:`shared_scenarios` gives.

    Raises:
        InputError: one line naming the first scenario that cannot run and why.
    """
    from optcheck.distributed.cli import DIST_SCENARIOS

    if names is None:
        return shared_scenarios(sides)
    for n in names:
        for side in sides:
            catalogue.get(n, side.backend)
        if n in DIST_SCENARIOS:
            raise InputError(f"--scenario {n}: an --nproc-only scenario (optcheck soak --nproc 2 --inject {n}@STEP); "
                             f"upgrade runs one process: leave it out")
    return list(dict.fromkeys(names))


_PROBE = """
import importlib.metadata as m, importlib.util as u, json, sys
try:
    torch = m.version("torch")
except Exception:
    torch = None
need = ("numpy", "psutil", "packaging", "jsonschema")
print(json.dumps({"torch": torch, "torch_importable": u.find_spec("torch") is not None,
                  "missing": [n for n in need if u.find_spec(n) is None],
                  "python": "%d.%d.%d" % sys.version_info[:3]}))
"""


def probe_python(path: str, option: str, timeout: float = 120.0) -> dict:
    """Ask interpreter ``path`` (without importing torch: package metadata only) which torch
    it has and whether optcheck's own dependencies are there, as the worker would see them
    (this optcheck first on PYTHONPATH). Returns the answer (``torch``, ``python``).

    Raises:
        InputError: it does not start, has no torch or one older than torch 2.1, or lacks
            one of optcheck's dependencies: one line naming the interpreter and the fix.
    """
    from optcheck import torch_version

    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the folder holding optcheck/
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    try:
        r = subprocess.run([path, "-c", _PROBE], capture_output=True, text=True, timeout=timeout, env=env,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise InputError(f"{option} {path}: not a working Python interpreter ({e})") from None
    try:
        info = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = " ".join(r.stderr.split())[-200:] or f"exit {r.returncode}, no answer"
        raise InputError(f"{option} {path}: not a working Python interpreter ({tail})") from None
    msg = torch_version.problem(info.get("torch"), bool(info.get("torch_importable")))
    if msg:
        raise InputError(f"{option} {path}: " + msg.replace("--backend pytorch needs", "the PyTorch worker needs")
                         + f" (into that interpreter: {path} -m pip install ...)")
    if info.get("missing"):
        raise InputError(f"{option} {path}: optcheck's dependencies are missing there: {', '.join(info['missing'])} "
                         f"({path} -m pip install {' '.join(info['missing'])})")
    return info


def _same_init(cfg: SoakConfig, sides: list[Side], out: Path) -> str | None:
    """The PyTorch GPT's initial weights exported for the TorchSharp side when the sides'
    backends differ (its folder), else None."""
    if len({s.backend for s in sides}) > 1:
        from optcheck.drivers.soak import export_same_init

        return str(export_same_init(cfg, out))
    return None


def _run_pair(cfg: SoakConfig, sides: list[Side], out: Path, sig, init: str | None, **kwargs) -> list:
    from optcheck.drivers.soak import run_soak

    results = []
    for side in sides:
        if sig.count:
            break
        c = side.config(cfg)
        c.torchsharp.same_init = init if side.backend == "torchsharp" else None
        c.run.run_id = f"{out.name}-{side.name}"
        results.append(run_soak(c, out / side.name, signals=sig, **kwargs))
    return results


def _confirm_speed(check, cfg: SoakConfig, sides: list[Side], out: Path, sig, init: str | None, pairs: int,
                   tolerances, **kwargs):
    """``check`` as :func:`optcheck.judge.speed_pairs.confirm` leaves it when it is a speed
    regression (pairs of ``pair_steps`` runs into ``out/speed-pairs/pair-N/``), else ``check``."""
    if check.name != "speed" or check.status != REGRESSION or pairs <= 0:
        return check
    pc = cfg.copy()
    pc.run.steps = pair_steps(cfg.run.steps)
    if kwargs.get("progress"):
        print(f"optcheck upgrade: {check.brief or check.text}: running both sides again in {pairs} interleaved "
              f"pair(s) of {pc.run.steps}-step runs to tell a regression from load that changed between the runs",
              file=sys.stderr)

    def run_pair(k: int):
        first = first_side(k)
        got = _run_pair(pc, sides[::-1] if first else sides, out / "speed-pairs" / f"pair-{k + 1}", sig, init,
                        **kwargs)
        if not _finished(got):
            return None
        a, b = (r.summary for r in got)
        return (b, a) if first else (a, b)

    return confirm(check, (tolerances or Tolerances()).speed, run_pair, pairs)


def _finished(results: list) -> bool:
    """Both sides' runs (``run_soak`` results) are there and finished: status clean or findings."""
    return len(results) == 2 and all(r.summary.get("status") in ("clean", "findings") for r in results)


def run_upgrade(cfg: SoakConfig, baseline: Side, candidate: Side, out, *, scenarios: list[str] | None = None,
                scenario_steps: int = 40, progress: bool = False, force: bool = False, signals=None,
                tolerances=None, policy: str = "auto", echo=None, speed_pairs: int = PAIRS,
                **kwargs) -> UpgradeResult:
    """Run ``cfg`` on both sides into ``out/baseline`` and ``out/candidate``, compare them
    (``optcheck.judge.compare.compare_runs``: the verdict of ``optcheck.judge.verdict.judge``), and with
    ``scenarios`` (names, or ``"all"``: :func:`shared_scenarios`) run each scenario at step ``scenario_steps // 2`` of a
    ``scenario_steps``-step soak on both sides into ``out/scenarios/NAME/``.
    ``kwargs`` (``fail_on``, ``rule_config``, ``ignore``...) go to every
    ``optcheck.drivers.soak.run_soak`` of both sides, the scenario runs included.
    The candidate is then judged against the baseline's run by
    ``optcheck.judge.baseline.compare_with_baseline`` (``tolerances``: an
    ``optcheck.judge.baseline.Tolerances``) with the trajectory ``policy``; ``echo`` (a
    callable) is told the plan before anything runs. A speed regression of the two runs is run
    again in ``speed_pairs`` interleaved pairs of short runs into ``out/speed-pairs/pair-N/``
    and stands only if they confirm it (``optcheck.judge.speed_pairs``; 0: not run again).

    Raises:
        InputError: bad option on either side, a scenario that cannot run (unknown, not on
            a side's backend, ``--nproc``-only), a ``--python`` without a usable torch:
            all checked before anything runs.
    """
    from optcheck.judge.compare import compare_runs
    from optcheck.drivers.soak import default_out_dir, validate
    from optcheck.drivers.watch import Signals

    t0 = time.time()
    out = Path(out) if out is not None else default_out_dir()
    sides = [baseline, candidate]
    from optcheck.judge.policy import POLICIES

    if policy not in POLICIES:
        raise InputError(f"--policy {policy}: one of {', '.join(POLICIES)}")
    for side in sides:
        if side.python:
            probe_python(side.python, f"--{side.name}-python")
    for side in sides:
        validate(side.config(cfg))
    names = plan_scenarios(sides, None if scenarios == "all" else list(scenarios or []))
    if names and scenario_steps < 2:
        raise InputError(f"--scenario-steps {scenario_steps}: must be at least 2")
    if speed_pairs < 0:
        raise InputError(f"--speed-pairs {speed_pairs}: a whole number >= 0 (0: a speed regression of the "
                         f"sequential runs is not run again)")
    if echo is not None:
        echo(f"optcheck upgrade: {cfg.run.steps:,}-step soak on each side"
             + (f", then {len(names)} scenario(s) of {scenario_steps} steps on each side: {', '.join(names)}"
                if names else ""))
    kwargs.update(progress=progress, force=force)
    rows: list[ScenarioRow] = []
    with signals or Signals() as sig:
        init = _same_init(cfg, sides, out)
        results = _run_pair(cfg, sides, out, sig, init, **kwargs)
        res = against = None
        if _finished(results):
            from optcheck.judge.baseline import compare_with_baseline

            res = compare_runs(results[0].out, results[1].out, policy=policy)
            against = compare_with_baseline(results[1].out, results[0].out, tolerances, policy=policy)
            against.checks = [_confirm_speed(c, cfg, sides, out, sig, init, speed_pairs, tolerances, **kwargs)
                              for c in against.checks]
        for n in names:
            sc = cfg.copy()
            step = max(1, scenario_steps // 2)
            sc.run.steps, sc.run.every, sc.data.val_every = scenario_steps, max(1, scenario_steps // 4), 0
            sc.checks.inject = [Injection(n, step)]
            ts = time.time()
            pair = _run_pair(sc, sides, out / "scenarios" / n, sig, init, **kwargs)
            if len(pair) < 2:
                break
            rows.append(ScenarioRow(n, step, outcome(pair[0].summary), outcome(pair[1].summary),
                                    time_s=time.time() - ts,
                                    seconds={s.name: r.summary.get("elapsed_s") for s, r in zip(sides, pair)}))
    codes = [r.exit_code for r in results]
    if sig.count:
        code = exitcodes.INTERRUPTED
    elif any(c in (exitcodes.CRASHED, exitcodes.RECORD_FAILED) for c in codes):
        code = worst(codes)
    else:
        code = res.exit_code if res is not None else exitcodes.FINDINGS
        if any(r.changed for r in rows) or (against is not None and against.regressions):
            code = max(code, exitcodes.FINDINGS)
    return UpgradeResult(results[0] if results else None, results[1] if len(results) > 1 else None, res, rows,
                         code, time.time() - t0, against)


def render_matrix(rows: list[ScenarioRow], baseline: str = "baseline", candidate: str = "candidate") -> str:
    """The scenario matrix as a table: scenario, then findings / crash / lead time on each
    side; a changed row starts with ``*``."""
    head = ("", "scenario", f"{baseline} findings", "crash", "lead", f"{candidate} findings", "crash", "lead")
    body = [("*" if r.changed else "", f"{r.scenario}@{r.step}", *r.baseline, *r.candidate) for r in rows]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(widths[i]) for i, c in enumerate(x)).rstrip() for x in [head, *body]]
    changed = sum(r.changed for r in rows)
    lines.append(f"{changed} of {len(rows)} scenarios changed behaviour (marked *)")
    return "\n".join(lines)


def _crash_text(summary: dict) -> str:
    """`` at step 0: ModuleNotFoundError: No module named 'torch'`` of a crashed run, else ""."""
    c = summary.get("crash")
    if not c:
        return ""
    msg = " ".join(str(c.get("message") or "").split())[:200]
    return f" at step {c.get('step')}: {c.get('exc_type') or c.get('signal') or 'crash'}" + (f": {msg}" if msg else "")


def render(result: UpgradeResult, sides: list[Side]) -> str:
    """The verdict first — the trajectory's headline, then every regression of the candidate
    against the baseline (``optcheck.judge.baseline``: findings, loss band, speed, peak RSS) on the
    same line — then the checks, the comparison table, the scenario matrix and PASS / FAIL."""
    lines = []
    regress = "; ".join(c.brief or c.name for c in result.regressions)
    if result.compare is not None and result.compare.verdict is not None:
        head, *rest = result.compare.verdict.lines()
        lines += [head + (f"; REGRESSION: {regress}" if regress else ""), *rest]
    else:
        why = [f"{s.name}: {r.summary['status']}" + _crash_text(r.summary)
               for s, r in zip(sides, (result.baseline, result.candidate)) if r]
        lines.append("NO VERDICT: a side did not finish (" + "; ".join(why) + ")")
    lines += ["  " + s.text() for s in sides]
    if result.against is not None:
        lines += ["", "Candidate against the baseline (optcheck.judge.baseline's regression policy, as soak --baseline):",
                  *(c.line() for c in result.against.checks if c.name != "trajectory")]
    if result.compare is not None:  # its table, without the verdict printed above
        text = result.compare.render().split("\n")
        body = text[1 + len(result.compare.verdict.lines()):]
        while body and (body[-1].startswith(("PASS", "FAIL")) or not body[-1].strip()):
            body.pop()
        lines += ["", text[0], *body]
    if result.rows:
        lines += ["", "Scenario matrix (baseline beside candidate):", render_matrix(result.rows)]
    lines.append("")
    why = []
    if result.compare is not None and result.compare.diverged:
        why.append("the trajectory diverged (OC601)")
    if result.compare is not None:
        why += result.compare.incomplete + result.compare.mismatch
    why += [c.brief or c.name for c in result.regressions]
    changed = sum(r.changed for r in result.rows)
    if changed:
        why.append(f"{changed} scenario(s) changed behaviour")
    if result.exit_code == exitcodes.CLEAN:
        lines.append(f"PASS (exit 0): {result.compare.verdict.headline().split(':')[0] if result.compare else 'ok'}"
                     + (f", no regression, {len(result.rows)} scenario(s) unchanged" if result.rows
                        else ", no regression"))
    else:
        lines.append(f"FAIL (exit {result.exit_code}): " + ("; ".join(why) or "a side did not finish"))
    return "\n".join(lines)


def check_python(path: str | None, option: str) -> str | None:
    """``path`` made absolute when it is an executable file; InputError otherwise."""
    if path is None:
        return None
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise InputError(f"{option} {path}: not an executable file (give a venv's bin/python)")
    return os.path.abspath(path)
