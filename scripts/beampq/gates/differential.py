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

"""The `differential` gate: unkeyed BatchElements on the base and on the
patched tree, side by side.

Users who never set key_fn must get what the base release gives them. This
gate runs one matrix of unkeyed BatchElements pipelines (CASES: the
stateless and the stateful path, fixed and adaptive sizes, interleaved
windows, length buckets, element_size_fn, on the FnApiRunner, the
BundleBasedDirectRunner and the streaming DirectRunner) in two processes,
one importing build/base's apache_beam and one build/beam's
(differential_pipelines.py), and compares what BatchElements emitted: every
batch's elements, size, window and timestamp, window by window in emission
order (where the base's own runs do not fix an order, as a multiset: see
END_RACE_RUNNERS), and the state and timer specs of its stateful DoFn. The
only cases allowed to differ are those of DOCUMENTED, each a change
CHANGES.md names, in their batches only and as far as that change goes;
they must differ. Whatever a
case's verdict, each tree must emit every input element once, and the
patched tree no empty batch (INCOMPLETE otherwise).

The pure parts (the matrix, the comparison, the report) are here; the
pipelines are in differential_pipelines.py.
"""

import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterable
from typing import Optional
from typing import Sequence

from beampq import Error
from beampq.gates import suite
from beampq.gates.workspace import Workspace

SEED = 17
WINDOW_SECS = 10
# The model after BatchElements takes this long per batch and per element (on
# the fake clock): the estimator's overhead target puts batches near 38.
MODEL_FIXED_SECS = 0.1
MODEL_PER_ELEMENT_SECS = 0.05
ELEMENTS = 120
# Elements arrive in bursts of these sizes (cycled), this far apart.
BURST_SIZES = (1, 3, 8, 2, 13, 5)
BURST_GAP_SECS = 5.0
# After the last burst, the streaming runner's processing time moves on by
# this much before the watermark goes to infinity.
FINAL_PROCESSING_ADVANCE_SECS = 100.0

RUNNERS = ('FnApiRunner', 'BundleBasedDirectRunner', 'DirectRunner-streaming')
# Where the fake clock starts. The streaming DirectRunner's processing time
# starts at 0 and follows the TestStream, so buffering timers fire as the
# bursts arrive. The batch runners' processing time is the real clock, which
# a clock from 0 is always past: every buffering timer would be due as soon
# as it is set, at bundle ends the runner picks. So there the clock starts
# far beyond the real clock (in 2096) and buffering timers never come due
# while elements arrive (for what the FnApiRunner does when its input ends,
# see END_RACE_RUNNERS).
CLOCK_START = {
    'FnApiRunner': 4e9,
    'BundleBasedDirectRunner': 4e9,
    'DirectRunner-streaming': 0.0,
}
# The FnApiRunner runs the end-of-window timer and the buffering timers it
# drains when its input ends in no fixed order, on the base too: what the
# stateful path still buffers then comes out stamped with the window's end or
# with the buffering timer's time, in either order. There those batches are
# compared as a multiset, stamped only "flushed at the end"; every other
# batch is compared in order, timestamp included.
END_RACE_RUNNERS = ('FnApiRunner', )

