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

"""The benchmark figures that README.md, docs/*.md and the pull request
descriptions quote, generated from bench/results.json (stdlib only).

A quoted figure lives in a block between `<!-- bench:NAME -->` and
`<!-- /bench:NAME -->`, and RENDERERS[NAME] writes the block's text from the
results alone. `python -m bench.blocks --write` re-renders every block in
place; `python -m bench.blocks` (and the harness test) fails when a block
differs from its re-rendering, when a block has no renderer, or when a
benchmark figure (a ratio such as 1.23x, a hit rate, a share of the
oracle) is written outside a block.
"""

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from bench import losses
from bench import v4_summary

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / 'bench' / 'results.json'
START = re.compile(r'<!-- bench:([a-z0-9-]+) -->\n')
END = '<!-- /bench:{} -->'
WORKLOADS = ('W0', 'W1', 'W2', 'W3', 'W4')
# The required points of every deployment and workload, as the tables show
# them.
COLUMNS = ('R0_25.D64', 'R4.D0', 'R4.D64', 'R4.D256', 'R64.D64')
DEPLOYMENTS = ('streaming_F3', 'streaming_F2', 'batch', 'batch_hash')
# What a hand-written benchmark figure looks like.
STRAY = re.compile(
    r'\b\d+(?:\.\d+)?[x×](?![\w])|'
    r'hit rates? (?:of |from |rises from |falls from )?\d*\.\d+|'
    r'\d+(?:\.\d+)?% of (?:the )?(?:oracle|bound)')


def files(root: Path = ROOT) -> list[Path]:
  """The files whose figures must come from the results."""
  return [root / 'README.md', root / 'CHANGES.md'] + sorted(
      (root / 'docs').glob('*.md')) + sorted(
          (root / 'patches' / 'pull-requests').glob('*.md'))


def _point(section, dep, workload, column):
  r_key, d_key = column.split('.')
  return section[dep][workload][r_key][d_key]


def _table(section, name='default'):
  lines = [
      '| deployment | workload | ' + ' | '.join(COLUMNS) + ' |',
      '|---|---|' + '---|' * len(COLUMNS),
  ]
  for dep in [d for d in DEPLOYMENTS if d in section]:
    for workload in WORKLOADS:
      cells = []
      for column in COLUMNS:
        point = _point(section, dep, workload, column)
        cells.append(
            f'{point[name]["ratio"]:.2f}x (bound '
            f'{point["bound"]["ratio"]:.2f}x)')
      lines.append(f'| {dep} | {workload} | ' + ' | '.join(cells) + ' |')
  return lines


def _run(results):
  meta, v = results['meta'], results['v4']['meta']
  return (
      f'Run: `{meta["command"]}` on {v4_summary.tree_text(meta)}, '
      f'{v["placements"]} placements '
      f'(evaluation seeds x salts) per point, C = {v["cache_tokens"]} '
      f'tokens per worker, {v["rate_per_worker"]} requests/s per worker, '
      'scored in steady state over '
      f'{v4_summary.window_text(v)} windows (batch: the makespan). '
      f'`default` is `PrefixBatchingConfig()` as the series ships it '
      f'(`{meta["default_num_shards"]}`: keys measured at fewer than '
      '`own_batches_from` elements per buffering period, or on bounded '
      'input with fewer than `bounded_own_batches_from` elements, share '
      'their measuring process\'s batches)')


def _wins(results, name='default'):
  goals = v4_summary.goals(results['v4'], name)
  wins = '; '.join(
      f'{w["deployment"]} {w["workload"]} {w["ratio"]:.2f}x (goal '
      f'{w["target"]:.1f}x, bound {w["bound"]:.2f}x)' for w in goals['wins'])
  balanced = goals.get('shares_met_balanced')
  return (
      f'At R4 with no decoding: {wins}. At 64 and 256 decoded tokens it '
      f'reaches half of the bound\'s gain at {goals["shares_met"]} of '
      f'{len(goals["shares"])} points' + (
          '.' if balanced is None else
          f', and at {balanced} with every window\'s work spread evenly '
          'over the workers, as the bound spreads it.'))


def _aa(results):
  worst = []
  # batch_hash shares batch's baseline, and so its A/A row.
  for dep in [d for d in DEPLOYMENTS
              if d != 'batch_hash' and d in results['v4']]:
    lows = [
        point['aa']['ratio_min']
        for d, _, _, _, point in v4_summary.points(results['v4']) if d == dep
    ]
    worst.append(f'{dep} {min(lows):.2f}x')
  return (
      'The A/A row (the baseline against itself re-salted) goes as low as ' +
      ', '.join(worst) + ' at some placement.')


