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

"""Phases C and D: what keyed batching costs the runner, and what the key
functions cost.

C times BatchElements on the FnApiRunner, in two worker processes
(bench.overhead_worker): one imports pristine 2.77.0 (build/base), whose
stateful BatchElements is the denominator of every ratio, and one the
patched tree (build/beam). The workers take the runs of each repetition in
turn, one at a time, in an order that rotates from one repetition to the
next, and each run is a fork of its worker, so both trees are timed alike
and the patch set's changes to the unkeyed path cannot move the ratios.
Each ratio is taken repetition by repetition (a run over the same
repetition's denominator) and reported as the median with its 10th-90th
percentile and min-max.

Two blocks of runs (RUNS), min_batch_size=1 and max_batch_size=64, the
elements interleaved over the keys:

* 10,000 keys, 16 elements each (benchmark v3's block of 10,000 keys);
* 30,000 keys, 4 elements each;

REPETITIONS times each, with 2.77.0's stateful path (one shared key, 1 s
buffering), keyed with one shard per key, and keyed with
PrefixBatchingConfig()'s num_shards (read from the tree).

D times the key functions in this process.
"""

import json
import os
import statistics
import subprocess
import sys
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_ADAPTIVE = {'min_batch_size': 1, 'max_batch_size': 64}
# The unkeyed stateful path buffers for up to 1 s, as keyed batching does by
# default.
_STATEFUL = {'max_batch_duration_secs': 1}
# keys -> elements per key, full and quick.
BLOCKS = {10_000: 16, 30_000: 4}
QUICK_BLOCKS = {1_200: 4, 3_000: 1}
REPETITIONS = {10_000: 5, 30_000: 5}
QUICK_REPETITIONS = 1


def runs(quick: bool) -> dict[str, dict]:
  """Every run: the tree it runs on, BatchElements' arguments, whether it
  is keyed by prefix, the keys, the elements, its block and repetitions.
  Runs are named by the full run's key counts."""
  out = {}
  chosen = QUICK_BLOCKS if quick else BLOCKS
  for name, keys in zip(BLOCKS, chosen):
    elements = keys * chosen[keys]
    repetitions = QUICK_REPETITIONS if quick else REPETITIONS[name]
    common = {
        'keys': keys,
        'elements': elements,
        'block': name,
        'repetitions': repetitions
    }
    out[f'stateful_{name}'] = {
        'tree': 'base', 'batch': {
            **_ADAPTIVE, **_STATEFUL
        }, **common
    }
    out[f'keyed_{name}'] = {
        'tree': 'patched',
        'batch': {
            **_ADAPTIVE, 'num_shards': 1
        },
        'keyed': True,
        **common
    }
    out[f'default_{name}'] = {
        'tree': 'patched',
        'batch': {
            **_ADAPTIVE, 'num_shards': 'default'
        },
        'keyed': True,
        **common
    }
  return out


# The ratios reported: name -> (numerator run, denominator run, measure).
RATIOS = {
    f'{arm}_{keys}_{measure_name}': (
        f'{arm}_{keys}', f'stateful_{keys}', measure)
    for keys in BLOCKS
    for arm in ('keyed', 'default')
    for measure_name, measure in (('over_stateful', 'seconds'),
                                  ('mean_batch_over_stateful', 'mean_batch'))
}


def schedule(names: list[str], repetitions: int) -> list[tuple[int, str]]:
  """(repetition, run) in the order they run: every run once per
  repetition, the order rotated by one each repetition so that no run is
  always first or always follows the same one."""
  return [(r, names[(r + i) % len(names)]) for r in range(repetitions)
          for i in range(len(names))]


def percentile(values: list[float], q: float) -> float:
  """The q-th percentile (0-100) of values, linearly interpolated."""
  ordered = sorted(values)
  if not ordered:
    raise ValueError('percentile of no values')
  position = (len(ordered) - 1) * q / 100
  low = int(position)
  high = min(low + 1, len(ordered) - 1)
  return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(numerators: list[float], denominators: list[float]) -> dict:
  """Per-repetition ratios of two runs and their median, 10th and 90th
  percentiles, min and max."""
  if len(numerators) != len(denominators) or not numerators:
    raise ValueError(
        f'{len(numerators)} numerators for {len(denominators)} denominators')
  ratios = [a / b for a, b in zip(numerators, denominators)]
  return {
      'median': statistics.median(ratios),
      'p10': percentile(ratios, 10),
      'p90': percentile(ratios, 90),
      'min': min(ratios),
      'max': max(ratios),
      'per_repetition': ratios,
  }


def measures(result: dict, state_keys) -> dict:
  """A run's figures: seconds, mean batch and state-cache weighings per
  state key (None where the number of state keys is not known)."""
  return {
      'seconds': result['seconds'],
      'mean_batch': result['elements'] / result['batches'],
      'batches': result['batches'],
      'weighings_per_state_key': (
          result['weighings'] / state_keys if state_keys else None),
  }


def state_keys(run: dict, default_num_shards):
  """How many state keys a run has: one shared key unkeyed, prefixes times
  shards keyed (None for a num_shards policy)."""
  if not run.get('keyed'):
    return 1
  shards = run['batch'].get('num_shards', 1)
  if shards == 'default':
    shards = default_num_shards
  return run['keys'] * shards if isinstance(shards, int) else None