_ADAPTIVE = {'min_batch_size': 1, 'max_batch_size': 64}
_FIXED = {'min_batch_size': 5, 'max_batch_size': 5}
_BUFFERED = {'max_batch_duration_secs': 1000}
# Per configuration: the windows the elements fall in (1: the global window;
# 3: interleaved FixedWindows(WINDOW_SECS)) and BatchElements' arguments;
# element_size_fn and length_fn are flags for the pipelines' own functions
# (element sizes 1 to 4; the payload's length).
CONFIGS = {
    'stateless-global-fixed': {
        'windows': 1, 'batch': _FIXED
    },
    'stateless-global-adaptive': {
        'windows': 1, 'batch': _ADAPTIVE
    },
    'stateless-windows-adaptive': {
        'windows': 3, 'batch': _ADAPTIVE
    },
    'stateless-global-sized': {
        # min_batch_size 4 keeps every element (size 1 to 4) within the
        # target.
        'windows': 1,
        'batch': {
            'min_batch_size': 4, 'max_batch_size': 64, 'element_size_fn': True
        }
    },
    'stateless-windows-sized': {
        'windows': 3,
        'batch': {
            'min_batch_size': 4, 'max_batch_size': 64, 'element_size_fn': True
        }
    },
    'stateless-global-oversized': {
        # The first target (1) is smaller than most elements.
        'windows': 1,
        'batch': {
            **_ADAPTIVE, 'element_size_fn': True
        }
    },
    'stateful-global-fixed': {
        'windows': 1, 'batch': {
            **_FIXED, **_BUFFERED
        }
    },
    'stateful-global-adaptive': {
        'windows': 1, 'batch': {
            **_ADAPTIVE, **_BUFFERED
        }
    },
    'stateful-windows-adaptive': {
        'windows': 3, 'batch': {
            **_ADAPTIVE, **_BUFFERED
        }
    },
    'stateful-global-buckets': {
        'windows': 1,
        'batch': {
            **_ADAPTIVE,
            **_BUFFERED,
            'length_fn': True,
            'bucket_boundaries': [16]
        }
    },
    'stateful-windows-buckets': {
        'windows': 3,
        'batch': {
            **_ADAPTIVE,
            **_BUFFERED,
            'length_fn': True,
            'bucket_boundaries': [16]
        }
    },
    'stateful-global-timers': {
        # Buffering shorter than the gap between bursts: on the streaming
        # runner the buffering timer flushes each burst's remainder.
        'windows': 1,
        'batch': {
            **_ADAPTIVE, 'max_batch_duration_secs': 2
        }
    },
    'stateful-windows-timers': {
        'windows': 3,
        'batch': {
            'min_batch_size': 8,
            'max_batch_size': 8,
            'max_batch_duration_secs': 2
        }
    },
    'stateful-global-sized': {
        'windows': 1,
        'batch': {
            'min_batch_size': 8,
            'max_batch_size': 8,
            'element_size_fn': True,
            **_BUFFERED
        }
    },
}


def element_size(payload: str) -> int:
  """The cases' non-unit element_size_fn: 1 to 4."""
  return 1 + len(payload) % 4


def _in_base_order(old: dict, new: dict) -> list[str]:
  """Problems unless each window's patched batches hold the base's elements
  in the base's order (old, new: canonical results): in the order batches
  come, the shorter of the two runs of elements starts the longer (the
  rest are flushed at the end, in no order). Batch sizes may differ."""
  problems = []
  for w in sorted(set(old) | set(new)):
    runs = [[
        e for batch in side.get(w, ([], []))[0] for e in batch['elements']
    ] for side in (old, new)]
    shorter = min(len(run) for run in runs)
    if runs[0][:shorter] != runs[1][:shorter]:
      problems.append(f'{w}: the patched batches reorder the base\'s elements')
  return problems


def _recut_by_size(old: dict, new: dict) -> list[str]:
  """Problems unless the patched batches hold the base's elements in its
  order (_in_base_order), and none weighs more than the case's
  max_batch_size in element_size but an element alone."""
  limit = CONFIGS['stateful-global-sized']['batch']['max_batch_size']
  problems = _in_base_order(old, new)
  for w, (in_order, at_end) in sorted(new.items()):
    for batch in in_order + at_end:
      weight = sum(map(element_size, batch['elements']))
      if weight > limit and len(batch['elements']) > 1:
        problems.append(
            f'{w}: a patched batch of {len(batch["elements"])} elements '
            f'weighs {weight}, over {limit}')
        break
  return problems


# The configurations whose output may differ: the documented change that
# makes it differ, and a check that the batches differ only by that change
# (returning the problems, on the canonical results).
DOCUMENTED = {
    'stateful-global-sized': (
        'patch 0001 (CHANGES.md, Breaking Changes): the stateful path honors '
        'element_size_fn',
        _recut_by_size),
    'stateless-global-oversized': (
        'patch 0001 (CHANGES.md, Bugfixes): no empty batch ahead of an '
        'element larger than the target size',
        _in_base_order),
}


