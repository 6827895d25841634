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

import functools
import json

from bench import overhead
from bench import overhead_test
from bench import report
from bench import streaming
from bench.streaming_test import COSTS
from bench.streaming_test import small_strategies
from bench.workloads_test import SMALL


@functools.cache
def _phase():
  chosen = small_strategies()
  smalls = [SMALL.scaled(name=name) for name in ('W1', 'W2', 'W3')]
  out = streaming.phase(
      smalls, (1, ), ('a', 'b'), (2, 4, 8), (0.5, ), (1.1, ), (0, 64),
      chosen,
      COSTS,
      progress=lambda _: None)
  return json.dumps({
      'phase': out,
      'labels': {
          n: s.label
          for n, s in chosen.items()
      },
      'workloads': {
          w.name: w.describe()
          for w in smalls
      }
  })


def small_results():
  made = json.loads(_phase())
  return {
      'meta': {
          'command': 'tox -e bench',
          'quick': False,
          'skipped': ['validate', 'engine', 'overhead'],
          'started_utc': 'then',
          'duration_s': 12.0,
          'machine': 'here',
          'python': '3.11',
          'beam_tree_commit': 'abc123def4567890',
          'packages': {
              'apache-beam': '2.77.0'
          },
          'seeds': [1],
          'salts': ['a', 'b'],
          'placements': 2,
          'rates_per_worker': [2, 4, 8],
          'middle_rate_per_worker': 4,
          'buffering_s': 1.0,
          'default_num_shards': 'TwoStageSpec()',
          'default_is_two_stage': True,
          'adaptive_num_shards': 'CountingShards',
          'threads_per_process': 12,
          'strategies': made['labels'],
          'costs_source': 'reference',
          'batch_overhead_tokens': 16.0,
          'request_overhead_tokens': 2.0,
          'decode_token_tokens': 1.0,
          'sweep': {
              'side_fraction': 1.0
          },
      },
      'workloads': made['workloads'],
      **made['phase'],
  }


def test_report_shows_the_results_figures():
  results = json.loads(json.dumps(small_results()))
  text = report.render(results)
  assert 'abc123def4567890' in text and 'validate, engine, overhead' in text
  row = results['frames']['F2']['W2']['keyed_8']
  assert (
      f'{row["throughput_vs_baseline"]:.2f} '
      f'({row["throughput_min"]:.2f}-{row["throughput_max"]:.2f})') in text
  assert f'{row["hit_rate"]:.3f} / {row["load_max_over_mean"]:.2f}' in text
  entry = results['sweep_min']['F3']['default']
  assert f'{entry["throughput_vs_baseline"]:.2f}' in text
  assert '| F3 | W1 | ' in text


def test_write_puts_results_and_report_side_by_side(tmp_path):
  results = small_results()
  report.write(results, tmp_path)
  written = json.loads((tmp_path / 'results.json').read_text())
  assert written['meta']['beam_tree_commit'] == 'abc123def4567890'
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