def figures(
    plan: dict,
    measured: dict[str, list[dict]],
    repetitions: int,
    default_num_shards) -> tuple[dict, dict]:
  """results.json's `overhead` (each ratio's median) and `overhead_runs`
  (the runs, their figures repetition by repetition, each ratio's
  interval), from what every run measured."""
  ratios = {
      name: summarize([m[measure]
                       for m in measured[a]], [m[measure] for m in measured[b]])
      for name, (a, b, measure) in RATIOS.items()
  }
  overhead = {name: ratio['median'] for name, ratio in ratios.items()}
  return overhead, {
      'repetitions': repetitions,
      'default_num_shards': repr(default_num_shards),
      'runs': {
          name: {
              **plan[name],
              'state_keys': state_keys(plan[name], default_num_shards),
              'median_s': statistics.median(
                  m['seconds'] for m in measured[name]),
              'measured': measured[name],
          }
          for name in plan
      },
      'ratios': ratios,
  }


RUN_WORKER = (
    'import sys; from bench import overhead_worker as w; sys.exit(w.main())')


class Worker:
  """A bench.overhead_worker process on one tree."""
  def __init__(self, sdk: Path):
    self.sdk = sdk.resolve()
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(self.sdk), str(ROOT)]))
    self.process = subprocess.Popen([sys.executable, '-c', RUN_WORKER],
                                    cwd=ROOT,
                                    env=env,
                                    stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE,
                                    text=True)
    imported = Path(self._read()['apache_beam']).resolve()
    if self.sdk not in imported.parents:
      self.close()
      raise RuntimeError(f'the worker for {self.sdk} imported {imported}')

  def _read(self) -> dict:
    assert self.process.stdout is not None
    for line in self.process.stdout:
      if line.startswith('{'):
        return json.loads(line)
    raise RuntimeError(f'the worker for {self.sdk} exited')

  def run(self, run: dict) -> dict:
    assert self.process.stdin is not None
    self.process.stdin.write(json.dumps(run) + '\n')
    self.process.stdin.flush()
    result = self._read()
    if 'error' in result:
      raise RuntimeError(f'{run}: {result["error"]}')
    return result

  def close(self):
    if self.process.stdin:
      self.process.stdin.close()
    self.process.wait(timeout=60)


def overhead(
    quick: bool,
    progress,
    base_sdk: Path,
    patched_sdk: Path,
    default_num_shards) -> tuple[dict, dict]:
  plan = runs(quick)
  measured: dict[str, list[dict]] = {name: [] for name in plan}
  workers = {'base': Worker(base_sdk), 'patched': Worker(patched_sdk)}
  order = []
  for block in BLOCKS:
    names = [name for name, run in plan.items() if run['block'] == block]
    order += schedule(names, plan[names[0]]['repetitions'])
  repetitions = {
      block: run['repetitions']
      for run in plan.values()
      for block in [run['block']]
  }
  try:
    for r, name in order:
      run = plan[name]
      progress(
          f'C: repetition {r + 1}/{run["repetitions"]}, {name} on the '
          f'{run["tree"]} tree, {run["elements"]} elements')
      result = workers[run['tree']].run(run)
      measured[name].append(
          measures(result, state_keys(run, default_num_shards)))
  finally:
    for worker in workers.values():
      worker.close()
  overhead_figures, runs_ = figures(plan, measured, repetitions,
                                    default_num_shards)
  runs_['order'] = [name for _, name in order]
  return overhead_figures, runs_


def _per_call(fn, argument, number) -> float:
  timings = timeit.repeat(lambda: fn(argument), number=number, repeat=7)
  return statistics.median(timings) / number


def key_cost(quick: bool, progress) -> tuple[dict, dict]:
  from apache_beam.ml.inference.prefix_batching import ChatPrefixKeyFn
  from apache_beam.ml.inference.prefix_batching import PromptPrefixKeyFn
  progress('D: key functions')
  number = 2_000 if quick else 20_000
  head = 'You answer questions about Apache Beam. ' * 5
  small = (head + 'x' * 1024)[:1024]
  huge = head + 'x' * (8 << 20)
  chat = [
      {
          'role': 'system', 'content': head + 'Be brief.'
      },
      {
          'role': 'user', 'content': 'What is a PCollection?'
      },
  ]
  prompt_key = PromptPrefixKeyFn()
  seconds = {
      'prompt_1kb': _per_call(prompt_key, small, number),
      'prompt_8mb': _per_call(prompt_key, huge, number),
      'chat': _per_call(ChatPrefixKeyFn(), chat, number),
  }
  return {
      'prompt_8mb_over_1kb': seconds['prompt_8mb'] / seconds['prompt_1kb']
  }, {
      'per_call_us': {
          name: s * 1e6
          for name, s in seconds.items()
      }
  }


def _trees() -> tuple[Path, Path]:
  """build/base (extracted from build/beam's base when missing) and the
  patched tree's sdk folders."""
  from beampq.gates.workspace import Workspace
  from beampq.project import Project
  ws = Workspace.open(Project(ROOT))
  return ws.base_sdk, ws.sdk


def main(argv=None) -> int:
  """Runs C and D in a process of their own, so that what the rest of the
  benchmark loaded does not weigh on the state cache; writes them as JSON."""
  import argparse
  parser = argparse.ArgumentParser(prog='python -m bench.overhead')
  parser.add_argument('--quick', action='store_true')
  parser.add_argument('--out', required=True)
  args = parser.parse_args(argv)

  def progress(message):
    print(f'[bench.overhead] {message}', flush=True)

  from apache_beam.ml.inference.prefix_batching import PrefixBatchingConfig
  base_sdk, patched_sdk = _trees()
  results = {}
  results['overhead'], results['overhead_runs'] = overhead(
      args.quick, progress, base_sdk, patched_sdk,
      PrefixBatchingConfig().num_shards)
  results['key_cost'], results['key_cost_runs'] = key_cost(args.quick, progress)
  with open(args.out, 'w') as f:
    json.dump(results, f)
  return 0


if __name__ == '__main__':
  sys.exit(main())
