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

"""Beam's tests on the patched tree: the `test` gate (the test modules the
queue touches) and the opt-in `regression` gate (the wider suites, with
failures compared against the base)."""

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import beampq
from beampq import Error
from beampq.gates import selection
from beampq.gates.workspace import Workspace

# The folder that holds the beampq package, for the pytest plugin.
PACKAGE_PARENT = Path(beampq.__file__).resolve().parent.parent
# Test folders that exercise BatchElements and RunInference as a whole, the
# BundleBasedDirectRunner's metrics, which 0004 changes, and the metrics
# containers, which 0005 changes.
REGRESSION_FOLDERS = (
    'apache_beam/transforms',
    'apache_beam/ml/inference',
    'apache_beam/runners/direct',
    'apache_beam/metrics')
# Tests of the series that push thousands of elements through real
# pipelines, each a large share of a pyXY env's time, and that test no
# Python version's behaviour: `test --series` leaves them out, and they run
# once, with the whole modules on the newest Python (`test`). Node id
# prefixes, relative to the sdk folder (a prefix covers parameterized's
# name_0_... tests); each must name a test of the tree.
RUN_ONCE = (
    'apache_beam/transforms/util_test.py::AdaptiveNumShardsTest::'
    'test_unique_keys_fill_batches',
    'apache_beam/transforms/util_test.py::AdaptiveNumShardsTest::'
    'test_a_busy_process_spreads_its_cold_keys_in_streaming',
)


def pytest_on(
    sdk: Path,
    targets: list[str],
    cache: Path,
    failed: Optional[list[str]] = None,
    chosen: Optional[selection.Selection] = None,
    reasons: Optional[dict[str, str]] = None) -> int:
  """Runs Beam's pytest setup in an sdk folder: the tests in parallel, then
  the no_xdist ones alone, if any. Adds the ids of failed tests to failed,
  and what pytest's summary gives as each one's reason to reasons. With
  chosen, only the tests it selects run."""
  with tempfile.TemporaryDirectory(prefix='beampq-pytest-') as tmp:
    if chosen is not None:
      select_file = Path(tmp) / 'selection.json'
      select_file.write_text(json.dumps(chosen))
      # One argument, so that pytest does not take the file's folder into
      # its rootdir.
      targets = [f'--beampq-select={select_file}'] + targets
    return _pytest_runs(
        sdk, targets, cache, failed, beam_test_env(sdk, tmp), reasons)


def beam_test_env(sdk: Path, tmp: str) -> dict[str, str]:
  """The environment of Beam's tests on sdk: the tree and the plugin on the
  path, and a temporary folder of their own. Beam keeps machine-wide state
  there (multi_process_shared servers are found by a file named after their
  tag in tempfile.gettempdir()), which two test runs on one machine would
  otherwise share."""
  return dict(
      os.environ,
      PYTHONPATH=os.pathsep.join([str(sdk), str(PACKAGE_PARENT)]),
      BEAMPQ_TREE=str(sdk),
      TMPDIR=tmp)


def _pytest_runs(
    sdk: Path,
    targets: list[str],
    cache: Path,
    failed: Optional[list[str]],
    env: dict[str, str],
    reasons: Optional[dict[str, str]] = None) -> int:
  common = [
      sys.executable,
      '-m',
      'pytest',
      '-p',
      'beampq.gates.pytest_plugin',
      '--import-mode=importlib',
      '-o',
      'python_classes=',
      '-o',
      'python_functions=',
      '-o',
      'python_files=test_*.py *_test.py *_test_py3*.py *_test_it.py',
      '-o',
      'timeout=600',
      '-o',
      'cache_dir=' + str(cache),
      '-rfEs',
      '--durations=10',
  ]
  # The parallel run creates it when a test it collects is marked
  # no_xdist; otherwise the serial run would collect nothing, at the price
  # of importing the modules again.
  serial_flag = Path(env['TMPDIR']) / 'beampq-no-xdist'
  runs = (('not no_xdist', ['-n', '2', f'--beampq-serial-flag={serial_flag}']),
          ('no_xdist', []))
  codes = []
  for marker, parallel in runs:
    if marker == 'no_xdist' and not serial_flag.exists():
      print('beampq: no test to run is marked no_xdist: no serial run')
      codes.append(5)
      continue
    print(f'beampq: pytest -m "{marker}" in {sdk}', flush=True)
    with subprocess.Popen(common + parallel + ['-m', marker] + targets,
                          cwd=sdk,
                          env=env,
                          stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT,
                          text=True) as run:
      assert run.stdout is not None
      for line in run.stdout:
        print(line, end='', flush=True)
        failure = summary_failure(line)
        if failure and failed is not None:
          failed.append(failure[0])
        if failure and reasons is not None:
          reasons[failure[0]] = failure[1]
    codes.append(run.returncode)
  if all(code == 5 for code in codes):
    print('beampq: no tests were collected')
    return 0
  return next((code for code in codes if code not in (0, 5)), 0)


