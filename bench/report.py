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

"""report.md and the plots, generated from results.json alone.

`python -m bench.report bench/results.json bench/RESULTS.md` regenerates
the committed copies (the default is build/bench/). Every figure and
setting in the report is read from the results, so that no prose restates
a constant that could drift from the code.
"""

import json
import statistics
import sys
from pathlib import Path

WORKLOADS = ('W1', 'W2', 'W3')
ORDER = ('baseline', 'stateless', 'default', 'keyed_8', 'adaptive', 'oracle')
FRAME_ORDER = ('F3', 'F2', 'F2_P16', 'F2_P32', 'F1')
FRAME_TEXT = {
    'F1': 'the committed frame, kept as the worst case: the baseline batches '
    'on the worker that read the request (one shared key per worker, '
    'perfectly balanced); keyed state keys are hashed onto workers',
    'F2': 'every state key hashed onto a worker (a runner that places keys by '
    'a static hash); the baseline has one UUID key per SDK process, P = 8 '
    'per worker, hashed like every other state key',
    'F2_P16': 'F2 with P = 16 SDK processes per worker',
    'F2_P32': 'F2 with P = 32 SDK processes per worker',
    'F3': 'both sides on contiguous ranges of hashed keys, cut by measured '
    'work and re-cut 5 times on the mean work measured so far (a runner '
    'that balances key ranges, as Dataflow streaming does); P = 8',
}
# The goals of issue 20 for the default config, at the middle rate.
GOALS = {
    'F3': {
        'W1': 2.5, 'W2': 2.5, 'W3': 1.5
    },
    'F2': {
        'W1': 2.0, 'W2': 2.0, 'W3': 1.4
    },
}
SWEEP_MIN_GOAL = 1.0
CACHE_X8_GOAL = 0.97
ENGINE_GOALS = {'F3': 1.5, 'F2': 1.3}


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


def _ratio(row):
  return (
      f'{row["throughput_vs_baseline"]:.2f} '
      f'({row["throughput_min"]:.2f}-{row["throughput_max"]:.2f})')


def _label(results, name):
  return results['meta']['strategies'].get(name, name)


def _meta(results):
  meta = results['meta']
  lines = [
      '# Prefix-aware batching: benchmark report (v3)',
      '',
      f'Generated from `results.json` by `bench/report.py`. Command: '
      f'`{meta["command"]}`, started {meta["started_utc"]}, took '
      f'{meta["duration_s"]:.0f} s on {meta["machine"]}, Python '
      f'{meta["python"]}.',
      '',
      f'Patched tree (build/beam) at commit `{meta["beam_tree_commit"]}`; '
      f'`PrefixBatchingConfig()` defaults to num_shards '
      f'`{meta["default_num_shards"]}`; 0010\'s policy at its defaults: '
      f'`{meta["adaptive_num_shards"]}`. Seeds {meta["seeds"]} x salts '
      f'{meta["salts"]} = {meta["placements"]} placements per point; '
      f'arrival rates per worker {meta["rates_per_worker"]} (frame tables '
      f'at {meta["middle_rate_per_worker"]}); buffering '
      f'{meta["buffering_s"]} s; {meta["threads_per_process"]} threads per '
      'SDK process. Costs, in prompt-token equivalents (from the '
      f'{meta["costs_source"]}): {meta["batch_overhead_tokens"]:.1f} per '
      f'batch, {meta["request_overhead_tokens"]:.1f} per further request of '
      f'a batch, {meta["decode_token_tokens"]:.2f} per decoded token of a '
      'request.',
      '',
  ]
  if meta['skipped']:
    lines += [f'Phases left out of this run: {", ".join(meta["skipped"])}.', '']
  lines += _table(['package', 'version'], sorted(meta['packages'].items()))
  lines += ['', 'Strategies:', '']
  lines += [
      f'* `{name}`: {meta["strategies"][name]}' for name in ORDER
      if name in meta['strategies']
  ]
  return lines + ['']


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


