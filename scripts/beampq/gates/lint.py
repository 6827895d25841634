#
# Licensed to the Apache Software Foundation (ASF) under one or more
# contributor license agreements.  See the NOTICE file distributed with
# this work for additional information regarding copyright ownership.
# The ASF licenses this file to You under the Apache License, Version 2.0
# (the "License"); you may not use this file except in compliance with
# the License.  You may obtain a copy of the License at
#
#    http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#

"""The lint gates, as Beam 2.77's lint env runs them, on the files the queue
touches: ruff (on the tree and at each pull request's head), yapf, the
unittest.main check and pyrefly (`lint`), pylint
and mypy with Beam's legacy settings, and `format`, which fixes what yapf
and ruff's import sorting can fix."""

import importlib.util
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from beampq import Error
from beampq import git
from beampq import tree as tree_module
from beampq.gates import findings
from beampq.gates.findings import Finding
from beampq.gates.workspace import Workspace

SETTINGS = Path(__file__).parent


def _tool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
  if importlib.util.find_spec(args[0]) is None:
    # Else `python -m` fails with the status that means findings to mypy.
    raise Error(
        f'{args[0]} is not installed for {sys.executable}: run the gate '
        'through its tox env (see tox.ini)')
  return subprocess.run([sys.executable, '-m', *args],
                        cwd=cwd,
                        capture_output=True,
                        text=True,
                        check=False)


def _existing(sdk: Path, files: list[str]) -> list[str]:
  return [f for f in files if (sdk / f).is_file()]


def _ruff_output(sdk: Path, files: list[str]) -> str:
  """`ruff check --output-format=json` on files under sdk."""
  files = _existing(sdk, files)
  if not files:
    return '[]'
  result = _tool(
      'ruff',
      'check',
      '--no-cache',
      '--force-exclude',
      '--output-format=json',
      *files,
      cwd=sdk)
  if result.returncode not in (0, 1):
    raise Error(f'ruff failed: {result.stderr.strip()}')
  return result.stdout


def ruff_findings(
    sdk: Path,
    files: list[str],
    anchors: Optional[dict[str, set[str]]] = None) -> list[Finding]:
  return findings.with_source(
      findings.parse_ruff(_ruff_output(sdk, files), sdk, anchors), sdk)


def ruff_compared(
    base_sdk: Path, base_files: list[str], sdk: Path,
    files: list[str]) -> tuple[list[Finding], list[Finding]]:
  """ruff's findings on the base and on the patched tree, the patched
  tree's unsorted imports told apart as the base's sort (kept_imports)."""
  output = _ruff_output(base_sdk, base_files)
  before = findings.with_source(findings.parse_ruff(output, base_sdk), base_sdk)
  return before, ruff_findings(
      sdk, files, findings.kept_imports(output, base_sdk))


def ruff_at_heads(ws: Workspace) -> bool:
  """The ruff ratchet at the head of each pull request before the last, as
  each is submitted: a name that a later pull request defines or imports is
  undefined there. True when no head adds a finding; False when the heads
  cannot be told."""
  heads = ws.pull_request_heads()
  if heads is None:
    return False
  ok = True
  for name, commit in heads:
    modified, added = ws.changed_at(commit)
    files = modified + added
    with tempfile.TemporaryDirectory() as scratch:
      sdk = ws.sdk_at(commit, files, Path(scratch))
      ok = findings.ratchet(
          f'ruff at the head of {name} ({commit[:12]})',
          *ruff_compared(ws.base_sdk, modified, sdk, files)) and ok
  return ok


def pyrefly_findings(sdk: Path) -> list[Finding]:
  result = _tool(
      'pyrefly',
      'check',
      '--output-format=json',
      str(sdk / 'apache_beam'),
      cwd=sdk)
  return findings.with_source(findings.parse_pyrefly(result.stdout, sdk), sdk)


def pylint_findings(sdk: Path, files: list[str]) -> list[Finding]:
  result = _tool(
      'pylint',
      f'--rcfile={SETTINGS / "pylintrc"}',
      '--output-format=json',
      '--jobs=2',
      *_existing(sdk, files),
      cwd=sdk)
  if result.returncode & 32 or not result.stdout.strip():
    raise Error(f'pylint failed: {result.stderr.strip()[-300:]}')
  return findings.with_source(findings.parse_pylint(result.stdout), sdk)