def elements() -> list[tuple[float, float, str]]:
  """The input of every case: (arrival, timestamp, payload). Element i falls
  in window i % 3 (interleaved), and its payload is 3 to 31 characters."""
  out = []
  burst, left = 0, BURST_SIZES[0]
  for i in range(ELEMENTS):
    if not left:
      burst += 1
      left = BURST_SIZES[burst % len(BURST_SIZES)]
    left -= 1
    timestamp = (i % 3) * WINDOW_SECS + (i // 3) * 0.2
    out.append(
        (burst * BURST_GAP_SECS, timestamp, f'{i:03d}' + 'x' * (i * 7 % 29)))
  return out


def bursts(items) -> list[tuple[float, list]]:
  """The elements grouped by arrival, in order."""
  grouped: list[tuple[float, list]] = []
  for item in items:
    if grouped and grouped[-1][0] == item[0]:
      grouped[-1][1].append(item)
    else:
      grouped.append((item[0], [item]))
  return grouped


def cases(select: Optional[str] = None) -> list[dict]:
  """Every configuration on every runner, named config/runner; select keeps
  those whose name contains it."""
  return [{
      'name': f'{config}/{runner}', 'config': config, 'runner': runner
  } for config in CONFIGS for runner in RUNNERS
          if not select or select in f'{config}/{runner}']


def _key(batch) -> str:
  return json.dumps(batch, sort_keys=True)


def _window_name(w) -> str:
  if w == 'global':
    return 'global'
  return f'[{w[0] / 1e6:g}, {w[1] / 1e6:g})'


def canonical(batches: list[dict], clock_start: float,
              end_race: bool) -> dict[str, tuple[list[dict], list[dict]]]:
  """Per window: the batches to compare in order, and those to compare as a
  multiset. Batches of different windows are not ordered against each other
  (runners fire different windows' timers in orders of their own). With
  end_race, the batches flushed when the input ended (stamped at or past
  their window's last timestamp, or at or past clock_start, where the
  buffering timers' times are) go to the multiset, their timestamps replaced
  by 'end'."""
  out: dict[str, tuple[list[dict], list[dict]]] = {}
  for batch in batches:
    in_order, at_end = out.setdefault(_window_name(batch['window']), ([], []))
    timestamp = batch['timestamp']
    if end_race and (timestamp >= batch['window_max_timestamp'] or
                     timestamp >= clock_start * 1e6):
      at_end.append(dict(batch, timestamp='end'))
    else:
      in_order.append(batch)
  for _, at_end in out.values():
    at_end.sort(key=_key)
  return out


def _describe(batch) -> str:
  items = batch['elements']
  shown = ', '.join(repr(e) for e in items[:4])
  if len(items) > 4:
    shown += f', ... ({len(items)} elements)'
  timestamp = batch['timestamp']
  if timestamp != 'end':
    timestamp = f'{timestamp / 1e6:g}'
  return f'timestamp {timestamp}, [{shown}]'


def _first_difference(label: str, old: list, new: list) -> list[str]:
  if old == new:
    return []
  index = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b),
               min(len(old), len(new)))
  lines = [f'    first difference {label}, batch {index}:']
  for side, batches in (('base:   ', old), ('patched:', new)):
    shown = _describe(batches[index]) if index < len(batches) else '(none)'
    lines.append(f'      {side} {shown}')
  return lines


def _spec_lines(base: list, patched: list) -> list[str]:
  """What differs between two lists of stateful DoFns' specs."""
  if base == patched:
    return []
  lines = ['state and timer specs differ:']
  if len(base) != len(patched):
    return lines + [
        f'  {len(base)} stateful DoFns on the base, {len(patched)} patched'
    ]
  for old, new in zip(base, patched):
    for kind in ('states', 'timers'):
      for name in sorted(set(old[kind]) | set(new[kind])):
        was, now = old[kind].get(name), new[kind].get(name)
        if was != now:
          lines.append(
              f'  {kind[:-1]} {name!r}: base {json.dumps(was)}, '
              f'patched {json.dumps(now)}')
  return lines