def _goals(results):
  if 'frames' not in results:
    return []
  frames = results['frames']
  lines = [
      '## The goals of issue 20 (default config)',
      '',
      'Median over placements of the default\'s throughput over the '
      'baseline placed in the same frame, at the middle rate.',
      '',
  ]
  rows = []
  for frame, goals in GOALS.items():
    for w, goal in goals.items():
      row = frames[frame][w]['default']
      value = row['throughput_vs_baseline']
      rows.append([
          frame,
          w,
          _ratio(row),
          f'>= {goal}',
          'met' if value >= goal else 'NOT met'
      ])
  for frame in ('F2', 'F3'):
    if 'sweep_min' in results:
      entry = results['sweep_min'][frame]['default']
      at = entry['at']
      rows.append([
          frame,
          f'sweep_min ({at["workload"]}, {at["varied"]} {at["value"]})',
          f'{entry["throughput_vs_baseline"]:.2f}',
          f'>= {SWEEP_MIN_GOAL}',
          'met'
          if entry['throughput_vs_baseline'] >= SWEEP_MIN_GOAL else 'NOT met'
      ])
    if 'cache_x8' in results:
      for w, arms in results['cache_x8'][frame].items():
        value = arms['default']['throughput_vs_baseline']
        rows.append([
            frame,
            f'cache_x8 {w}',
            f'{value:.2f}',
            f'>= {CACHE_X8_GOAL}',
            'met' if value >= CACHE_X8_GOAL else 'NOT met'
        ])
  if 'engine_fleet' in results:
    for frame, goal in ENGINE_GOALS.items():
      value = results['engine_fleet'][frame]['throughput_ratio']
      rows.append([
          frame,
          'engine fleet',
          f'{value:.2f}',
          f'>= {goal}',
          'met' if value >= goal else 'NOT met'
      ])
  return lines + _table(['frame', 'workload', 'default', 'goal', ''],
                        rows) + ['']


def _workload_line(w):
  skip = {'name', 'bound'}
  return ', '.join(f'{k} {v}' for k, v in w.items() if k not in skip)


def _frames(results):
  if 'frames' not in results:
    return []
  lines = [
      '## A. The fleet in three frames',
      '',
      'Requests arrive as a Poisson process; every strategy sees the same '
      'requests and is placed like the baseline. Throughput is requests over '
      'the busiest worker\'s work, over the baseline\'s in the same frame and '
      'placement: medians over placements, min-max in brackets.',
      '',
  ]
  for name in results.get('workloads', {}):
    lines += [f'* {name}: {_workload_line(results["workloads"][name])}.']
  lines += ['', '![frames](frames.png)', '']
  for frame in FRAME_ORDER:
    section = results['frames'].get(frame)
    if section is None:
      continue
    names = [n for n in ORDER if n in section[WORKLOADS[0]]]
    lines += [
        f'### {frame}',
        '',
        f'{FRAME_TEXT[frame]}; {section["placements"]} placements.',
        '',
    ]
    rows = [[name] + [_ratio(section[w][name]) for w in WORKLOADS]
            for name in names]
    lines += _table(['strategy'] +
                    [f'{w} throughput vs baseline' for w in WORKLOADS],
                    rows)
    lines += ['']
    rows = []
    for name in names:
      row = [name]
      for w in WORKLOADS:
        r = section[w][name]
        row.append(
            f'{r["hit_rate"]:.3f} / {r["load_max_over_mean"]:.2f} / '
            f'{r["mean_batch_size"]:.2f} / {r["p99_delay_s"]:.2f}')
      rows.append(row)
    lines += _table(['strategy'] +
                    [f'{w} hit / load / batch / p99 s' for w in WORKLOADS],
                    rows)
    lines += ['']
  return lines