def _engine(results):
  engine = results['v4'].get('engine')
  if not engine:
    return 'The real-engine replay was not part of this run.'
  parts = []
  for dep, by_w in engine.items():
    if dep in ('curve', 'name'):
      continue
    for workload, e in by_w.items():
      parts.append(
          f'{dep} {workload} {e["ratio"]:.2f}x (the GPU-like model at that '
          f'placement: {e["simulated_ratio"]:.2f}x)')
  first = next(
      e for dep, by_w in engine.items() if dep not in ('curve', 'name')
      for e in by_w.values())
  return (
      f'Replayed on {engine["name"]} worker by worker on one server '
      f'({first["workers"]} workers{_processes(first)}, '
      f'{first["requests"]} requests per arm, '
      f'{first["decode_tokens"]} decoded tokens, at R4): ' + '; '.join(parts) +
      '.')


def _processes(replay) -> str:
  """' of N SDK processes' when the replay recorded it (older runs did not)."""
  count = replay.get('processes_per_worker')
  if count is None:
    return ''
  return f' of {count} SDK process{"" if count == 1 else "es"}'


def readme_what_it_buys(results) -> str:
  section = results['v4']
  return '\n'.join([
      _run(results) + '. Throughput over the deployment\'s baseline, '
      'medians over placements, with the valid upper bound:',
      '',
  ] + _table(section) + [
      '',
      losses.sentence(results) + ' ' + _wins(results) + ' ' + _aa(results) +
      ' ' + _engine(results),
      '',
      'The policy as benchmark v4 first measured it (`adaptive_v3`: every '
      'key warm, runs of 4 batches): ' +
      losses.sentence(results, 'adaptive_v3').replace('It is', 'it is', 1) +
      ' ' + _wins(results, 'adaptive_v3'),
      '',
      'Eight shards per prefix (`keyed_8`, #40905\'s own default): ' +
      losses.sentence(results, 'keyed_8').replace('It is', 'it is', 1),
  ])


# What the README's table says of a deployment and a workload.
DEPLOYMENT_WORDS = {
    'streaming_F3': 'streaming, key ranges re-cut on load',
    'streaming_F2': 'streaming, keys hashed onto workers',
    'batch': 'batch, key ranges cut by work',
    'batch_hash': 'batch, keys hashed onto workers',
}
WORKLOAD_WORDS = {
    'W0': 'prompts that share nothing',
    'W1': 'flat prefixes',
    'W2': 'flat prefixes',
    'W3': 'chat-shaped prompts',
    'W4': 'long documents with questions',
}


def _where(dep, workload, r_key, d_key):
  prefixes = (
      '' if workload == 'W0' else
      f', prefixes {r_key[1:].replace("_", ".")} times a worker\'s cache '
      f'({r_key})')
  return (
      f'{DEPLOYMENT_WORDS[dep]}; {WORKLOAD_WORDS[workload]} ({workload})'
      f'{prefixes}; {d_key[1:]} decoded tokens per request')