def mypy_findings(sdk: Path, files: list[str], cache: Path) -> list[Finding]:
  files = _existing(sdk, files)
  result = _tool(
      'mypy',
      f'--config-file={SETTINGS / "mypy.ini"}',
      f'--cache-dir={cache}',
      '--no-error-summary',
      '--no-color-output',
      '--show-error-codes',
      *files,
      cwd=sdk)
  if result.returncode not in (0, 1):
    raise Error(f'mypy failed: {(result.stderr or result.stdout)[-300:]}')
  # Every module mypy reports, not only files: a patch that changes a
  # signature breaks its callers in modules the patch does not touch.
  return findings.with_source(findings.parse_mypy(result.stdout), sdk)


def unittest_main_problems(sdk: Path, files: list[str]) -> list[str]:
  """Beam's rule: a test module that imports unittest calls unittest.main."""
  problems = []
  for name in _existing(sdk, files):
    text = (sdk / name).read_text()
    if re.search(r'^import unittest$', text,
                 re.M) and 'unittest.main' not in text:
      problems.append(f'{name} imports unittest but never calls unittest.main')
  return problems


def _yapf_files(files: list[str]) -> list[str]:
  """The files Beam formats with yapf: its package, not setup.py."""
  return [f for f in files if f.startswith('apache_beam/')]


def lint(ws: Workspace) -> int:
  if not ws.files:
    print('beampq: lint: the queue touches no Python files')
    return 0
  ok = findings.ratchet(
      'ruff', *ruff_compared(ws.base_sdk, ws.modified, ws.sdk, ws.files))
  ok = ruff_at_heads(ws) and ok
  formatted = _yapf_files(_existing(ws.sdk, ws.files))
  diff = _tool('yapf', '--diff', *formatted, cwd=ws.sdk)
  if diff.returncode not in (0, 1) or diff.stderr.strip():
    raise Error(f'yapf failed: {diff.stderr.strip()[-300:]}')
  print(
      f'beampq: yapf --diff on {len(formatted)} files: '
      f'{"clean" if not diff.stdout.strip() else "needs formatting"}')
  if diff.stdout.strip():
    print(diff.stdout)
    ok = False
  problems = unittest_main_problems(ws.sdk, ws.files)
  print(
      f'beampq: unittest.main check on {len(ws.files)} files: '
      f'{len(problems)} problems')
  for problem in problems:
    print(f'  {problem}')
  ok = findings.ratchet(
      'pyrefly', pyrefly_findings(ws.base_sdk), pyrefly_findings(
          ws.sdk)) and ok and not problems
  return 0 if ok else 1


def pylint(ws: Workspace) -> int:
  before = pylint_findings(ws.base_sdk, ws.modified)
  after = pylint_findings(ws.sdk, ws.files)
  return 0 if findings.ratchet('pylint', before, after) else 1


def mypy(ws: Workspace) -> int:
  cache = ws.project.build / 'mypy-cache'
  after = mypy_findings(ws.sdk, ws.files, cache / 'patched')
  # The modules the patched run reaches beyond the touched files (which
  # import them) are checked on the base too, so that their own errors
  # count on both sides where only the patched tree imports them.
  reached = sorted({f.path for f in after} - set(ws.files))
  before = mypy_findings(ws.base_sdk, ws.modified + reached, cache / 'base')
  return 0 if findings.ratchet('mypy', before, after) else 1


def format_files(ws: Workspace) -> int:
  """yapf on the touched files; ruff's import sorting where the base had none
  to fix, so that patches do not carry unrelated import churn."""
  files = _existing(ws.sdk, ws.files)
  unsorted_before = {
      f.path
      for f in ruff_findings(ws.base_sdk, ws.modified) if f.code == 'I001'
  }
  sortable = [f for f in files if f not in unsorted_before]
  for args, targets in ((('yapf', '--in-place'), _yapf_files(files)),
                        (('ruff', 'check', '--no-cache', '--select=I', '--fix',
                          '--quiet'), sortable)):
    if not targets:
      continue
    result = _tool(*args, *targets, cwd=ws.sdk)
    if result.returncode not in (0, 1):
      raise Error(f'{args[0]} failed: {result.stderr.strip()[-300:]}')
  changed = git.dirty_paths(ws.tree)
  print(
      f'beampq: formatted {len(files)} files; {len(changed)} changed in '
      f'{ws.project.rel(ws.tree)}' + (
          ': commit each change into the patch whose lines it changes (`git '
          'commit --fixup=<commit>`, then `git rebase -i --autosquash '
          f'{tree_module.BASE_TAG}`) and run `beampq refresh`'
          if changed else ''))
  for entry in changed:
    path = entry[3:]
    owners = git.commits_touching(ws.tree, tree_module.BASE_TAG, path)
    print(
        f'beampq:   {path}: ' + (
            '; '.join(
                f'{sha} {subject}'
                for sha, subject in owners) if owners else 'no patch yet'))
  return 0
