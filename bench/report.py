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

LABELS = {
    'baseline': "today's stateful BatchElements, one shared key per worker",
    'keyed_1': 'keyed, 1 shard per key',
    'keyed_8': 'keyed, 8 shards per key, a random shard per element',
    'default': 'keyed, PrefixBatchingConfig() default num_shards',
    'keyed_8_sticky': 'keyed, 8 shards per key, runs of a batch per shard',
    'traffic_sized': 'keyed, ceil(share x workers) shards per key',
    'adaptive': 'keyed, AdaptiveNumShards() learning shares online',
    'oracle': 'oracle: popularity-aware placement, same caches and batches',
}


def _label(name):
  return LABELS.get(name, name)


def _f(value, digits=3):
  if value is None:
    return ''
  if isinstance(value, float):
    return f'{value:.{digits}f}'
  return str(value)


def _spread(row, field, digits=3):
  low, high = row['spread'][field]
  return f'{low:.{digits}f}-{high:.{digits}f}'


def _table(header, rows):
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  lines += ['| ' + ' | '.join(_f(c) for c in row) + ' |' for row in rows]
  return lines


def _meta(results):
  meta = results['meta']
  lines = [
      '# Prefix-aware batching: benchmark report',
      '',
      f'Generated from `results.json` by `bench/report.py`. Command: '
      f'`{meta["command"]}`, started {meta["started_utc"]}, took '
      f'{meta["duration_s"]:.0f} s on {meta["machine"]}, Python '
      f'{meta["python"]}.',
      '',
      f'Patched tree (build/beam) at commit `{meta["beam_tree_commit"]}`; '
      f'seeds {meta["seeds"]}; arrival rates per worker '
      f'{meta["rates_per_worker"]} (tables at '
      f'{meta["middle_rate_per_worker"]}); default num_shards '
      f'`{meta["default_num_shards"]}`; AdaptiveNumShards in the tree: '
      f'{meta["adaptive"]}; overhead {meta["batch_overhead_tokens"]:.1f} '
      f'computed-token equivalents per batch and '
      f'{meta["request_overhead_tokens"]:.1f} per further request of a '
      f'batch (from the {meta["overhead_source"]}).',
      '',
  ]
  if meta['skipped']:
    lines += [f'Phases left out of this run: {", ".join(meta["skipped"])}.', '']
  lines += _table(['package', 'version'], sorted(meta['packages'].items()))
  return lines + ['']


def _validation(results):
  if 'validation' not in results:
    return []
  v = results['validation']
  w = v['workload']
  lines = [
      '## Validation: the real transforms against the simulator',
      '',
      f'`BatchElements` from the patched tree on the streaming DirectRunner, '
      f'fed by a TestStream at {v["rate_per_worker"]} requests/s per worker '
      f'({w["requests"]} requests, {w["prefixes"]} keys, Zipf '
      f'{w["zipf_s"]}, {w["workers"]} workers, batches of '
      f'{w["batch_size"]}, buffering {v["buffering_s"]} s, seed '
      f'{v["seed"]}); the baseline gets one worker\'s requests. "exact": the '
      'simulator formed the same batches.',
      '',
  ]
  rows = [[
      name,
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
      'requests',
      'real batches',
      'simulated',
      'full',
      'by timer',
      'matching',
      'exact'
  ],
                        rows) + ['']


def _workload_line(w):
  skip = {'name', 'bound'}
  return ', '.join(f'{k} {v}' for k, v in w.items() if k not in skip)


def _streaming(results):
  if 'streaming' not in results:
    return []
  meta = results['meta']
  lines = [
      '## A. The streaming fleet',
      '',
      f'Requests arrive as a Poisson process at '
      f'{meta["middle_rate_per_worker"]} requests/s per worker; medians '
      f'over {len(meta["seeds"])} seeds, min-max in the spread columns. '
      'Throughput is requests over the busiest worker\'s work (computed '
      'prompt tokens plus the batch and request overheads), relative to the '
      'baseline, and as a percentage of the oracle\'s. Every strategy sees '
      'the same requests.',
      '',
  ]
  for name, rows in results['streaming'].items():
    w = results['workloads'][name]
    lines += [
        f'### {name}',
        '',
        _workload_line(w) + '.',
        '',
        f'Loose bound (every distinct block computed once, no cache limit): '
        f'hit rate {w["bound"]["hit_rate"]:.3f}.',
        '',
    ]
    table = []
    for strategy, row in rows.items():
      table.append([
          _label(strategy),
          row['hit_rate'],
          _spread(row, 'hit_rate'),
          f'{row["throughput_vs_baseline"]:.2f}',
          _spread(row, 'throughput_vs_baseline', 2),
          f'{row["throughput_pct_of_oracle"]:.0f}%',
          f'{row["load_max_over_mean"]:.2f}',
          f'{row["p50_delay_s"]:.2f}',
          f'{row["p99_delay_s"]:.2f}',
          f'{row["mean_batch_size"]:.2f}',
          row['purity'],
      ])
    lines += _table([
        'strategy',
        'hit rate',
        'spread',
        'throughput vs baseline',
        'spread',
        '% of oracle',
        'load max/mean',
        'p50 delay (s)',
        'p99 delay (s)',
        'mean batch',
        'purity'
    ],
                    table)
    lines += ['', f'![{name}]({name.lower()}_rates.png)', '']
  return lines


