"""A small GitHub Actions runner for one job of a workflow file: enough to run the
shipped nightly workflow (``examples/ci/github/optcheck-nightly.yml``) night after night
on this machine, its ``run:`` steps for real.

What it does as GitHub does (docs.github.com, "Workflow commands" and "Contexts"):

- ``run:`` steps: ``bash --noprofile --norc -eo pipefail FILE`` in the workspace, with the
  workflow's, job's and step's ``env`` (``${{ }}`` expressions expanded), and the files
  ``GITHUB_ENV`` (``NAME=value`` lines become the next steps' environment),
  ``GITHUB_OUTPUT`` (``steps.<id>.outputs``), ``GITHUB_PATH`` (prepended to ``PATH``) and
  ``GITHUB_STEP_SUMMARY`` (the job summary, kept per night); ``GITHUB_SHA``,
  ``GITHUB_RUN_ID``, ``GITHUB_WORKSPACE``, ``RUNNER_TEMP``, ``CI=true``.
- ``if:``: ``always()``; a comparison ``context == 'text'``; without ``if`` a step runs
  only while every earlier step succeeded; ``continue-on-error`` keeps a failure from
  failing the job.
- The ``uses:`` steps the workflow names, by their documented effect:
  ``actions/checkout`` copies the files git tracks in the checkout (``checkout_copy.copy_tracked``) into the workspace;
  ``actions/setup-python`` puts a virtual environment's ``bin`` on ``PATH`` (made once per
  :class:`Runner` from this interpreter with ``--system-site-packages``: torch and the
  rest are this machine's, optcheck is whatever the workflow installs into it);
  ``actions/cache/restore`` and ``/save`` (exact key, else the newest entry whose key
  starts with a ``restore-keys`` prefix; a saved key is never overwritten);
  ``actions/upload-artifact`` (the folder's files, kept per night; output
  ``artifact-url``); ``dawidd6/action-download-artifact`` with ``workflow_conclusion:
  success`` (the named artifact of the newest *successful* night); ``mikepenz/action-junit-report``
  (the JUnit file must parse). ``actions/setup-dotnet`` and ``actions/cache`` run only
  in the TorchSharp leg of the matrix, which this harness does not run (no .NET SDK or
  NuGet here): a step it does not know fails the night, so a new ``uses:`` cannot slip
  through untried.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from checkout_copy import copy_tracked

EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


@dataclass
class StepResult:
    name: str
    outcome: str          # "success", "failure", "skipped"
    rc: int | None = None
    output: str = ""


@dataclass
class Night:
    run_id: int
    sha: str
    conclusion: str                    # "success" or "failure"
    steps: list[StepResult]
    summary: str                       # what GITHUB_STEP_SUMMARY holds at the end
    env: dict[str, str]                # GITHUB_ENV's names at the end
    workspace: Path
    artifacts: dict[str, Path] = field(default_factory=dict)

    def step(self, name: str) -> StepResult:
        return next(s for s in self.steps if s.name == name)


class Runner:
    """Runs job ``job`` of ``workflow`` for one matrix entry, night after night, keeping
    the caches and artifacts between nights under ``home``.

    Args:
        workflow: the workflow file.
        checkout: the folder ``actions/checkout`` copies (the files git tracks; a user's ``.venv`` or other untracked files stay out).
        home: where the runner keeps workspaces, caches, artifacts and the Python environment.
        matrix: the matrix entry, e.g. ``{"backend": "pytorch"}``.
        env: variables set on the runner itself (applied before the workflow's own ``env``
            only where the workflow does not set them: ``overrides`` wins over the workflow).
        overrides: variables that replace the workflow's ``env`` values (e.g. ``STEPS``).
        skip: step names not run, each with the reason (reported as skipped).
    """

    def __init__(self, workflow: Path, checkout: Path, home: Path, matrix: dict, job: str = "soak",
                 env: dict | None = None, overrides: dict | None = None, skip: dict | None = None):
        self.wf = yaml.safe_load(workflow.read_text(encoding="utf-8"))
        self.job = self.wf["jobs"][job]
        self.checkout, self.home, self.matrix = checkout, home, matrix
        self.base_env = dict(env or {})
        self.overrides = dict(overrides or {})
        self.skip = dict(skip or {})
        self.caches: dict[str, Path] = {}          # key -> folder, in save order
        self.nights: list[Night] = []
        self.venv = home / "toolcache" / "python"

    # -- expressions -------------------------------------------------------------------
    def _lookup(self, expr: str, ctx: dict) -> str:
        parts = expr.split(".")
        if parts[0] == "matrix":
            return str(self.matrix[parts[1]])
        if parts[0] == "env":
            return ctx["env"].get(parts[1], "")
        if parts[0] == "steps" and parts[2] == "outputs":
            return ctx["outputs"].get(parts[1], {}).get(parts[3], "")
        if expr == "github.run_id":
            return str(ctx["run_id"])
        if expr == "github.sha":
            return ctx["sha"]
        if expr == "runner.os":
            return "Linux"
        raise ValueError(f"expression the harness does not know: {expr}")

    def expand(self, text, ctx: dict):
        if isinstance(text, str):
            return EXPR.sub(lambda m: self._lookup(m.group(1), ctx), text)
        if isinstance(text, dict):
            return {k: self.expand(v, ctx) for k, v in text.items()}
        return text

    def _should_run(self, cond, failed: bool, ctx: dict) -> bool:
        if cond is None:
            return not failed
        cond = str(cond).strip()
        cond = EXPR.sub(lambda m: m.group(1), cond)
        if cond == "always()":
            return True
        m = re.fullmatch(r"([\w.-]+)\s*==\s*'([^']*)'", cond)
        if m:
            return not failed and self._lookup(m.group(1), ctx) == m.group(2)
        raise ValueError(f"if: the harness does not know: {cond}")

    # -- one night -----------------------------------------------------------------------
    def run_night(self, sha: str, timeout_s: float = 900) -> Night:
        run_id = 1000 + len(self.nights) + 1
        ws = self.home / f"run-{run_id}" / "workspace"
        tmp = self.home / f"run-{run_id}" / "temp"
        ws.mkdir(parents=True)
        tmp.mkdir(parents=True)
        files = {n: tmp / n for n in ("env", "output", "path", "summary")}
        for f in files.values():
            f.write_text("")
        ctx = {"env": {}, "outputs": {}, "run_id": run_id, "sha": sha}
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "PYTEST", "VIRTUAL_ENV"))}
        env.update(self.base_env)
        env.update(CI="true", GITHUB_ACTIONS="true", GITHUB_SHA=sha, GITHUB_RUN_ID=str(run_id),
                   GITHUB_WORKSPACE=str(ws), RUNNER_TEMP=str(tmp), RUNNER_OS="Linux",
                   GITHUB_ENV=str(files["env"]), GITHUB_OUTPUT=str(files["output"]),
                   GITHUB_PATH=str(files["path"]), GITHUB_STEP_SUMMARY=str(files["summary"]))
        for scope in (self.wf.get("env") or {}, self.job.get("env") or {}):
            for k, v in scope.items():
                ctx["env"][k] = self.overrides.get(k, self.expand(str(v), ctx))
        env.update(ctx["env"])
        paths: list[str] = []
        failed = False
        results: list[StepResult] = []
        artifacts: dict[str, Path] = {}
        for i, step in enumerate(self.job["steps"]):
            name = step.get("name") or step.get("uses") or f"step {i}"
            if name in self.skip or not self._should_run(step.get("if"), failed, ctx):
                results.append(StepResult(name, "skipped", output=self.skip.get(name, "")))
                continue
            step_env = {**env, **{k: self.expand(str(v), ctx) for k, v in (step.get("env") or {}).items()}}
            step_env["PATH"] = os.pathsep.join([*reversed(paths), env["PATH"]])
            try:
                if "run" in step:
                    rc, out = self._run(step["run"], ctx, step_env, ws, timeout_s)
                else:
                    rc, out = self._uses(step, ctx, ws, paths, run_id, artifacts)
            except Exception as e:  # a harness error is this step's failure, named
                rc, out = 1, f"{type(e).__name__}: {e}"
            # workflow commands written to the files
            for line in files["env"].read_text().splitlines():
                if "=" in line:
                    k, v = line.split("=", 1)
                    ctx["env"][k] = env[k] = v
            outs = dict(line.split("=", 1) for line in files["output"].read_text().splitlines() if "=" in line)
            if step.get("id") and outs:
                ctx["outputs"].setdefault(step["id"], {}).update(outs)
            files["output"].write_text("")
            paths += [p for p in files["path"].read_text().splitlines() if p and p not in paths]
            outcome = "success" if rc == 0 else "failure"
            results.append(StepResult(name, outcome, rc, out))
            if rc != 0 and not step.get("continue-on-error"):
                failed = True
        night = Night(run_id, sha, "failure" if failed else "success", results, files["summary"].read_text(),
                      dict(ctx["env"]), ws, artifacts)
        self.nights.append(night)
        return night

    def _run(self, script: str, ctx: dict, env: dict, ws: Path, timeout_s: float) -> tuple[int, str]:
        path = Path(env["RUNNER_TEMP"]) / f"step-{len(list(Path(env['RUNNER_TEMP']).glob('step-*')))}.sh"
        path.write_text(self.expand(script, ctx), encoding="utf-8")
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(path)], cwd=ws, env=env,
                              capture_output=True, text=True, timeout=timeout_s)
        return proc.returncode, proc.stdout + proc.stderr

    def _uses(self, step: dict, ctx: dict, ws: Path, paths: list, run_id: int, artifacts: dict) -> tuple[int, str]:
        action, _, _ = step["uses"].partition("@")
        w = self.expand(step.get("with") or {}, ctx)
        if action == "actions/checkout":
            n = copy_tracked(self.checkout, ws)
            return 0, f"checked out {n} files"
        if action == "actions/setup-python":
            if not (self.venv / "bin" / "python").exists():
                subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(self.venv)], check=True)
            paths.append(str(self.venv / "bin"))
            return 0, f"python {w.get('python-version')}: {self.venv}"
        if action == "actions/cache/restore":
            hit = self.caches.get(w["key"])
            if hit is None:
                for prefix in str(w.get("restore-keys", "")).split():
                    hits = [k for k in self.caches if k.startswith(prefix)]
                    hit = self.caches[hits[-1]] if hits else None
                    if hit:
                        break
            if hit is None:
                return 0, "cache not found"
            shutil.copytree(hit, ws / w["path"], dirs_exist_ok=True)
            return 0, f"restored from {hit}"
        if action == "actions/cache/save":
            if w["key"] in self.caches:
                return 0, "cache key exists: not saved"
            if not (ws / w["path"]).exists():
                return 0, "nothing to save"
            dest = self.home / "caches" / w["key"]
            shutil.copytree(ws / w["path"], dest)
            self.caches[w["key"]] = dest
            return 0, f"saved {w['key']}"
        if action == "actions/upload-artifact":
            src = ws / w["path"]
            if not src.is_dir():
                return 0, f"warning: no files at {w['path']}"
            dest = self.home / "artifacts" / str(run_id) / w["name"]
            shutil.copytree(src, dest)        # a folder's files, without the folder (as upload-artifact does)
            artifacts[w["name"]] = dest
            url = f"https://github.example/actions/runs/{run_id}/artifacts/{w['name']}"
            with open(ws.parent / "temp" / "output", "a", encoding="utf-8") as fh:
                fh.write(f"artifact-url={url}\n")
            return 0, f"uploaded {w['name']}: {url}"
        if action == "dawidd6/action-download-artifact":
            assert w.get("workflow_conclusion") == "success", w
            good = [n for n in self.nights if n.conclusion == "success" and w["name"] in n.artifacts]
            if not good:
                return 0, "warning: no artifact found"
            shutil.copytree(good[-1].artifacts[w["name"]], ws / w["path"])
            return 0, f"downloaded {w['name']} of run {good[-1].run_id}"
        if action == "mikepenz/action-junit-report":
            ET.parse(ws / w["report_paths"])  # raises on a missing or broken file
            return 0, "junit parsed"
        raise ValueError(f"uses: the harness does not know {step['uses']}")
