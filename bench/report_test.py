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

"""Tests of the report: it is rendered from results.json alone."""

import json

from bench import overhead
from bench import overhead_test
from bench import report
from bench import streaming
from bench.workloads_test import SMALL


def small_results():
  builders = streaming.strategies(8, SMALL.batch_size)
  figures, sweep, runs = streaming.phase(
      [SMALL], (1, 2), (2, 4, 8), builders, (16, 2), (1, ), (1.1, ),
      progress=lambda _: None)
  workloads = {SMALL.name: SMALL.describe()}
  workloads[SMALL.name]['bound'] = figures[SMALL.name].pop('bound')
  return {
      'meta': {
          'command': 'tox -e bench',
          'skipped': ['validate', 'engine', 'overhead'],
          'started_utc': 'then',
          'duration_s': 12.0,
          'machine': 'here',
          'python': '3.11',
          'beam_tree_commit': 'abc123',
          'packages': {
              'apache-beam': '2.77.0'
          },
          'seeds': [1, 2],
          'rates_per_worker': [2, 4, 8],
          'middle_rate_per_worker': 4,
          'default_num_shards': '8',
          'adaptive': False,
          'batch_overhead_tokens': 16.0,
          'request_overhead_tokens': 2.0,
          'overhead_source': 'reference',
          'strategies': list(builders),
      },
      'workloads': workloads,
      'streaming': figures,
      'streaming_sweep': sweep,
      'streaming_runs': runs,
  }


def test_report_shows_the_results_figures():
  results = json.loads(json.dumps(small_results()))
  text = report.render(results)
  assert 'abc123' in text and 'validate, engine, overhead' in text
  row = results['streaming'][SMALL.name]['keyed_1']
  assert f'{row["hit_rate"]:.3f}' in text
  assert f'{row["throughput_vs_baseline"]:.2f}' in text
  bound = results['workloads'][SMALL.name]['bound']['hit_rate']
  assert f'{bound:.3f}' in text


def test_write_puts_results_and_report_side_by_side(tmp_path):
  results = small_results()
  report.write(results, tmp_path)
  written = json.loads((tmp_path / 'results.json').read_text())
  assert written['meta']['beam_tree_commit'] == 'abc123'
  assert (tmp_path / 'report.md').read_text() == report.render(written)


def overhead_results():
  plan = overhead.runs(quick=True)
  figures, runs = overhead.figures(
      plan, overhead_test.fake_measurements(plan, 3), 3, 8)
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
  text = '\n'.join(report._overhead(results))  # pylint: disable=protected-access
  assert 'pristine 2.77.0 (`build/base`)' in text
  assert '3 repetitions' in text
  for name, ratio in results['overhead_runs']['ratios'].items():
    row = next(
        line for line in text.splitlines() if line.startswith(f'| {name} |'))
    assert f'| {results["overhead"][name]:.2f} |' in row
    assert f'| {ratio["p10"]:.2f}-{ratio["p90"]:.2f} |' in row
    assert f'| {ratio["min"]:.2f}-{ratio["max"]:.2f} |' in row
    assert ', '.join(f'{r:.2f}' for r in ratio['per_repetition']) in row
  assert '| keyed_10000_mean_batch_over_64 | 0.25 |' in text
  default = next(
      line for line in text.splitlines() if line.startswith('| default |'))
  assert 'x the default 8 shards' in default and '| 512 |' in default
  assert '## D. Key cost' in text and '1.01' in text


def test_report_renders_with_the_overhead_section():
  results = json.loads(json.dumps({**small_results(), **overhead_results()}))
  results['meta']['skipped'] = ['validate', 'engine']
  assert '## C. Overhead' in report.render(results)