def _sweep(results):
  if 'sweep' not in results:
    return []
  meta = results['meta']['sweep']
  lines = [
      '## The sweep',
      '',
      'One thing varies at a time from the frame tables\' point; each point '
      f'runs {meta["side_fraction"]} of the workload\'s requests. Throughput '
      'vs baseline, median over placements (hit rate in brackets). Cache x8 '
      'is reported apart (cache_x8): it is the regime where every '
      'worker\'s cache holds most of the working set.',
      '',
  ]
  entries = results['sweep']
  for frame in ('F2', 'F3'):
    for w in WORKLOADS:
      chosen = [e for e in entries if e['workload'] == w]
      if not chosen:
        continue
      names = [n for n in ORDER if n in chosen[0]['frames'][frame]]
      lines += [f'### {w}, {frame}', '']
      rows = []
      for e in chosen:
        cells = e['frames'][frame]
        rows.append([f'{e["varied"]} {e["value"]}', e['requests']] + [
            f'{cells[n]["throughput_vs_baseline"]:.2f} '
            f'({cells[n]["hit_rate"]:.2f})' for n in names
        ])
      lines += _table(['point', 'requests'] + names, rows) + ['']
  lines += ['### sweep_min and cache_x8', '']
  rows = []
  for frame, arms in results['sweep_min'].items():
    for name, entry in arms.items():
      at = entry['at']
      rows.append([
          frame,
          name,
          f'{entry["throughput_vs_baseline"]:.2f}',
          f'{at["workload"]} {at["varied"]} {at["value"]}',
          ', '.join(f'{w} {v:.2f}' for w, v in entry['by_workload'].items()),
      ])
  lines += _table(['frame', 'strategy', 'sweep_min', 'at', 'per workload'],
                  rows) + ['']
  rows = []
  for frame, by_w in results['cache_x8'].items():
    for w, arms in by_w.items():
      rows.append([frame, w] + [
          f'{arms[n]["throughput_vs_baseline"]:.2f} '
          f'({arms[n]["throughput_min"]:.2f}-{arms[n]["throughput_max"]:.2f})'
          for n in arms if n != 'baseline'
      ])
  some = next(iter(next(iter(results['cache_x8'].values())).values()))
  lines += _table(['frame', 'workload'] +
                  [f'{n} (cache x8)' for n in some if n != 'baseline'],
                  rows)
  return lines + ['']


def _engine(results):
  if 'engine_fleet' not in results:
    return []
  fleet, engine = results['engine_fleet'], results['engine']
  w = engine['workload']
  cal = engine['calibration']
  lines = [
      f'## B. The fleet replayed on a real engine: {engine["name"]}',
      '',
      'A random-weight Llama ('
      f'{", ".join(f"{k} {v}" for k, v in engine["model"].items())}), KV pool '
      f'of {engine["kv_pool_blocks"]} blocks (one worker\'s cache), max '
      f'{engine["max_num_seqs"]} sequences. Workload: {_workload_line(w)}, at '
      f'{engine["rate_per_worker"]} requests/s per worker. For each frame, '
      'the placement (seed, salt) whose simulated default-over-baseline '
      'ratio is the median is replayed for both arms: each worker\'s batches '
      'in emission order, at most max_in_flight at once, at their emission '
      f'times scaled so that the mean worker offers {engine["saturation"]} '
      'times the load one server sustains (so that a worker\'s engine time '
      'is its busy time); workers one after another, the prefix cache reset '
      'before each, every arm\'s batches of a worker back to back in '
      f'alternating order, {engine["repetitions"]} times (medians). Further '
      'arms are replayed at the default\'s placement.',
      '',
  ]
  rows = []
  for frame, figures in fleet.items():
    d = engine['frames'][frame]
    for arm, a in d['arms'].items():
      rows.append([
          frame,
          arm,
          f'{d["seed"]}/{d["salt"]}',
          f'{a["busiest_worker_s"]:.2f}',
          f'{a["prompt_tokens_computed"]:.0f}',
          f'{a["simulated_prompt_tokens_computed"]:.0f}',
          f'{a["hit_rate"]:.3f}',
          f'{a["simulated_hit_rate"]:.3f}',
      ])
  lines += _table([
      'frame',
      'arm',
      'placement',
      'busiest worker (s)',
      'prompt tokens computed',
      'simulated',
      'hit rate',
      'simulated'
  ],
                  rows)
  lines += ['']
  lines += _table([
      'frame',
      'arm',
      'throughput ratio (arm / baseline)',
      'simulated at that placement',
      'workers',
      'requests',
      'max in flight'
  ],
                  [[
                      frame,
                      arm,
                      f'{a["throughput_ratio"]:.2f}',
                      f'{a["simulated_ratio"]:.2f}',
                      f['workers'],
                      f['requests'],
                      f['max_in_flight']
                  ] for frame, f in fleet.items()
                   for arm, a in f['arms'].items() if arm != 'baseline'])
  lines += [
      '',
      f'Calibration ({cal["repetitions"]} repetitions, medians): '
      f'{cal["seconds_per_token"] * 1e3:.3f} ms per computed token, '
      f'{cal["batch_overhead_s"] * 1e3:.1f} ms per batch '
      f'({cal["batch_overhead_tokens"]:.1f} token equivalents), '
      f'{cal["request_overhead_s"] * 1e3:.1f} ms per further request '
      f'({cal["request_overhead_tokens"]:.1f}), '
      f'{cal["decode_token_s"] * 1e3:.2f} ms per decoded token of a request '
      f'in a batch of {cal["decode_batch_size"]} '
      f'({cal["decode_token_tokens"]:.2f}).',
      '',
  ]
  return lines