def _sweep(results):
  if 'streaming_sweep' not in results:
    return []
  lines = [
      '## The sweep',
      '',
      'Throughput vs baseline (median over seeds) as one thing varies at a '
      'time; the hit rate follows in brackets.',
      '',
  ]
  entries = results['streaming_sweep']
  strategies = [
      s for s in results['meta']['strategies'] if s in entries[0]['strategies']
  ]
  for workload in dict.fromkeys(e['workload'] for e in entries):
    for varied in dict.fromkeys(e['varied'] for e in entries
                                if e['workload'] == workload):
      chosen = [
          e for e in entries
          if e['workload'] == workload and e['varied'] == varied
      ]
      lines += [f'### {workload}: {varied}', '']
      rows = []
      for e in chosen:
        rows.append([
            e['rate_per_worker'],
            e['cache_prefixes'],
            e['zipf_s'],
            e['requests'],
        ] + [
            f'{e["strategies"][s]["throughput_vs_baseline"]:.2f} '
            f'({e["strategies"][s]["hit_rate"]:.2f})' for s in strategies
        ])
      lines += _table(['rate', 'cache', 'zipf', 'requests'] + strategies,
                      rows) + ['']
  return lines


def _engine(results):
  if 'engine_fleet' not in results:
    return []
  fleet, engine = results['engine_fleet'], results['engine']
  w = engine['workload']
  cal = engine['calibration']
  arms = [name for name in fleet if isinstance(fleet[name], dict)]
  lines = [
      f'## B. A real engine as a fleet: {engine["name"]}',
      '',
      f'A random-weight Llama ({", ".join(f"{k} {v}" for k, v in engine["model"].items())}), '
      f'KV pool of {engine["kv_pool_blocks"]} blocks (one worker\'s cache), '
      f'max {engine["max_num_seqs"]} sequences. Workload: '
      f'{_workload_line(w)}, at {engine["rate_per_worker"]} requests/s per '
      f'worker, seed {engine["seed"]}; {engine["repetitions"]} '
      'repetitions per arm, alternating; medians. Workers replay one after '
      'another, the prefix cache reset before each.',
      '',
  ]
  rows = [[
      name,
      fleet[name]['prompt_tokens_computed'],
      fleet[name]['simulated_prompt_tokens_computed'],
      fleet[name]['hit_rate'],
      fleet[name]['simulated_hit_rate'],
      fleet[name]['busiest_worker_s'],
      fleet[name]['prefill_share'],
      fleet[name]['throughput_ratio'],
  ] for name in arms]
  lines += _table([
      'arm',
      'prompt tokens computed',
      'simulated',
      'hit rate',
      'simulated',
      'busiest worker (s)',
      'prefill share',
      'throughput vs baseline'
  ],
                  rows)
  lines += [
      '',
      f'Throughput ratio, default against baseline, from the busiest '
      f'worker\'s engine time: {fleet["throughput_ratio"]:.2f}.',
      '',
      f'Calibration ({cal["repetitions"]} repetitions, medians): '
      f'{cal["seconds_per_token"] * 1e3:.3f} ms per computed token, '
      f'{cal["batch_overhead_s"] * 1e3:.1f} ms per batch '
      f'({cal["batch_overhead_tokens"]:.1f} token equivalents) and '
      f'{cal["request_overhead_s"] * 1e3:.1f} ms per further request '
      f'({cal["request_overhead_tokens"]:.1f}). A least-squares fit of the '
      f'{cal["fit_over_replayed_batches"]["batches"]} replayed batches\' '
      'times on their computed tokens gives '
      f'{cal["fit_over_replayed_batches"]["seconds_per_token"] * 1e3:.3f} '
      'ms per token and '
      f'{cal["fit_over_replayed_batches"]["batch_overhead_s"] * 1e3:.1f} ms '
      'per batch.',
      '',
      'Per run and worker (engine seconds / computed tokens):',
      '',
  ]
  rows = []
  for name, runs in engine['runs'].items():
    for i, run in enumerate(runs):
      rows.append([name, i + 1] + [
          f'{wk["engine_s"]:.2f} / {wk["prompt_tokens_computed"]:.0f}'
          for _, wk in sorted(run['workers'].items())
      ])
  width = max(len(r) for r in rows) - 2
  lines += _table(['arm', 'run'] + [f'worker {i}' for i in range(width)], rows)
  return lines + ['', '![engine](engine.png)', '']


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