def readme_why(results) -> str:
  """The README's first figures: the default's best, median and worst point
  against 2.77.0, whichever points they are."""
  section = results['v4']
  ranked = sorted(
      v4_summary.points(section), key=lambda p: p[4]['default']['ratio'])
  median = statistics.median(p[4]['default']['ratio'] for p in ranked)
  goals = v4_summary.goals(section)
  rows = []
  for label, (dep, workload, r_key,
              d_key, point) in (('best', ranked[-1]),
                                ('worst against its deployment\'s baseline',
                                 ranked[0])):
    rows.append(
        f'| {label} | {_where(dep, workload, r_key, d_key)} | '
        f'{point["default"]["ratio"]:.2f}x | {point["bound"]["ratio"]:.2f}x |')
  rows.insert(1, f'| median | all {len(ranked)} points | {median:.2f}x | |')
  placements = sorted({p[4][v4_summary.POINT]['placements'] for p in ranked})
  by_decode, by_regime = {}, {}
  for p in ranked:
    by_decode.setdefault(p[3], []).append(p[4]['default']['ratio'])
    by_regime.setdefault(p[2], []).append(p[4]['default']['ratio'])
  stateless = goals['below_stateless']
  worst_stateless = min(stateless, key=lambda b: b['ratio'], default=None)
  return '\n'.join([
      '`PrefixBatchingConfig()`\'s throughput over 2.77.0\'s batching in a '
      'simulated fleet of GPU-sized LLM workers with prefix caches (benchmark '
      f'v4 on {v4_summary.tree_text(results["meta"])}, medians over '
      f'{" to ".join(str(n) for n in placements)} placements; the bound is '
      'what no router could beat in this model):',
      '',
      '| | where | default | bound |',
      '|---|---|---|---|',
  ] + rows + [
      '',
      f'Below {v4_summary.NEVER_SLOWER:.2f}x at {len(goals["below"])} of '
      f'{goals["points"]} points, at least 1.5x at '
      f'{sum(p[4]["default"]["ratio"] >= 1.5 for p in ranked)}. The median '
      'by decoded tokens per request: ' + ', '.join(
          f'{d_key[1:]}: {statistics.median(ratios):.2f}x'
          for d_key, ratios in sorted(
              by_decode.items(), key=lambda item: int(item[0][1:]))) +
      '; by regime, so the overall median follows how many points the grid '
      'holds of each (points, median): ' + ', '.join(
          f'{r_key} ({len(ratios)}, {statistics.median(ratios):.2f}x)'
          for r_key, ratios in sorted(
              by_regime.items(),
              key=lambda item: float(item[0][1:].replace('_', '.')))) +
      '. In streaming the baseline is 2.77.0\'s stateful path (the '
      'buffering the config turns on); against its stateless path, which the '
      'vLLM handlers use unless given `max_batch_duration_secs`, the default '
      f'is below {v4_summary.NEVER_SLOWER:.2f}x at {len(stateless)} of '
      f'{goals["streaming_points"]} streaming points' +
      (f' (worst {worst_stateless["ratio"]:.2f}x)' if worst_stateless else '') +
      '.' + losses.serial(goals) +
      ' Batch jobs read their input in arrival order here; on input sorted '
      'by prefix, whose splits already batch a prefix together, the default '
      'loses up to R4. ' + _batch_placements(section) +
      ' Every point runs at one load, the one the policy was tuned at. The '
      'runner pays for the keyed steps: on the '
      'FnApiRunner, batching alone (no model) over 10,000 and 30,000 keys '
      f'takes {_overhead_ratio(results, "default_10000_over_stateful", "x")} and '
      f'{_overhead_ratio(results, "default_30000_over_stateful", "x")} the time '
      'of 2.77.0\'s stateful path (phase C: medians, with the 10th-90th '
      'percentile of their repetitions). Every point, and why: '
      '[docs/benchmark.md](docs/benchmark.md).',
  ])


def _batch_placements(section) -> str:
  """What the batch points say of the two ways a batch runner places keys,
  as sentences."""
  if 'batch_hash' not in section:
    # Results from before batch_hash: research runs measured it.
    return (
        'Batch runners are modelled cutting key ranges by work, as Dataflow '
        'rebalances them; on a runner that hashes keys onto workers (Flink, '
        'Spark), research runs have the default gain less at every batch '
        'point and lose to 2.77.0 at many, most on many workers.')
  counts = {}
  for dep in ('batch', 'batch_hash'):
    ratios = [
        p[4]['default']['ratio'] for p in v4_summary.points(section)
        if p[0] == dep
    ]
    below = sum(r < v4_summary.NEVER_SLOWER for r in ratios)
    counts[dep] = (
        f'{below} of {len(ratios)} points (median '
        f'{statistics.median(ratios):.2f}x, worst {min(ratios):.2f}x)')
  return (
      'Batch is scored under two placements of the same batches, both '
      'counted above: where the runner cuts key ranges by work, as Dataflow '
      'rebalances them (batch), the default is below '
      f'{v4_summary.NEVER_SLOWER:.2f}x at {counts["batch"]}; where it hashes '
      'keys onto workers and does not rebalance them, as Flink and Spark do '
      f'(batch_hash), at {counts["batch_hash"]}.')


def _overhead_ratio(results, name, unit=''):
  """A phase C ratio's median and the 10th-90th percentile of its
  repetitions, each followed by unit."""
  ratio = results['overhead_runs']['ratios'][name]
  return (
      f'{results["overhead"][name]:.2f}{unit} '
      f'({ratio["p10"]:.2f}{unit}-{ratio["p90"]:.2f}{unit})')


def _overhead_intro(results):
  runs = results['overhead_runs']
  reps = sorted({len(r['measured']) for r in runs['runs'].values()})
  return (
      'phase C: `BatchElements` on the FnApiRunner, pristine 2.77.0 and the '
      'patched tree taking turns, medians of '
      f'{" or ".join(str(r) for r in reps)} repetitions with their '
      '10th-90th percentile, each a run time over that of 2.77.0\'s '
      'stateful path on the same elements in the same repetition, so above '
      '1 is slower')


