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

"""The report's sections on phases other than A: validation, C, D and E
(report.md, from results.json alone)."""

import statistics


def _f(value, digits=3):
  if value is None:
    return ''
  if isinstance(value, float):
    return f'{value:.{digits}f}'
  return str(value)


def _table(header, rows):
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  lines += ['| ' + ' | '.join(_f(c) for c in row) + ' |' for row in rows]
  return lines


def _validation(results):
  if 'validation' not in results:
    return []
  v = results['validation']
  w = v['workload']
  lines = [
      '## Validation: the real transforms against the simulator',
      '',
      f'`BatchElements` from the patched tree on the {v["runner"]}, fed by a '
      f'TestStream at {v["rate_per_worker"]} requests/s per worker '
      f'({w["requests"]} requests, {w["prefixes"]} keys, Zipf '
      f'{w["zipf_s"]}, {w["workers"]} workers, batches of '
      f'{w["batch_size"]}, buffering {v["buffering_s"]} s, seed '
      f'{v["seed"]}); one SDK process reads every request. The simulator '
      'models each policy\'s lifecycle on this runner (a DoFn instance per '
      'bundle, a bundle per element). "exact": the simulator formed the '
      'same batches.',
      '',
  ]
  rows = [[
      name,
      r['num_shards'],
      r['requests'],
      r['batches_real'],
      r['batches_simulated'],
      r['batches_full'],
      r['batches_by_timer'],
      r['matching_batches'],
      'yes' if r['exact'] else 'NO'
  ] for name, r in v['runs'].items()]
  return lines + _table([
      'strategy',
      'num_shards',
      'requests',
      'real batches',
      'simulated',
      'full',
      'by timer',
      'matching',
      'exact'
  ],
                        rows) + ['']


def _describe_run(run, default_num_shards) -> str:
  batch = run['batch']
  if run.get('keyed'):
    shards = batch.get('num_shards', 1)
    if shards == 'default':
      shards = f'the default {default_num_shards}'
    how = f'keyed, {run["keys"]} keys x {shards} shards'
  else:
    how = f'unkeyed stateful, {run["keys"]} keys'
  return (f'{how}, batches {batch["min_batch_size"]}-{batch["max_batch_size"]}')


def _overhead(results):
  if 'overhead' not in results:
    return []
  over, runs = results['overhead'], results['overhead_runs']
  lines = [
      '## C. Overhead',
      '',
      'BatchElements on the FnApiRunner, in two worker processes that take '
      'the runs of each repetition in turn: one imports pristine 2.77.0 '
      '(`build/base`), one the patched tree. Every ratio is over the run of '
      '2.77.0\'s stateful path (one shared key) on the same elements in the '
      'same repetition, taken repetition by repetition, the order of the '
      'runs rotating from one repetition to the next. Default num_shards: '
      f'`{runs["default_num_shards"]}`.',
      '',
  ]
  rows = []
  for name, run in runs['runs'].items():
    measured = run['measured']
    rows.append([
        name,
        run['tree'],
        _describe_run(run, runs['default_num_shards']),
        str(run['elements']),
        str(len(measured)),
        f'{run["median_s"]:.2f}',
        f'{min(m["seconds"] for m in measured):.2f}-'
        f'{max(m["seconds"] for m in measured):.2f}',
        f'{statistics.median(m["mean_batch"] for m in measured):.2f}',
    ])
  lines += _table([
      'run',
      'tree',
      'what',
      'elements',
      'repetitions',
      'median (s)',
      'min-max (s)',
      'mean batch',
  ],
                  rows)
  ratio_rows = []
  for name, ratio in runs['ratios'].items():
    ratio_rows.append([
        name,
        f'{over[name]:.2f}',
        f'{ratio["p10"]:.2f}-{ratio["p90"]:.2f}',
        f'{ratio["min"]:.2f}-{ratio["max"]:.2f}',
        ', '.join(f'{r:.2f}' for r in ratio['per_repetition']),
    ])
  lines += [''] + _table(
      ['ratio', 'median', '10th-90th percentile', 'min-max', 'per repetition'],
      ratio_rows)
  cost = results['key_cost_runs']['per_call_us']
  lines += ['', '## D. Key cost', ''] + _table(
      ['key function', 'median per call (us)'], [[k, f'{v:.2f}']
                                                 for k, v in cost.items()])
  lines += [
      '',
      f'8 MB prompt over 1 KB prompt: '
      f'{results["key_cost"]["prompt_8mb_over_1kb"]:.2f}.',
      ''
  ]
  return lines


def _learning(results):
  if 'learning' not in results:
    return []
  summary, runs = results['learning'], results['learning_runs']
  model = runs['model']
  lines = [
      '## E. How keyed batches learn their size',
      '',
      'The batching DoFn of each design driven directly, with state that '
      'encodes what is written, timers firing in processing-time order, and '
      'the model serving each batch inside the DoFn\'s yield, so that the '
      'batch is timed with it. `per_key`: the reviewed design, an estimator '
      'per state key in state; `per_step`: 0006, one per step and process, '
      'learned from full batches and from those that overran the duration '
      f'target. Arrivals at {runs["rate"]} elements/s, '
      f'Zipf exponent {runs["zipf_s"]}, {runs["elements_per_key"]} elements '
      f'per key on average; the model: {model["batch_secs"]} s per batch '
      f'plus {model["element_secs"]} s per element ({model["cached_element_secs"]} '
      f's for a prefix among the {model["cached_keys"]} it served last); '
      'medians over seeds.',
      '',
  ]
  figures = (
      'mean_batch_size',
      'batches_of_one',
      'model_secs_per_element',
      'p99_delay_secs')
  rows = []
  for keys, values in summary.items():
    for design in ('per_key', 'per_step'):
      rows.append([keys, design] +
                  [f'{values[f"{design}_{figure}"]:.3f}' for figure in figures])
    rows.append([keys, 'per_step speedup'] + [''] * len(figures) +
                [f'{values["per_step_speedup"]:.3f}'])
  return lines + _table(['keys', 'design', *figures, 'speedup'], rows) + ['']


def sections(results) -> list:
  return _validation(results) + _overhead(results) + _learning(results)