def _describe_run(run, default_num_shards) -> str:
  batch = run['batch']
  if run.get('keyed'):
    shards = batch.get('num_shards', 1)
    if shards == 'default':
      shards = f'the default {default_num_shards}'
    how = f'keyed, {run["keys"]} prefixes x {shards} shards'
  else:
    how = f'unkeyed stateful, {run["keys"]} prefixes'
  return (f'{how}, batches {batch["min_batch_size"]}-{batch["max_batch_size"]}')


def _optional(value, spec) -> str:
  return 'n/a' if value is None else format(value, spec)


def _overhead(results):
  if 'overhead' not in results:
    return []
  over, runs = results['overhead'], results['overhead_runs']
  lines = [
      '## C. Overhead',
      '',
      'BatchElements on the FnApiRunner, in two worker processes that take '
      'the runs of each repetition in turn: one imports pristine 2.77.0 '
      '(`build/base`), one the patched tree. Every ratio is over a run on '
      '2.77.0 in the same repetition (`stateful`: its stateful path, one '
      'shared key), taken repetition by repetition; '
      f'{runs["repetitions"]} repetitions, the order of the runs rotating '
      'from one to the next. Default num_shards: '
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
        f'{run["median_s"]:.2f}',
        f'{min(m["seconds"] for m in measured):.2f}-'
        f'{max(m["seconds"] for m in measured):.2f}',
        f'{statistics.median(m["mean_batch"] for m in measured):.2f}',
        _optional(run['state_keys'], 'd'),
        _optional(
            run['state_keys'] and
            statistics.median(m['weighings_per_state_key'] for m in measured),
            '.1f'),
    ])
  lines += _table([
      'run',
      'tree',
      'what',
      'elements',
      'median (s)',
      'min-max (s)',
      'mean batch',
      'state keys',
      'state-cache weighings per state key'
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
  lines += [
      '',
      'State-cache weighings per state key at 512 state keys (median): '
      f'{over["state_cache_weighings_per_key"]:.1f}.',
  ]
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
      'per state key in state; `per_step`: 0004, one per step and process, '
      f'learned from full batches. Arrivals at {runs["rate"]} elements/s, '
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
    rows.append([
        keys,
        'per_step speedup',
        '',
        '',
        '',
        f'{values["per_step_speedup"]:.3f}'
    ])
  return lines + _table(['keys', 'design', *figures, 'speedup'], rows) + ['']


DEFINITIONS = [
    '## What the figures mean',
    '',
    '* hit rate: prompt tokens served from a prefix cache / all prompt '
    'tokens.',
    '* work: the prompt tokens a worker computes plus, for each batch it '
    'serves, the per-batch overhead, the per-request overhead of every '
    'request after the first, and the decode cost of its requests; load '
    'max/mean is the busiest worker\'s work over the mean.',
    '* throughput vs baseline: requests over the busiest worker\'s work, '
    'over the same for the baseline placed in the same frame with the same '
    'placement (on the engine: its engine seconds).',
    '* placement: a (seed, salt) pair; the seed draws the requests, their '
    'reading copies and the shard picks, the salt the runner\'s hashing '
    '(and the baseline\'s UUIDs).',
    '* delay: from a request\'s arrival to its batch\'s emission (the '
    'batch is full, or its buffering timer fires).',
    '* oracle: knows each span\'s key counts in advance; gives a key '
    'ceil(count / fair share) replicas, sends its requests to them a batch '
    'at a time, and places the replicas by LPT over their measured work '
    '(re-placed 5 times on the mean work measured so far). Not an upper '
    'bound.',
    '* sweep_min: the least, over the sweep points (rate, Zipf, cache x0.5 '
    'to x4, decode length) and the frame tables\' point, of each point\'s '
    'median; cache_x8 apart.',
    '',
]


def render(results) -> str:
  lines = (
      _meta(results) + _goals(results) + _validation(results) +
      _frames(results) + _sweep(results) + _engine(results) +
      _overhead(results) + _learning(results) + DEFINITIONS)
  return '\n'.join(lines) + '\n'


def plot(results, out: Path) -> list[Path]:
  """One plot: the default's throughput vs baseline per frame and
  workload, with the placements' range."""
  try:
    import matplotlib
  except ImportError:
    return []
  if 'frames' not in results:
    return []
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(9, 4))
  names = [
      n for n in ('default', 'keyed_8', 'adaptive', 'oracle')
      if n in results['frames']['F2']['W1']
  ]
  frames = [f for f in FRAME_ORDER if f in results['frames']]
  width = 0.8 / len(names)
  for i, name in enumerate(names):
    xs, ys, lows, highs = [], [], [], []
    for j, (frame, w) in enumerate((f, w) for f in frames for w in WORKLOADS):
      row = results['frames'][frame][w][name]
      xs.append(j + i * width)
      ys.append(row['throughput_vs_baseline'])
      lows.append(row['throughput_vs_baseline'] - row['throughput_min'])
      highs.append(row['throughput_max'] - row['throughput_vs_baseline'])
    ax.bar(xs, ys, width, yerr=[lows, highs], label=name, capsize=2)
  ax.axhline(1.0, color='grey', ls=':')
  ax.set_xticks([j + 0.4 - width / 2 for j in range(len(frames) * 3)])
  ax.set_xticklabels([f'{f}\n{w}' for f in frames for w in WORKLOADS],
                     fontsize=7)
  ax.set_ylabel('throughput vs baseline')
  ax.legend(fontsize=7)
  fig.tight_layout()
  path = out / 'frames.png'
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return [path]


def write(results, out: Path) -> None:
  out.mkdir(parents=True, exist_ok=True)
  text = json.dumps(results, indent=1, sort_keys=True) + '\n'
  (out / 'results.json').write_text(text)
  # The report reads the written file back, so that it can use nothing else.
  results = json.loads(text)
  plot(results, out)
  (out / 'report.md').write_text(render(results))


def main(argv=None) -> int:
  """python -m bench.report [RESULTS_JSON [REPORT_MD]]: the plots go next to
  the results, the report where named (by default report.md beside them)."""
  args = argv if argv is not None else sys.argv[1:]
  path = Path(args[0] if args else 'build/bench/results.json')
  target = Path(args[1]) if len(args) > 1 else path.parent / 'report.md'
  results = json.loads(path.read_text())
  plot(results, path.parent)
  target.write_text(render(results))
  return 0


if __name__ == '__main__':
  sys.exit(main())
