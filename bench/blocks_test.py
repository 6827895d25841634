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

"""The gate on quoted figures: README.md, CHANGES.md, docs/*.md and the pull
request descriptions quote only figures generated from bench/results.json."""

import json
import statistics

import pytest

from bench import blocks
from bench.report_test import small_results


def doc(body, outside=''):
  return (
      f'# Title\n\n{outside}\n<!-- bench:readme-overhead -->\n{body}'
      '<!-- /bench:readme-overhead -->\nafter\n')


def test_the_repository_quotes_only_generated_figures():
  results = json.loads(blocks.RESULTS.read_text())
  problems = blocks.check(blocks.files(), results)
  assert not problems, '\n'.join(problems)


def test_the_docs_and_the_descriptions_are_checked(tmp_path):
  for name in ('docs/a.md', 'docs/b.md', 'patches/pull-requests/x.md'):
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text('')
  assert blocks.files(tmp_path) == [
      tmp_path / 'README.md',
      tmp_path / 'CHANGES.md',
      tmp_path / 'docs' / 'a.md',
      tmp_path / 'docs' / 'b.md',
      tmp_path / 'patches' / 'pull-requests' / 'x.md',
  ]


def test_a_block_is_rewritten_from_the_results():
  results = small_results()
  text = doc('hand-written 9.99x\n')
  new = blocks.rewrite(text, results)
  assert '9.99x' not in new
  assert blocks.rewrite(new, results) == new
  assert new.endswith('<!-- /bench:readme-overhead -->\nafter\n')


def test_a_block_that_differs_fails_the_check(tmp_path):
  results = small_results()
  path = tmp_path / 'README.md'
  path.write_text(blocks.rewrite(doc(''), results))
  assert blocks.check([path], results) == []
  path.write_text(path.read_text().replace('Phase C', 'Phase X'))
  assert 'differs' in blocks.check([path], results)[0]


def test_figures_outside_blocks_are_found():
  text = doc(
      'inside 2.50x is fine\n',
      outside='It runs 1.39x faster, hit rate 0.80, and 61% of the oracle.')
  found = [figure for _, figure in blocks.stray_figures(text)]
  assert found == ['1.39x', 'hit rate 0.80', '61% of the oracle']
  assert blocks.stray_figures('apache-beam 2.77.0, Python 3.11, 4 x 64') == []


def test_unknown_and_unclosed_blocks_are_errors(tmp_path):
  with pytest.raises(ValueError, match='no end marker'):
    blocks.blocks_in('<!-- bench:readme-overhead -->\nnever closed\n')
  path = tmp_path / 'x.md'
  path.write_text('<!-- bench:nothing -->\n<!-- /bench:nothing -->\n')
  assert 'no renderer' in blocks.check([path], small_results())[0]


def test_every_renderer_renders_the_v4_results():
  from bench.report_test import overhead_results
  results = {**small_results(), **overhead_results()}
  for name, render in blocks.RENDERERS.items():
    if name == 'pr-prefix-batching-learning':
      continue
    assert render(results).strip(), name


def test_the_readme_block_says_where_the_default_loses():
  results = small_results()
  text = blocks.readme_what_it_buys(results)
  goals = blocks.v4_summary.goals(results['v4'])
  if goals['below']:
    worst = goals['below'][0]
    assert f'({worst["ratio"]:.2f}x)' in text
    assert 'below 0.97x' in text
  else:
    assert 'at all' in text
  assert 'not slower in any frame' not in text


def _with_overhead(results):
  from bench.report_test import overhead_results
  return {**results, **overhead_results()}


# The worst point's label: against its own deployment's baseline, since the
# stateless one is given beside it.
WORST = "worst against its deployment's baseline"