def module_targets(test_modules: list[str],
                   pytest_args: list[str]) -> list[str]:
  """What pytest runs for the whole modules: pytest_args alone when they
  start with the tests to run (paths, .py files or node ids, before any
  option), else test_modules with pytest_args added, so that `-k Keyed`
  narrows the modules. An option's value, such as --deselect's, names no
  test to run."""
  named = bool(pytest_args) and not pytest_args[0].startswith('-')
  return list(pytest_args) if named else test_modules + list(pytest_args)


def run(ws: Workspace, pytest_args: list[str], series: bool = False) -> int:
  """The test modules the queue touches or adds, or the tests pytest_args
  name (module_targets). With series, only the tests the queue adds or
  changes in those modules (beampq.gates.selection), with pytest_args added
  to pytest's."""
  cache = ws.project.build / 'pytest-cache'
  if not series:
    targets = module_targets(ws.test_modules, pytest_args)
    print(f'beampq: test modules: {" ".join(targets)}')
    return pytest_on(ws.sdk, targets, cache)
  once = run_once_args(ws.sdk, RUN_ONCE)
  print(f'beampq: left to the whole modules\' run: {" ".join(RUN_ONCE)}')
  return _series_on(ws, ws.sdk, ws.test_modules, pytest_args + once, '')


def run_once_args(sdk: Path, prefixes: tuple[str, ...]) -> list[str]:
  """pytest's --deselect options for the node id prefixes, each of which
  must name a test method of the tree at sdk (raises Error otherwise, so
  that a renamed test is not left out unseen)."""
  args = []
  for prefix in prefixes:
    module, class_name, test_prefix = prefix.split('::')
    path = sdk / module
    tree = ast.parse(path.read_text()) if path.is_file() else None
    names = [
        part.name for node in (tree.body if tree else [])
        if isinstance(node, ast.ClassDef) and node.name == class_name
        for part in node.body if isinstance(part, ast.FunctionDef)
    ]
    if not any(name.startswith(test_prefix) for name in names):
      raise Error(f'RUN_ONCE names no test of the tree: {prefix}')
    args += ['--deselect', prefix]
  return args


def _series_on(
    ws: Workspace,
    sdk: Path,
    test_modules: list[str],
    pytest_args: list[str],
    where: str) -> int:
  """Runs in sdk the tests that sdk adds or changes in test_modules against
  the base; where says which tree sdk is, for the messages."""
  chosen = selection.series_tests(ws.base_sdk, sdk, test_modules)
  print(
      f'beampq: {where}the tests the queue adds or changes: '
      f'{selection.count(chosen)}',
      flush=True)
  modules = [module for module, tests in chosen.items() if tests]
  if not modules:
    print('beampq: the queue adds or changes no test: nothing to run')
    return 0
  cache = ws.project.build / 'pytest-cache'
  return pytest_on(sdk, modules + pytest_args, cache, chosen=chosen)


def heads(ws: Workspace, pytest_args: list[str]) -> int:
  """The tests the queue adds or changes up to the head of each pull request
  before the last, run on the tree at that head: each pull request is
  submitted without the ones after it, and must pass there alone (a name
  or an argument that a later pull request adds is missing at its head)."""
  pull_request_heads = ws.pull_request_heads()
  if pull_request_heads is None:
    return 1
  failed = []
  for name, commit in pull_request_heads:
    modified, added = ws.changed_at(commit)
    test_modules = [f for f in modified + added if f.endswith('_test.py')]
    with tempfile.TemporaryDirectory(prefix='beampq-head-') as scratch:
      sdk = ws.sdk_at(commit, None, Path(scratch))
      if _series_on(ws,
                    sdk,
                    test_modules,
                    pytest_args,
                    f'at the head of {name} ({commit[:12]}): '):
        failed.append(name)
  print(
      f'beampq: heads: {len(pull_request_heads)} pull requests tested at '
      f'their heads; ' + (
          f'failing at the head of: {", ".join(failed)}'
          if failed else 'all pass'))
  return 1 if failed else 0