def _raw(results):
  if 'streaming_runs' not in results:
    return []
  middle = results['meta']['middle_rate_per_worker']
  lines = [
      '## Per-run figures at the middle rate',
      '',
      'Hit rate / throughput vs baseline of every seed (all runs, at every '
      'sweep point, are in results.json under streaming_runs).',
      '',
  ]
  runs = [
      r for r in results['streaming_runs']
      if r['rate_per_worker'] == middle and r['cache_prefixes'] ==
      results['workloads'][r['workload']]['cache_prefixes'] and
      r['zipf_s'] == results['workloads'][r['workload']]['zipf_s']
  ]
  strategies = [s for s in results['meta']['strategies']]
  rows = [[r['workload'], r['seed']] + [
      f'{r["figures"][s]["hit_rate"]:.3f} / '
      f'{r["figures"][s]["throughput_vs_baseline"]:.2f}' for s in strategies
  ] for r in runs]
  return lines + _table(['workload', 'seed'] + strategies, rows) + ['']


DEFINITIONS = [
    '## What the figures mean',
    '',
    '* hit rate: prompt tokens served from a prefix cache / all prompt '
    'tokens.',
    '* work: the prompt tokens a worker computes plus, for each batch it '
    'serves, the per-batch overhead and the per-request overhead of every '
    'request after the first; load max/mean is the busiest worker\'s work '
    'over the mean.',
    '* throughput vs baseline: requests over the busiest worker\'s work, '
    'over the same for the baseline (on the engine: its engine seconds).',
    '* delay: from a request\'s arrival to its batch\'s emission (the '
    'batch is full, or its buffering timer fires).',
    '* purity: share of batches whose requests all have one key.',
    '* oracle: knows each span\'s key counts in advance; gives a key '
    'ceil(count / fair share) replicas on the least-loaded workers, sends '
    'its requests to them a batch at a time, and batches one-off keys '
    'together per worker.',
    '* loose bound: every distinct block computed once, fleet-wide.',
    '',
]


def render(results) -> str:
  lines = (
      _meta(results) + _validation(results) + _streaming(results) +
      _sweep(results) + _engine(results) + _overhead(results) + _raw(results) +
      DEFINITIONS)
  return '\n'.join(lines) + '\n'


def plot(results, out: Path) -> list[Path]:
  try:
    import matplotlib
  except ImportError:
    return []
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  paths = []
  for name in results.get('streaming', {}):
    entries = [
        e for e in results['streaming_sweep']
        if e['workload'] == name and e['varied'] == 'rate'
    ]
    rates = [e['rate_per_worker'] for e in entries]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for strategy in results['meta']['strategies']:
      for ax, field in zip(axes, ('throughput_vs_baseline', 'hit_rate')):
        ax.plot(
            rates, [e['strategies'][strategy][field] for e in entries],
            'o-',
            label=strategy)
    axes[0].set(
        xscale='log',
        xlabel='requests/s per worker',
        ylabel='throughput vs baseline',
        title=f'{name}: fleet throughput')
    axes[1].set(
        xscale='log',
        xlabel='requests/s per worker',
        ylabel='token hit rate',
        title=f'{name}: reuse',
        ylim=(0, 1))
    axes[1].axhline(
        results['workloads'][name]['bound']['hit_rate'],
        color='grey',
        ls=':',
        label='loose bound')
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    path = out / f'{name.lower()}_rates.png'
    fig.savefig(path, dpi=100)
    plt.close(fig)
    paths.append(path)
  if 'engine_fleet' in results:
    fleet = results['engine_fleet']
    arms = [a for a in fleet if isinstance(fleet[a], dict)]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, field, title in zip(
        axes, ('prompt_tokens_computed', 'busiest_worker_s'),
        ('prompt tokens computed', 'busiest worker engine time (s)')):
      ax.bar(arms, [fleet[a][field] for a in arms])
      ax.set_title(title)
    fig.suptitle(f'{results["engine"]["name"]}: fleet replay (medians)')
    fig.tight_layout()
    path = out / 'engine.png'
    fig.savefig(path, dpi=100)
    plt.close(fig)
    paths.append(path)
  return paths


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