def compare(
    base: dict,
    patched: dict,
    clock_start: float = 0.0,
    end_race: bool = False) -> list[str]:
  """The differences between two results of one case, as report lines;
  empty when they agree."""
  for label, result in (('base', base), ('patched', patched)):
    if 'error' in result:
      return [f'the {label} tree failed:'] + [
          '    ' + line for line in result['error'].rstrip().splitlines()[-8:]
      ]
  lines = []
  old = canonical(base['batches'], clock_start, end_race)
  new = canonical(patched['batches'], clock_start, end_race)
  if old != new:
    lines.append(
        f'batches differ ({len(base["batches"])} on the base, '
        f'{len(patched["batches"])} patched); sizes per window, in emission '
        'order:')
    for w in sorted(set(old) | set(new)):
      old_in_order, old_at_end = old.get(w, ([], []))
      new_in_order, new_at_end = new.get(w, ([], []))
      lines += [
          f'  {w}',
          f'    base:    {[len(b["elements"]) for b in old_in_order]}' + (
              f' + at the end {[len(b["elements"]) for b in old_at_end]}'
              if old_at_end else ''),
          f'    patched: {[len(b["elements"]) for b in new_in_order]}' + (
              f' + at the end {[len(b["elements"]) for b in new_at_end]}'
              if new_at_end else ''),
      ]
      lines += _first_difference('in order', old_in_order, new_in_order)
      lines += _first_difference(
          'among those flushed at the end', old_at_end, new_at_end)
  return lines + _spec_lines(base['specs'], patched['specs'])


def incomplete(
    result: dict, expected: Sequence[str], label: str,
    empty_ok: bool) -> list[str]:
  """Report lines on what a tree's batches lost, duplicated or left empty
  against the input (expected: its payloads); empty when each payload comes
  out once, and, unless empty_ok, no batch is empty."""
  emitted = collections.Counter(
      e for batch in result['batches'] for e in batch['elements'])
  wanted = collections.Counter(expected)
  lost = sorted((wanted - emitted).elements())
  extra = sorted((emitted - wanted).elements())
  lines = []
  if lost:
    lines.append(f'the {label} tree lost {len(lost)} elements: {lost[:4]}')
  if extra:
    lines.append(
        f'the {label} tree emitted {len(extra)} elements too many: '
        f'{extra[:4]}')
  empty = sum(1 for batch in result['batches'] if not batch['elements'])
  if empty and not empty_ok:
    lines.append(f'the {label} tree emitted {empty} empty batches')
  return lines


def verdicts(
    base: dict,
    patched: dict,
    expected: Optional[Sequence[str]] = None
) -> list[tuple[str, str, list[str]]]:
  """(case, verdict, report lines) for every case of either run. A verdict
  is 'same'; 'DIFFERS'; 'documented' (differs, as DOCUMENTED allows, in its
  batches only: not in what it emits, nor in its state and timer specs);
  'UNDOCUMENTED-SAME' (a DOCUMENTED case that no longer differs, so the
  exception has to go); 'INCOMPLETE' (with expected, the input's payloads:
  a tree lost or duplicated elements, or the patched one emitted an empty
  batch, which the base may); 'ERROR' (a tree failed to run it) or
  'MISSING'."""
  out = []
  for name in sorted(set(base) | set(patched)):
    config, _, runner = name.partition('/')
    if name not in base or name not in patched:
      side = 'base' if name not in base else 'patched'
      out.append((name, 'MISSING', [f'no result from the {side} tree']))
      continue
    stateful = 'max_batch_duration_secs' in CONFIGS[config]['batch']
    lines = compare(
        base[name],
        patched[name],
        CLOCK_START[runner],
        stateful and runner in END_RACE_RUNNERS)
    errors = any('error' in result for result in (base[name], patched[name]))
    lost = [] if errors or expected is None else (
        incomplete(base[name], expected, 'base', empty_ok=True) +
        incomplete(patched[name], expected, 'patched', empty_ok=False))
    specs = [] if errors else _spec_lines(
        base[name]['specs'], patched[name]['specs'])
    if errors:
      verdict = 'ERROR'
    elif lost:
      verdict = 'INCOMPLETE'
      lines = lost + lines
    elif config not in DOCUMENTED:
      verdict = 'DIFFERS' if lines else 'same'
    else:
      change, check = DOCUMENTED[config]
      end_race = stateful and runner in END_RACE_RUNNERS
      beyond = lines and check(
          canonical(base[name]['batches'], CLOCK_START[runner], end_race),
          canonical(patched[name]['batches'], CLOCK_START[runner], end_race))
      if specs:
        verdict = 'DIFFERS'
        lines = [
            f'documented to differ in its batches ({change}), not in its '
            'state and timer specs'
        ] + lines
      elif lines and beyond:
        verdict = 'DIFFERS'
        lines = [f'documented to differ ({change}), but also:'
                 ] + [f'  {problem}' for problem in beyond] + lines
      elif lines:
        verdict = 'documented'
        lines = [f'allowed: {change}'] + lines
      else:
        verdict = 'UNDOCUMENTED-SAME'
        lines = [
            f'documented to differ ({change}) but identical: drop it from '
            'DOCUMENTED'
        ]
    out.append((name, verdict, lines))
  return out