def readme_overhead(results) -> str:
  if 'overhead' not in results:
    return 'Phase C was not part of this run.'
  runs = results['overhead_runs']
  times = '; '.join(
      f'{name.replace("_", " ")} {_overhead_ratio(results, name)}'
      for name in runs['ratios'])
  return (
      f'Runner cost ({_overhead_intro(results)}; `default` is '
      f'`{runs["default_num_shards"]}`): {times}.')


def _method(results):
  v = results['v4']['meta']
  e = v['engine_model']
  return (
      'Method: the figures come from a fleet simulator (this patch set\'s '
      '`bench` package, `tox -e bench`, benchmark v4) whose streaming '
      'batches equal those of the real transforms on the streaming '
      'DirectRunner, batch for batch, and whose batch deployment forms the '
      'FnApiRunner\'s batches on a small case. Deployments: streaming_F3 '
      f'(key ranges re-cut every {v["range_recut_secs"]:g} s on past work), '
      'streaming_F2 (static hash), each '
      'against 2.77.0\'s stateful path placed the same way; ' + (
          'batch (key ranges cut by work) and batch_hash (keys hashed onto '
          'workers), ' if 'batch_hash' in results['v4'] else 'batch, ') +
      'against 2.77.0\'s stateless path, which the vLLM handlers use by '
      'default. '
      'R = S / C is the distinct shareable prefix tokens over one worker\'s '
      f'cache of {v["cache_tokens"]} tokens; W0 shares nothing, W1 and W2 '
      'are flat prefixes, W3 chat-shaped, W4 long documents with questions; '
      'D is the decoded tokens per request. Assumed GPU-like worker: '
      f'{e["batch_tokens"]} token equivalents per batch, '
      f'{e["request_tokens"]} per further request, '
      f'{e["decode_token_tokens"]} per decoded token, '
      f'{e["shuffle_tokens"]} per element per shuffle, at most threads x '
      'processes x batch size requests in flight (and, where each state '
      'key\'s batches run one at a time, at most a batch over the busiest '
      'state key\'s share of a worker\'s requests), throughput n / (n + '
      f'half) with half {e["prefill_half"]} (prefill) and '
      f'{e["decode_half"]} (decode).')


SCRIPT = Path(__file__).resolve().parent / 'reviewer_check.py'


def _check_script(intro):
  return '\n'.join([
      intro,
      '',
      '<details><summary>bench_prefix_batching.py</summary>',
      '',
      '```python',
      SCRIPT.read_text().rstrip('\n'),
      '```',
      '',
      '</details>',
  ])


def pr_prefix_batching_learning(results) -> str:
  if 'learning' not in results:
    return 'Phase E was not part of this run.'
  summary, runs = results['learning'], results['learning_runs']
  model = runs['model']
  cells = '; '.join(
      f'{keys} keys: {v["per_key_model_secs_per_element"]:.3f} s against '
      f'{v["per_step_model_secs_per_element"]:.3f} s '
      f'({v["per_step_speedup"]:.2f}x), mean batch '
      f'{v["per_key_mean_batch_size"]:.2f} against '
      f'{v["per_step_mean_batch_size"]:.2f}' for keys, v in summary.items())
  return (
      'Measured by phase E of this patch set\'s benchmark, which drives each '
      'design\'s real batching DoFn with state that encodes what is written '
      '(as a distributed runner\'s does), timers firing in processing-time '
      'order, and a model that serves each batch inside the DoFn\'s yield, '
      f'so that the batch is timed with it: arrivals at {runs["rate"]} '
      f'requests/s, Zipf exponent {runs["zipf_s"]} over the keys, '
      f'{runs["elements_per_key"]} requests per key on average, a model '
      f'taking {model["batch_secs"]} s per batch plus '
      f'{model["element_secs"]} s per request ({model["cached_element_secs"]} '
      f's when it served the prefix among its last {model["cached_keys"]}). '
      'Model seconds per request, per-key estimators against this change\'s '
      f'per-step one: {cells}.')


def pr_prefix_batching(results) -> str:
  section = results['v4']
  return '\n'.join([
      'Where 8 shards per prefix (this pull request\'s default) win and '
      'lose against each deployment\'s baseline (medians over '
      f'{section["meta"]["placements"]} placements, with the valid upper '
      'bound):',
      '',
  ] + _table(section, 'keyed_8') + [
      '',
      losses.sentence(results, 'keyed_8').replace(
          "It is below", "Eight shards are below", 1).replace(
              "its deployment's", "their deployment's", 1) +
      ' Prompts that share no prefix (W0) get batches of 1 with a prefix '
      'key function; eight shards per prefix split a cold prefix\'s '
      'batches eight ways and copy it into eight caches; the follow-up '
      'adaptive-num-shards sizes the shards by each prefix\'s measured '
      'traffic.',
      '',
      _method(results),
      '',
      _check_script(
          'To check the mechanism on a Beam checkout with this change '
          '(`pip install -e sdks/python`, nothing else), save this as '
          '`bench_prefix_batching.py` and run it (about 2 minutes): it feeds '
          'W1\'s traffic through `BatchElements` on the streaming '
          'DirectRunner, keyed by `WithBatchKey` with 8 shards and, for '
          'today\'s batching, by a key per SDK process, hashes the state keys '
          'onto 8 workers and replays each worker\'s batches through a cache '
          'of 8 prefixes. It prints hit rates and the throughput ratio of one '
          'placement at a smaller scale (1,200 requests), not the figures '
          'above.'),
  ])


