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

"""Tests of phase A (v3): strategies in frames, placements and the sweep."""

import pytest

from bench import frames
from bench import policies
from bench import streaming
from bench.fleet_test import CountingShards
from bench.workloads_test import SMALL

COSTS = frames.Costs(16, 2, 0, 1.0)


def small_strategies():
  return streaming.strategies(
      policies.TwoStageSpec(), CountingShards(), {'buffering_s': 1.0})


def test_every_frame_places_the_baseline_like_the_others():
  chosen = small_strategies()
  out = streaming.run_seed(
      SMALL, 4, 1, frames.FRAMES, ('a', 'b'), COSTS, chosen)
  assert set(out) == {f.name for f in frames.FRAMES}
  for frame in frames.FRAMES:
    rows = out[frame.name]
    assert set(rows) == set(chosen)
    assert all(len(v) == 2 for v in rows.values())
  # F1's baseline: one key per worker, on its reader; F2's: a key per
  # process, hashed.
  assert out['F1']['baseline'][0]['state_keys'] == SMALL.workers
  assert out['F2']['baseline'][0]['state_keys'] > SMALL.workers
  # The P = 16 baseline has more keys; keyed batches do not change with P.
  assert (
      out['F2_P16']['baseline'][0]['state_keys']
      > out['F2']['baseline'][0]['state_keys'])
  assert out['F2_P16']['default'] == out['F2']['default']
  assert out['F1']['default'] == out['F2']['default']
  # The oracle places itself, the same in every frame.
  assert out['F3']['oracle'] == out['F2']['oracle']


def test_summary_takes_ratios_placement_by_placement():
  base = [{'busiest_worker_work': 10.0, **dict.fromkeys(streaming.FIELDS, 1)}]
  rows = [{
      'baseline': base * 2,
      'x': [{
          **base[0], 'busiest_worker_work': 5.0
      }, {
          **base[0], 'busiest_worker_work': 20.0
      }]
  },
          {
              'baseline': base * 2,
              'x': [{
                  **base[0], 'busiest_worker_work': 4.0
              }] * 2
          }]
  summary = streaming.summarize(rows, ['baseline', 'x'])
  assert summary['x']['ratios'] == [2.0, 0.5, 2.5, 2.5]
  assert summary['x']['throughput_vs_baseline'] == pytest.approx(2.25)
  assert summary['x']['throughput_min'] == 0.5
  assert summary['x']['throughput_max'] == 2.5
  assert summary['baseline']['throughput_vs_baseline'] == 1.0


def test_sweep_points_vary_one_thing_at_a_time():
  points = streaming.sweep_points(
      SMALL, (2, 4, 8), 4, (0.5, 2, 8), (0.6, 1.1), (0, 64))
  varied = [(p[0], p[1]) for p in points]
  assert varied == [('rate', 2), ('rate', 8), ('zipf_s', 0.6), ('cache', 0.5),
                    ('cache', 2), ('cache', 8), ('decode_tokens', 64)]
  cache = dict((p[1], p[2]) for p in points if p[0] == 'cache')
  assert cache[8].cache_prefixes == SMALL.cache_prefixes * 8
  assert all(p[3] == 4 for p in points if p[0] != 'rate')


def test_sweep_min_leaves_cache_x8_apart_and_says_where():
  row = {
      'throughput_vs_baseline': 1.5,
      'throughput_min': 1.0,
      'throughput_max': 2.0,
      'hit_rate': 0.5
  }
  tables = {frame: {'W1': {'default': row}} for frame in ('F2', 'F3')}

  def entry(varied, value, ratio):
    return {
        'workload': 'W1',
        'varied': varied,
        'value': value,
        'frames': {
            frame: {
                'default': {
                    **row, 'throughput_vs_baseline': ratio
                }
            }
            for frame in ('F2', 'F3')
        }
    }

  sweep = [entry('rate', 4, 1.2), entry('cache', 8, 0.5), entry('zipf_s', 1, 2)]
  sweep_min, cache_x8 = streaming.sweep_figures(
      sweep, tables, ['W1'], ['F2', 'F3'], ['baseline', 'default'])
  assert sweep_min['F2']['default']['throughput_vs_baseline'] == 1.2
  assert sweep_min['F2']['default']['at'] == {
      'workload': 'W1', 'varied': 'rate', 'value': 4
  }
  assert cache_x8['F3']['W1']['default']['throughput_vs_baseline'] == 0.5
  assert 'baseline' not in sweep_min['F2']


def test_phase_writes_the_v3_sections():
  out = streaming.phase([SMALL], (1, ), ('a', ), (2, 4, 8), (0.5, ), (1.1, ),
                        (0, 64),
                        small_strategies(),
                        COSTS,
                        progress=lambda _: None)
  assert set(out) == {'frames', 'sweep', 'sweep_min', 'cache_x8'}
  assert out['frames']['F2']['placements'] == 1
  row = out['frames']['F3'][SMALL.name]['default']
  for field in ('throughput_vs_baseline',
                'throughput_min',
                'throughput_max',
                'hit_rate',
                'load_max_over_mean',
                'mean_batch_size',
                'p99_delay_s'):
    assert field in row
  assert out['cache_x8']['F2'][SMALL.name]['default']
  decode = [e for e in out['sweep'] if e['varied'] == 'decode_tokens']
  assert decode[0]['decode_tokens'] == 64


def test_phase_gives_the_same_figures_in_forked_processes():
  args = ([SMALL], (1, 2), ('a', ), (2, 4, 8), (2, ), (1.1, ), (0, ),
          small_strategies(),
          COSTS)
  serial = streaming.phase(*args, progress=lambda _: None)
  forked = streaming.phase(*args, progress=lambda _: None, processes=2)
  assert serial == forked