def regression_modules(sdk: Path) -> list[str]:
  """The test modules of REGRESSION_FOLDERS, plus the tests of every module
  (examples aside) that uses BatchElements."""
  modules = {
      str(path.relative_to(sdk))
      for folder in REGRESSION_FOLDERS
      for path in (sdk / folder).rglob('*_test.py')
  }
  for path in (sdk / 'apache_beam').rglob('*.py'):
    if 'examples' in path.parts or path.name.endswith('_test.py'):
      continue
    module_test = path.with_name(path.stem + '_test.py')
    if module_test.exists() and 'BatchElements' in path.read_text(
        errors='replace'):
      modules.add(str(module_test.relative_to(sdk)))
  return sorted(modules)


def summary_failure(line: str) -> Optional[tuple[str, str]]:
  """(test id, reason) of a FAILED or ERROR line of pytest's short summary
  (-rfE), or None for any other line."""
  match = re.match(r'^(?:FAILED|ERROR) (\S+)(?: - (.*))?', line)
  if match is None:
    return None
  return match.group(1), (match.group(2) or '').strip()


def _error_type(reason: Optional[str]) -> Optional[str]:
  """The exception a pytest summary reason names ('ValueError: ...' ->
  'ValueError'), or None when it names none."""
  match = re.match(
      r'([\w.]+(?:Error|Exception|Exit|Failed|Interrupt))\b', reason or '')
  return match.group(1) if match else None


def classify_failures(
    failed: list[str],
    failed_again: list[str],
    failed_before: list[str],
    reasons: Optional[dict[str, str]] = None,
    reasons_before: Optional[dict[str, str]] = None) -> dict[str, list[str]]:
  """Sorts the tests that failed on the patched tree by what their reruns
  did: failed on the base too, passed on a rerun, or neither. A test that
  fails on the base with another exception than on the patched tree (by
  reasons and reasons_before, each test's summary reason) is NEW: it fails
  for a reason of the patch's."""
  reasons, reasons_before = reasons or {}, reasons_before or {}

  def same_failure(test):
    return test in failed_before and _error_type(
        reasons.get(test)) == _error_type(reasons_before.get(test))

  return {
      'also fails on the base': [t for t in failed if same_failure(t)],
      'flaky: passed when rerun': [
          t for t in failed if t not in failed_before and t not in failed_again
      ],
      'NEW': [
          t for t in failed if (t in failed_before and not same_failure(t)) or
          (t not in failed_before and t in failed_again)
      ],
  }


def regression(ws: Workspace, pytest_args: list[str]) -> int:
  """Runs the wider suites on the patched tree; failures that also occur on
  the base are listed as such, and only new ones fail the run."""
  cache = ws.project.build / 'pytest-cache'
  targets = pytest_args or regression_modules(ws.sdk)
  print(f'beampq: regression: {len(targets)} test modules: {" ".join(targets)}')
  started = time.monotonic()
  failed: list[str] = []
  reasons: dict[str, str] = {}
  code = pytest_on(ws.sdk, targets, cache, failed, reasons=reasons)
  if code not in (0, 1):
    raise Error(f'pytest exited with {code} on the patched tree')
  files = sorted({name.split('::')[0] for name in failed})
  failed_again: list[str] = []
  failed_before: list[str] = []
  reasons_before: dict[str, str] = {}
  if files:
    print(
        f'beampq: rerunning the {len(files)} files with failures on the '
        'patched tree and on the base',
        flush=True)
    pytest_on(ws.sdk, files, cache, failed_again)
    base_sdk = ws.base_sdk
    pytest_on(
        base_sdk, [f for f in files if (base_sdk / f).is_file()],
        cache,
        failed_before,
        reasons=reasons_before)
  verdicts = classify_failures(
      failed, failed_again, failed_before, reasons, reasons_before)
  minutes = (time.monotonic() - started) / 60
  print(
      f'beampq: regression: {len(targets)} modules in {minutes:.1f} min; '
      f'{len(failed)} failures on the patched tree: ' + ', '.join(
          f'{len(tests)} {verdict}' for verdict, tests in verdicts.items()))
  for verdict, tests in verdicts.items():
    for name in tests:
      print(f'  {verdict}: {name}')
  return 1 if verdicts['NEW'] else 0