def pr_adaptive_num_shards(results) -> str:
  section = results['v4']
  lines = [
      _run(results) + '. Throughput over the deployment\'s baseline, '
      'medians over placements, with the valid upper bound:',
      '',
  ] + _table(section) + [
      '',
      losses.sentence(results) + ' ' + _wins(results) + ' ' + _aa(results) +
      ' ' + _engine(results),
  ]
  if 'overhead' in results:
    lines += [
        '',
        f'What the measuring step costs the runner ({_overhead_intro(results)}'
        '): the default at 10,000 keys '
        f'{_overhead_ratio(results, "default_10000_over_stateful")} and at '
        '30,000 keys '
        f'{_overhead_ratio(results, "default_30000_over_stateful")}; one '
        'shard per key and no measuring step, '
        f'{_overhead_ratio(results, "keyed_10000_over_stateful")} and '
        f'{_overhead_ratio(results, "keyed_30000_over_stateful")}.',
    ]
  return '\n'.join(lines + ['', _method(results)])


RENDERERS = {
    'benchmark-decoding': losses.decoding,
    'readme-why': readme_why,
    'readme-what-it-buys': readme_what_it_buys,
    'readme-overhead': readme_overhead,
    'pr-prefix-batching': pr_prefix_batching,
    'pr-prefix-batching-learning': pr_prefix_batching_learning,
    'pr-adaptive-num-shards': pr_adaptive_num_shards,
}


def blocks_in(text: str) -> list:
  """(name, body start, body end) of every block, in order."""
  found = []
  for match in START.finditer(text):
    name = match.group(1)
    end = text.find(END.format(name), match.end())
    if end < 0:
      raise ValueError(f'block {name!r} has no end marker')
    found.append((name, match.end(), end))
  return found


def rewrite(text: str, results) -> str:
  """The text with every block re-rendered from the results."""
  out, last = [], 0
  for name, start, end in blocks_in(text):
    if name not in RENDERERS:
      raise ValueError(f'no renderer for block {name!r}')
    out += [text[last:start], RENDERERS[name](results), '\n']
    last = end
  return ''.join(out) + text[last:]


def stray_figures(text: str) -> list:
  """(line number, figure) of every benchmark figure outside the blocks."""
  outside = list(text)
  for _, start, end in blocks_in(text):
    outside[start:end] = ' ' * (end - start)
  masked = ''.join(outside)
  return [(masked.count('\n', 0, m.start()) + 1, m.group(0))
          for m in STRAY.finditer(masked)]


def check(paths, results) -> list:
  """What differs from the results: blocks that are not their rendering,
  unknown blocks, and figures written outside blocks."""
  problems = []
  for path in paths:
    text = path.read_text()
    try:
      if rewrite(text, results) != text:
        problems.append(
            f'{path}: a figure block differs from bench/results.json; run '
            '`python -m bench.blocks --write`')
    except ValueError as error:
      problems.append(f'{path}: {error}')
      continue
    for line, figure in stray_figures(text):
      problems.append(
          f'{path}:{line}: {figure!r} is a benchmark figure outside a '
          '<!-- bench:... --> block')
  return problems


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m bench.blocks',
      description='Check that the figure blocks of README.md, docs/*.md and '
      'the pull request descriptions are what bench/results.json gives, and '
      'that no benchmark figure stands outside a block.')
  parser.add_argument(
      '--write',
      action='store_true',
      help='rewrite the blocks from bench/results.json instead')
  args = parser.parse_args(argv)
  results = json.loads(RESULTS.read_text())
  if args.write:
    for path in files():
      text = path.read_text()
      new = rewrite(text, results)
      if new != text:
        path.write_text(new)
        print(f'bench.blocks: rewrote {path}')
    return 0
  problems = check(files(), results)
  for problem in problems:
    print(problem)
  return 1 if problems else 0


if __name__ == '__main__':
  sys.exit(main())