def report(results: Iterable[tuple[str, str, list[str]]]) -> tuple[str, bool]:
  """The printed report, and whether the gate passes."""
  results = list(results)
  lines = []
  counts: collections.Counter = collections.Counter()
  for name, verdict, details in results:
    counts[verdict] += 1
    lines.append(f'{verdict:>10}  {name}')
    lines += ['            ' + line for line in details]
  passed = set(counts) <= {'same', 'documented'}
  summary = ', '.join(f'{n} {verdict}' for verdict, n in sorted(counts.items()))
  lines.append(
      f'differential: {len(results)} cases: {summary}: ' + (
          'the patched tree emits what the base emits'
          if passed else 'FAILED: the patched tree differs from the base'))
  return '\n'.join(lines), passed


# The pipelines run as `python -c`, not `-m`: see differential_pipelines.
_RUN = (
    'import sys; from beampq.gates import differential_pipelines as p; '
    'sys.exit(p.main(sys.argv[1:]))')


def run_trees(base_sdk: Path,
              sdk: Path,
              select: Optional[str] = None) -> tuple[dict, dict]:
  """Runs the pipelines on both trees at once (a process each); returns each
  one's results by case."""
  trees = {'base': base_sdk.resolve(), 'patched': sdk.resolve()}
  results = {}
  with tempfile.TemporaryDirectory(prefix='beampq-differential-') as name:
    tmp = Path(name)
    processes = {}
    for label, tree in trees.items():
      env = suite.beam_test_env(tree, name)
      # The FnApiRunner orders keys by their hash.
      env['PYTHONHASHSEED'] = '0'
      args = [sys.executable, '-c', _RUN, '--out', str(tmp / f'{label}.json')]
      with open(tmp / f'{label}.log', 'w') as log:
        processes[label] = subprocess.Popen(
            args + (['-k', select] if select else []),
            cwd=tmp,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT)
    for label, process in processes.items():
      code = process.wait()
      out = tmp / f'{label}.json'
      if code != 0 or not out.is_file():
        tail = (tmp / f'{label}.log').read_text(errors='replace')[-3000:]
        raise Error(
            f'the differential pipelines failed on the {label} tree '
            f'({trees[label]}), exit code {code}:\n{tail}')
      result = json.loads(out.read_text())
      imported = Path(result['apache_beam']).resolve()
      if trees[label] not in imported.parents:
        raise Error(
            f'the {label} run imported {imported}, not the tree at '
            f'{trees[label]}')
      print(f'beampq: differential: {label}: {imported}', flush=True)
      results[label] = result['cases']
  return results['base'], results['patched']


def run(ws: Workspace, select: Optional[str] = None) -> int:
  """The gate: runs the cases (those whose name contains select) on the
  base and the patched tree, prints the report; 1 when it fails."""
  if not cases(select):
    raise Error(f'differential: -k {select!r} matches no case')
  started = time.monotonic()
  base, patched = run_trees(ws.base_sdk, ws.sdk, select)
  text, passed = report(
      verdicts(base, patched, [payload for _, _, payload in elements()]))
  print(text)
  print(
      f'differential: {time.monotonic() - started:.0f} s; slowest: ' +
      ', '.join(
          f'{label} {case} {seconds:.1f} s'
          for seconds, label, case in slowest(base, patched)),
      flush=True)
  return 0 if passed else 1


def slowest(base: dict, patched: dict, count: int = 3):
  """The count slowest cases of both runs: (seconds, tree, case)."""
  return sorted(((result.get('seconds', 0.0), label, case)
                 for label, results in (('base', base), ('patched', patched))
                 for case, result in results.items()),
                reverse=True)[:count]