def test_the_readme_why_block_shows_the_best_and_the_worst_point():
  results = _with_overhead(small_results())
  section = results['v4']

  def ranked():
    return sorted(
        blocks.v4_summary.points(section),
        key=lambda p: p[4]['default']['ratio'])

  def row(label, point):
    dep, workload, r_key, d_key, figures = point
    where = blocks._where(dep, workload, r_key, d_key)
    return (
        f'| {label} | {where} | {figures["default"]["ratio"]:.2f}x | '
        f'{figures["bound"]["ratio"]:.2f}x |')

  text = blocks.readme_why(results)
  assert row('best', ranked()[-1]) in text
  assert row(WORST, ranked()[0]) in text
  # Whichever point wins most is the one shown: none is named in advance.
  dep, workload, r_key, d_key, point = ranked()[0]
  point['default']['ratio'] = 99.0
  text = blocks.readme_why(results)
  assert ranked()[-1][4] is point
  assert row('best', ranked()[-1]) in text and '99.00x' in text
  assert row(WORST, ranked()[0]) in text


def test_the_readme_why_block_states_the_losses_beside_the_goals():
  # The stateless reference's count and the medians by decoding length
  # come from the results, as do the placements each point has, and the
  # runner's cost.
  results = _with_overhead(small_results())
  section = results['v4']
  goals = blocks.v4_summary.goals(section)
  text = blocks.readme_why(results)
  assert (
      f'at {len(goals["below_stateless"])} of {goals["streaming_points"]} '
      'streaming points') in text
  for d_key in {p[3] for p in blocks.v4_summary.points(section)}:
    ratios = [
        p[4]['default']['ratio'] for p in blocks.v4_summary.points(section)
        if p[3] == d_key
    ]
    assert f'{d_key[1:]}: {statistics.median(ratios):.2f}x' in text
  placements = sorted({
      p[4][blocks.v4_summary.POINT]['placements']
      for p in blocks.v4_summary.points(section)
  })
  assert f'medians over {" to ".join(map(str, placements))} placements' in text
  # A noisy run shows as one: with the spread of its repetitions.
  overhead = results['overhead']
  spread = results['overhead_runs']['ratios']

  def with_spread(name):
    return (
        f'{overhead[name]:.2f}x ({spread[name]["p10"]:.2f}x-'
        f'{spread[name]["p90"]:.2f}x)')

  assert (
      f'takes {with_spread("default_10000_over_stateful")} and '
      f'{with_spread("default_30000_over_stateful")} the time') in text


def test_main_refuses_an_unknown_argument(capsys):
  # A typo of --write must not run the check and pass silently.
  with pytest.raises(SystemExit) as exit_info:
    blocks.main(['--wrtie'])
  assert exit_info.value.code == 2
  assert '--wrtie' in capsys.readouterr().err


def test_the_wins_say_the_share_spread_evenly_once_a_run_has_it():
  results = small_results()
  goals = blocks.v4_summary.goals(results['v4'])
  text = blocks._wins(results)  # pylint: disable=protected-access
  assert (
      f'at {goals["shares_met"]} of {len(goals["shares"])} points, and at '
      f'{goals["shares_met_balanced"]} with every window') in text
  # Results from before the figure say nothing of it.
  for point in blocks.v4_summary.points(results['v4']):
    for row in point[4].values():
      row.pop('ratio_balanced', None)
  text = blocks._wins(results)  # pylint: disable=protected-access
  assert 'spread evenly' not in text and text.endswith(' points.')


def test_the_readme_why_block_counts_each_batch_placement_from_its_points():
  results = _with_overhead(small_results())
  section = results['v4']
  counts = {}
  for dep in ('batch', 'batch_hash'):
    ratios = [
        p[4]['default']['ratio'] for p in blocks.v4_summary.points(section)
        if p[0] == dep
    ]
    below = sum(r < blocks.v4_summary.NEVER_SLOWER for r in ratios)
    counts[dep] = (
        f'{below} of {len(ratios)} points (median '
        f'{statistics.median(ratios):.2f}x, worst {min(ratios):.2f}x)')
  assert counts['batch'] != counts['batch_hash']
  text = blocks.readme_why(results)
  assert f'(batch), the default is below 0.97x at {counts["batch"]};' in text
  assert f'(batch_hash), at {counts["batch_hash"]}.' in text
  # Results from before batch_hash keep the research runs' sentence.
  del section['batch_hash']
  assert 'research runs have the default gain less' in blocks.readme_why(
      results)
